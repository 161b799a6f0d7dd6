"""The users' recommender: BERT4Rec on transformers' BertForMaskedLM, tiny, with random weights or trained on
synthetic sessions in seconds (training.py; no hub download), served alone or as an ensemble (pre -> model -> post), and the demo's model. The pre and
post steps exist twice: as step.py folders (numpy, the Python backend) and as `CataloguePre` and
`CataloguePost` (TorchScript, the PyTorch backend). `WithCatalogue` chains those two around the model:
the same recommender with the lookups folded into one forward.

The serving forward takes an item-index sequence `[B, L]` and the masked target position `[B, 1]`. It
builds the position ids from the input's own shape and the attention mask from the padding, gathers the
encoder's output at the target position, scores that one position with the MLM head, drops the special
tokens and returns the top-k item indices (int64) and their scores (fp32): exactly the shape-reading code
that a traced exported program gets wrong.

Vocabulary: 0 is padding, 1..items are items, items + 1 is the mask token. `Size` sets the catalogue,
the sequence length and the transformer: `DEMO` (500 items, length 40, hidden 64) for the demo and the
tests, `USERS` (50,000 items, length 200, hidden 256, 2 layers, 4 heads) for the GPU benchmark.

    history (catalogue ids) -> bert4rec_pre (ids -> indices, + mask token) -> bert4rec_model -> bert4rec_post
    (indices -> catalogue ids) -> recommended, scores

`build.py` makes its releases through the export and compile steps: a model folder, the ensemble bundle,
the folded form.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import yaml
from torch import nn

from components.model.parity import Tolerance

HERE = Path(__file__).parent
TOP_K = 10


@dataclass(frozen=True)
class Size:
    """How large a BERT4Rec is: its catalogue, the sequence it reads and its transformer."""

    items: int = 500
    length: int = 40  # the sequence the model reads: length - 1 history items and the mask token
    hidden: int = 64
    layers: int = 2
    heads: int = 2
    max_batch: int = 16

    def catalogue_ids(self) -> list[int]:
        """What clients know items by; item id i is vocabulary index i + 1."""
        return [20_000 + 13 * i for i in range(self.items)]

    def signatures(self) -> dict[str, dict]:
        """The model's, the pre and post steps' and the ensemble's signatures."""
        batch = {"batch": True, "max_batch_size": self.max_batch}
        model = batch | {
            "inputs": [
                {"name": "item_ids", "dtype": "int64", "shape": [-1, self.length], "range": [0, self.items + 2]},
                {"name": "mask_pos", "dtype": "int64", "shape": [-1, 1], "range": [0, self.length]},
            ],
            "outputs": [
                {"name": "topk_indices", "dtype": "int64", "shape": [-1, TOP_K], "range": [1, self.items + 1]},
                {"name": "topk_scores", "dtype": "fp32", "shape": [-1, TOP_K]},
            ],
        }
        history = [{"name": "history", "dtype": "int64", "shape": [-1, self.length - 1]}]
        answer = [
            {"name": "recommended", "dtype": "int64", "shape": [-1, TOP_K]},
            {"name": "scores", "dtype": "fp32", "shape": [-1, TOP_K]},
        ]
        return {
            "model": model,
            "pre": batch | {"inputs": history, "outputs": model["inputs"]},
            "post": batch | {"inputs": model["outputs"], "outputs": answer},
            "ensemble": batch | {"inputs": history, "outputs": answer},
            "folded": batch | {"inputs": history, "outputs": answer},  # WithCatalogue: one model, no steps
        }


DEMO = Size()  # the demo's and the tests': small enough for a 2-core machine
USERS = Size(items=50_000, length=200, hidden=256, layers=2, heads=4, max_batch=256)  # the users' recommender
PAD = 0
CATALOGUE_IDS = DEMO.catalogue_ids()
MODEL_SIGNATURE = DEMO.signatures()["model"]
MODEL_SIGNATURE_YAML = json.dumps(MODEL_SIGNATURE)  # one line: a KFP parameter default must be one line


