"""Postprocessing of the BERT4Rec ensemble: the model's top-k vocabulary indices -> catalogue item ids."""

import json
import os

import numpy as np


def load(directory):
    with open(os.path.join(directory, "item_index.json")) as fh:
        item_ids = json.load(fh)["item_ids"]
    return np.asarray([-1, *item_ids, -1], dtype=np.int64)  # padding and the mask token are no item: -1


def process(id_of_index, inputs):
    return {"recommended": id_of_index[inputs["topk_indices"]], "scores": inputs["topk_scores"]}
