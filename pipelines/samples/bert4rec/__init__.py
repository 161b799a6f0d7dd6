"""The users' recommender: BERT4Rec on transformers' BertForMaskedLM, tiny and with random weights (no
hub download), served alone or as an ensemble (pre -> model -> post), and the demo's model.

The serving forward takes an item-index sequence `[B, L]` and the masked target position `[B, 1]`. It
builds the position ids from the input's own shape and the attention mask from the padding, gathers the
logits at the target position, drops the special tokens and returns the top-k item indices (int64) and
their scores (fp32): exactly the shape-reading code that a traced exported program gets wrong.

Vocabulary: 0 is padding, 1..ITEMS are items, ITEMS + 1 is the mask token.

    history (catalogue ids) -> bert4rec_pre (ids -> indices, + mask token) -> bert4rec_model -> bert4rec_post
    (indices -> catalogue ids) -> recommended, scores
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import nn

HERE = Path(__file__).parent
ITEMS = 500
PAD, MASK = 0, ITEMS + 1
LENGTH = 40  # the sequence the model reads: 39 history items and the mask token
TOP_K = 10
MAX_BATCH = 16
CATALOGUE_IDS = [20_000 + 13 * i for i in range(ITEMS)]  # what clients know items by; index i + 1

MODEL_SIGNATURE = {
    "batch": True,
    "max_batch_size": MAX_BATCH,
    "inputs": [
        {"name": "item_ids", "dtype": "int64", "shape": [-1, LENGTH], "range": [0, ITEMS + 2]},
        {"name": "mask_pos", "dtype": "int64", "shape": [-1, 1], "range": [0, LENGTH]},
    ],
    "outputs": [
        {"name": "topk_indices", "dtype": "int64", "shape": [-1, TOP_K]},
        {"name": "topk_scores", "dtype": "fp32", "shape": [-1, TOP_K]},
    ],
}
MODEL_SIGNATURE_YAML = json.dumps(MODEL_SIGNATURE)  # one line: a KFP parameter default must be one line
PRE_SIGNATURE = {
    "batch": True,
    "max_batch_size": MAX_BATCH,
    "inputs": [{"name": "history", "dtype": "int64", "shape": [-1, LENGTH - 1]}],
    "outputs": MODEL_SIGNATURE["inputs"],
}
POST_SIGNATURE = {
    "batch": True,
    "max_batch_size": MAX_BATCH,
    "inputs": MODEL_SIGNATURE["outputs"],
    "outputs": [
        {"name": "recommended", "dtype": "int64", "shape": [-1, TOP_K]},
        {"name": "scores", "dtype": "fp32", "shape": [-1, TOP_K]},
    ],
}
ENSEMBLE_SIGNATURE = {"batch": True, "max_batch_size": MAX_BATCH, "inputs": PRE_SIGNATURE["inputs"],
                      "outputs": POST_SIGNATURE["outputs"]}  # fmt: skip


class BERT4Rec(nn.Module):
    """Item sequence + masked position -> top-k item indices (1..ITEMS) and their softmax scores."""

    def __init__(self, layers: int = 2, hidden: int = 64, heads: int = 2, seed: int = 0) -> None:
        super().__init__()
        from transformers import BertConfig, BertForMaskedLM

        torch.manual_seed(seed)
        config = BertConfig(
            vocab_size=ITEMS + 2, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
            intermediate_size=hidden * 4, max_position_embeddings=LENGTH + 8, pad_token_id=PAD,
            attn_implementation="eager",
        )  # fmt: skip
        self.bert = BertForMaskedLM(config).eval()

    def forward(self, item_ids: torch.Tensor, mask_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        batch, length = item_ids.shape
        positions = torch.arange(length, device=item_ids.device).unsqueeze(0).expand(batch, -1)
        attention = (item_ids != PAD).long()
        logits = self.bert(input_ids=item_ids, attention_mask=attention, position_ids=positions).logits
        at_target = logits.gather(1, mask_pos.unsqueeze(-1).expand(-1, -1, logits.size(-1))).squeeze(1)
        item_logits = at_target[:, 1 : ITEMS + 1]  # drop padding and the mask token
        scores, indices = torch.topk(torch.softmax(item_logits, dim=-1), TOP_K, dim=-1)
        return indices + 1, scores


def bert4rec_v1() -> nn.Module:
    return BERT4Rec(seed=0).eval()


def bert4rec_v2() -> nn.Module:
    """Retrained: other weights, same size."""
    return BERT4Rec(seed=1).eval()


def bert4rec_v3_slow() -> nn.Module:
    """Deliberately slower: eight layers and twice the width, same signature."""
    return BERT4Rec(layers=8, hidden=128, heads=4, seed=2).eval()


def histories(count: int, seed: int = 0) -> np.ndarray:
    """Realistic client requests: histories of catalogue ids."""
    rng = np.random.default_rng(seed)
    return rng.choice(np.asarray(CATALOGUE_IDS, dtype=np.int64), size=(count, LENGTH - 1))


def build_bundle(out: Path, factory: str = "bert4rec_v1", name: str = "bert4rec") -> Path:
    """Export (default method) and compile the model (TorchScript, python flavour for the embedded Triton),
    then assemble the release bundle with the pre- and postprocessing steps."""
    from components.compile import compile_model
    from components.ensemble import Step, assemble
    from components.export import export
    from components.signature import Signature

    with tempfile.TemporaryDirectory(prefix="tritonship-bert4rec-") as tmp:
        work = Path(tmp)
        (work / "signature.json").write_text(MODEL_SIGNATURE_YAML)
        export(f"pipelines.samples.bert4rec:{factory}", work / "signature.json", work / "export")
        compile_model(work / "export", work / f"{name}_model", f"{name}_model", flavour="python")
        steps = []
        for role, signature in (("pre", PRE_SIGNATURE), ("post", POST_SIGNATURE)):
            directory = work / f"{name}_{role}"
            shutil.copytree(HERE / role, directory, ignore=shutil.ignore_patterns("__pycache__"))
            (directory / "item_index.json").write_text(json.dumps({"item_ids": CATALOGUE_IDS}))
            steps.append(Step(f"{name}_{role}", directory, Signature.from_dict(signature)))
        assemble(out, name, Signature.from_dict(ENSEMBLE_SIGNATURE), work / f"{name}_model", *steps,
                 globals()[factory](), {"history": histories(16)})  # fmt: skip
    return out