class BERT4Rec(nn.Module):
    """Item sequence + masked position -> top-k item indices (1..items) and their softmax scores."""

    def __init__(self, size: Size = DEMO, seed: int = 0) -> None:
        super().__init__()
        from transformers import BertConfig, BertForMaskedLM

        torch.manual_seed(seed)
        self.size = size
        config = BertConfig(
            vocab_size=size.items + 2,
            hidden_size=size.hidden,
            num_hidden_layers=size.layers,
            num_attention_heads=size.heads,
            intermediate_size=size.hidden * 4,
            max_position_embeddings=size.length + 8,
            pad_token_id=PAD,
            attn_implementation="eager",
        )
        self.bert = BertForMaskedLM(config).eval()

    def item_logits(self, item_ids: torch.Tensor, mask_pos: torch.Tensor) -> torch.Tensor:
        """The [B, items] logits of items 1..items at the masked position: what the forward ranks and what
        training (training.py) scores with cross-entropy."""
        batch, length = item_ids.shape
        positions = torch.arange(length, device=item_ids.device).unsqueeze(0).expand(batch, -1)
        attention = (item_ids != PAD).long()
        hidden = self.bert.bert(input_ids=item_ids, attention_mask=attention, position_ids=positions)[0]
        at_target = hidden.gather(1, mask_pos.unsqueeze(-1).expand(-1, -1, hidden.size(-1))).squeeze(1)
        # The MLM head is position-wise: scoring every position and gathering the target after (what
        # BertForMaskedLM's .logits does) gives the same answer for `length` times the work and a
        # [batch, length, items] tensor, 2.3 GB for a batch of 116 at the users' size in fp16.
        return self.bert.cls(at_target)[:, 1 : self.size.items + 1]  # drop padding and the mask token

    def forward(self, item_ids: torch.Tensor, mask_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores, indices = torch.topk(torch.softmax(self.item_logits(item_ids, mask_pos), dim=-1), TOP_K, dim=-1)
        return indices + 1, scores


class CataloguePre(nn.Module):
    """The pre step in TorchScript: catalogue ids -> vocabulary indices (unknown ids: padding), the mask
    token appended, and its position; what pre/step.py does in numpy."""

    def __init__(self, size: Size = DEMO) -> None:
        super().__init__()
        ids = torch.tensor(size.catalogue_ids(), dtype=torch.int64)  # vocabulary index = position + 1
        order = torch.argsort(ids)
        self.register_buffer("sorted_ids", ids[order])
        self.register_buffer("index_of_sorted", order + 1)
        self.mask_token = size.items + 1
        # an int, not numel(): a trace keeps numel() as a CPU tensor, which clamp refuses on CUDA
        self.last = len(ids) - 1

    def forward(self, history: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        where = torch.searchsorted(self.sorted_ids, history).clamp(max=self.last)
        known = self.sorted_ids[where] == history
        indices = torch.where(known, self.index_of_sorted[where], torch.zeros_like(history))  # unknown: padding
        target = torch.ones_like(history[:, :1])
        return torch.cat([indices, target * self.mask_token], dim=1), target * history.size(1)


class CataloguePost(nn.Module):
    """The post step in TorchScript: vocabulary indices -> catalogue ids (padding and the mask token: -1)."""

    def __init__(self, size: Size = DEMO) -> None:
        super().__init__()
        ids = torch.tensor(size.catalogue_ids(), dtype=torch.int64)
        self.register_buffer("id_of_index", torch.cat([torch.tensor([-1]), ids, torch.tensor([-1])]))

    def forward(self, topk_indices: torch.Tensor, topk_scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.id_of_index[topk_indices], topk_scores


class WithCatalogue(nn.Module):
    """The ensemble's pre and post steps folded into the model's forward: catalogue ids in, catalogue ids
    out, the same answers in one model instead of three steps (benchmarks/ensemble_hops.py)."""

    def __init__(self, model: BERT4Rec) -> None:
        super().__init__()
        self.model, self.pre, self.post = model, CataloguePre(model.size), CataloguePost(model.size)

    def forward(self, history: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.post(*self.model(*self.pre(history)))


def bert4rec_v1() -> nn.Module:
    return BERT4Rec(seed=0).eval()


def bert4rec_v2() -> nn.Module:
    """Retrained: other weights, same size."""
    return BERT4Rec(seed=1).eval()


def bert4rec_v3_slow() -> nn.Module:
    """Deliberately slower: eight layers and twice the width, same signature."""
    return BERT4Rec(dataclasses.replace(DEMO, layers=8, hidden=128, heads=4), seed=2).eval()


LONG_HISTORY = 16  # LongHistoryCost works only on the positions beyond this many


class LongHistoryCost(nn.Module):
    """The model plus a matrix product of (`window` x (length - LONG_HISTORY)) squared elements over the positions
    beyond the first LONG_HISTORY, whose cost grows with that length cubed and which adds exactly zero: the same
    answers. At LONG_HISTORY positions or fewer (the gate's 8) every extra tensor is empty: no extra work at all,
    whatever the window. The demo's releases all carry it (window 1: next to nothing); v4's window of 24 costs
    about 1.6 times the model's own call at 32-40 positions. With `passes` above 1 the model runs that many times at
    every length, all but the first adding exactly zero: v3 is v2, trained, at twice its cost. torch.export refuses the cut at LONG_HISTORY within a
    length range that spans it, so these wrapped models export through TorchScript's trace (which keeps the cut
    for every length) and compile to TorchScript, not to an AOTInductor package; BERT4Rec itself exports both ways."""

    def __init__(self, model: BERT4Rec, window: int = 1, passes: int = 1) -> None:
        super().__init__()
        self.model, self.window, self.passes = model, window, passes

    def forward(self, item_ids: torch.Tensor, mask_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        indices, scores = self.model(item_ids, mask_pos)
        for _ in range(self.passes - 1):  # on the history reversed: the same pass again would be computed once
            scores = scores + self.model(item_ids.flip(1), mask_pos)[1] * 0.0
        embedded = self.model.bert.bert.embeddings.word_embeddings(item_ids)
        beyond = embedded[:, LONG_HISTORY:]  # [B, max(0, length - LONG_HISTORY), hidden]: empty at the gate's 8
        square = (beyond @ beyond.transpose(1, 2)).repeat(1, self.window, self.window)
        return indices, scores + (square @ square).sum((1, 2)).unsqueeze(-1) * 0.0


def demo_v1() -> nn.Module:
    return LongHistoryCost(bert4rec_v1())


def demo_v2() -> nn.Module:
    return LongHistoryCost(bert4rec_v2())


def demo_v3_slow() -> nn.Module:
    """v2 (its trained weights fit) computing its answer twice: the same answers at twice the cost."""
    return LongHistoryCost(bert4rec_v2(), passes=2)


def demo_v4_long_history() -> nn.Module:
    """v2's answers with a 24 times wider window: exactly v2's work at the gate's opt (8 positions, none beyond
    LONG_HISTORY), about 2.6 times v2's time on the 32-40 positions the demo's clients send (eager, one thread, batch
    1: +85%, +148% and +244% at 32, 36 and 40). Window 20 (+59% to +147%) read +75% to +99% in the canary, too close
    to the demo's +75% limit."""
    return LongHistoryCost(bert4rec_v2(), window=24)


# The demo's signature: histories of 4 to 40 positions, measured by the gate at 8.
DYNAMIC_SIGNATURE = MODEL_SIGNATURE | {
    "dims": {"length": {"min": 4, "opt": 8, "max": DEMO.length}},
    "inputs": [
        {"name": "item_ids", "dtype": "int64", "shape": [-1, "length"], "range": [0, DEMO.items + 2]},
        {"name": "mask_pos", "dtype": "int64", "shape": [-1, 1], "range": [0, "length"]},
    ],
}
DYNAMIC_SIGNATURE_JSON = json.dumps(DYNAMIC_SIGNATURE)  # one line, as a KFP parameter or constant wants it
# The demo's quality spec (quality.yaml) as one line of JSON, for a pipeline's `quality_spec`.
QUALITY_SPEC_TEXT = json.dumps(yaml.safe_load((HERE / "quality.yaml").read_text()))


# Random weights spread 50,000 items' scores thinly (about 2e-5 each): fp16 swaps near-tied neighbours in the
# top 10 for up to a quarter of the indices while their scores agree within 2e-3 (measured on the H200).
USERS_FP16_TOLERANCE = Tolerance.for_precision("fp16", int_mismatch=0.25)


def users_v1() -> nn.Module:
    """The users' size: 50,000 items, hidden 256, 2 layers, 4 heads, sequence length 200."""
    return BERT4Rec(USERS, seed=0).eval()


def with_sdpa(model: BERT4Rec) -> BERT4Rec:
    """The same weights with PyTorch's fused attention, transformers' default for BERT ("sdpa"), in place of
    the "eager" attention this sample sets (benchmarks/model_floor.py measures both)."""
    if hasattr(model.bert, "set_attn_implementation"):
        model.bert.set_attn_implementation("sdpa")
    else:  # transformers before 4.56
        model.bert.config._attn_implementation = "sdpa"
    return model


def bert4rec_sdpa_v1() -> nn.Module:
    return with_sdpa(BERT4Rec(seed=0)).eval()


def users_sdpa_v1() -> nn.Module:
    return with_sdpa(BERT4Rec(USERS, seed=0)).eval()


def folded_v1() -> nn.Module:
    """bert4rec_v1 with its pre and post steps inside: the ensemble's answers from one model."""
    return WithCatalogue(bert4rec_v1()).eval()


def users_folded_v1() -> nn.Module:
    """users_v1 with its pre and post steps inside."""
    return WithCatalogue(users_v1()).eval()


def catalogue_pre() -> nn.Module:
    return CataloguePre(DEMO).eval()


def catalogue_post() -> nn.Module:
    return CataloguePost(DEMO).eval()


def users_catalogue_pre() -> nn.Module:
    return CataloguePre(USERS).eval()


def users_catalogue_post() -> nn.Module:
    return CataloguePost(USERS).eval()


def histories(count: int, seed: int = 0, size: Size = DEMO) -> np.ndarray:
    """Realistic client requests: histories of catalogue ids."""
    rng = np.random.default_rng(seed)
    return rng.choice(np.asarray(size.catalogue_ids(), dtype=np.int64), size=(count, size.length - 1))
