"""Preprocessing of the BERT4Rec ensemble: catalogue item ids -> vocabulary indices (1..items; unknown
ids become padding), then the mask token appended where the model predicts the next item."""

import json
import os

import numpy as np


def load(directory):
    with open(os.path.join(directory, "item_index.json")) as fh:
        item_ids = np.asarray(json.load(fh)["item_ids"], dtype=np.int64)  # position + 1 = vocabulary index
    order = np.argsort(item_ids)
    return {"sorted_ids": item_ids[order], "index_of_sorted": order + 1, "mask_token": len(item_ids) + 1}


def process(state, inputs):
    history = inputs["history"]
    where = np.clip(np.searchsorted(state["sorted_ids"], history), 0, len(state["sorted_ids"]) - 1)
    known = state["sorted_ids"][where] == history
    indices = np.where(known, state["index_of_sorted"][where], 0)  # unknown ids: padding
    mask = np.full((history.shape[0], 1), state["mask_token"], dtype=np.int64)
    return {
        "item_ids": np.concatenate([indices, mask], axis=1).astype(np.int64),
        "mask_pos": np.full((history.shape[0], 1), history.shape[1], dtype=np.int64),
    }
