"""The case that started the project, as a release bundle: a recommender served as a Triton ensemble.

Clients send a history of 39 catalogue item ids and get 10 recommended item ids with scores:

    history (catalogue ids) -> recsys_pre (ids -> indices, + mask token) -> recsys_model (top-10 indices,
    scores) -> recsys_post (indices -> catalogue ids) -> recommended, scores

pre/step.py and post/step.py are the processing code Triton runs and that computes the reference.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import nn

from components.model.compile import compile_model
from components.model.ensemble import Step, assemble
from components.model.export import export
from components.model.signature import Signature

HERE = Path(__file__).parent
ITEMS = 999  # catalogue size; embedding index ITEMS is the mask token
HISTORY = 39
CATALOGUE_IDS = [10_000 + 7 * i for i in range(ITEMS)]  # what clients know items by

MODEL_SIGNATURE = {
    "batch": True,
    "max_batch_size": 32,
    "inputs": [
        {"name": "item_ids", "dtype": "int64", "shape": [-1, HISTORY + 1], "range": [0, ITEMS + 1]},
        {"name": "mask_pos", "dtype": "int64", "shape": [-1, 1], "range": [0, HISTORY + 1]},
    ],
    "outputs": [
        {"name": "topk_indices", "dtype": "int64", "shape": [-1, 10]},
        {"name": "topk_scores", "dtype": "fp32", "shape": [-1, 10]},
    ],
}
PRE_SIGNATURE = {
    "batch": True,
    "max_batch_size": 32,
    "inputs": [{"name": "history", "dtype": "int64", "shape": [-1, HISTORY]}],
    "outputs": MODEL_SIGNATURE["inputs"],
}
POST_SIGNATURE = {
    "batch": True,
    "max_batch_size": 32,
    "inputs": MODEL_SIGNATURE["outputs"],
    "outputs": [
        {"name": "recommended", "dtype": "int64", "shape": [-1, 10]},
        {"name": "scores", "dtype": "fp32", "shape": [-1, 10]},
    ],
}
ENSEMBLE_SIGNATURE = {
    "batch": True,
    "max_batch_size": 32,
    "inputs": PRE_SIGNATURE["inputs"],
    "outputs": POST_SIGNATURE["outputs"],
}


class Recommender(nn.Module):
    """Item-index history + the masked position -> top-10 item indices and their scores."""

    def __init__(self, items: int = ITEMS + 1, dim: int = 32, k: int = 10, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.k = k
        self.item_embedding = nn.Embedding(items, dim)
        self.position_embedding = nn.Embedding(HISTORY + 2, dim)
        self.mix = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, dim))
        self.out = nn.Linear(dim, items)

    def forward(self, item_ids: torch.Tensor, mask_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        history = self.item_embedding(item_ids).mean(dim=1)
        query = self.mix(history + self.position_embedding(mask_pos[:, 0]))
        scores, indices = torch.topk(torch.softmax(self.out(query), dim=-1), self.k, dim=-1)
        return indices, scores


def recommender_v1() -> nn.Module:
    return Recommender(seed=0).eval()


def recommender_v2() -> nn.Module:
    return Recommender(seed=1).eval()


def histories(count: int, seed: int = 0) -> np.ndarray:
    """Realistic client requests: histories of catalogue ids."""
    rng = np.random.default_rng(seed)
    return rng.choice(np.asarray(CATALOGUE_IDS, dtype=np.int64), size=(count, HISTORY))


def _step(name: str, source: Path, signature: dict, where: Path) -> Step:
    directory = where / name
    shutil.copytree(source, directory, ignore=shutil.ignore_patterns("__pycache__"))
    (directory / "item_index.json").write_text(json.dumps({"item_ids": CATALOGUE_IDS}))
    return Step(name, directory, Signature.from_dict(signature))


def build_bundle(out: Path, factory: str = "recommender_v1", name: str = "recsys", wrong_id_map: bool = False) -> Path:
    """Export and compile the recommender (TorchScript for Triton's PyTorch backend), then
    assemble the release bundle. `wrong_id_map` ships a postprocessing table that disagrees with the one
    the reference was computed with (a packaging mistake the accuracy check must catch)."""
    with tempfile.TemporaryDirectory(prefix="tritonship-recsys-") as tmp:
        work = Path(tmp)
        (work / "signature.json").write_text(json.dumps(MODEL_SIGNATURE))
        export(f"pipelines.samples.recsys:{factory}", work / "signature.json", work / "export")
        compile_model(work / "export", work / f"{name}_model", f"{name}_model")
        pre = _step(f"{name}_pre", HERE / "pre", PRE_SIGNATURE, work)
        post = _step(f"{name}_post", HERE / "post", POST_SIGNATURE, work)
        eager = globals()[factory]()
        assemble(
            out,
            name,
            Signature.from_dict(ENSEMBLE_SIGNATURE),
            work / f"{name}_model",
            pre,
            post,
            eager,
            {"history": histories(16)},
        )
    if wrong_id_map:
        shuffled = list(np.random.default_rng(7).permutation(CATALOGUE_IDS).tolist())
        (out / f"{name}_post" / "1" / "item_index.json").write_text(json.dumps({"item_ids": shuffled}))
    return out
