"""Postprocessing of the recommender ensemble: the model's top-k embedding indices -> catalogue item ids."""

import json
import os

import numpy as np


def load(directory):
    with open(os.path.join(directory, "item_index.json")) as fh:
        item_ids = json.load(fh)["item_ids"]
    return np.asarray([*item_ids, -1], dtype=np.int64)  # the mask token is no item: -1


def process(id_of_index, inputs):
    return {"recommended": id_of_index[inputs["topk_indices"]], "scores": inputs["topk_scores"]}
