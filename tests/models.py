"""Real PyTorch models built in the tests, with their signatures."""

from __future__ import annotations

import uuid
from pathlib import Path

import torch
import yaml
from torch import nn

from components.model import model_folder
from components.model.signature import Signature
from pipelines.samples import bert4rec, recsys
from pipelines.samples.recsys import Recommender
from tests import latency_injection


class MLP(nn.Module):
    def __init__(self, features: int = 16, outputs: int = 4, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.net = nn.Sequential(nn.Linear(features, 32), nn.ReLU(), nn.Linear(32, outputs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class SmallCNN(nn.Module):
    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(16, 10)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.features(image), 1))


class TwoHeads(nn.Module):
    """Two outputs of different dtypes: fp32 logits and an int32 class id."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.net = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.net(x)
        return logits, logits.argmax(dim=-1, keepdim=True).to(torch.int32)


class PaddedTransformer(nn.Module):
    """torch.nn.TransformerEncoder over token ids with a padding mask (token 0), mean-pooled."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(50, 16)
        layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(16, 4)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        padding = tokens == 0
        encoded = self.encoder(self.embed(tokens), src_key_padding_mask=padding)
        kept = (~padding).unsqueeze(-1).float()
        return self.head((encoded * kept).sum(1) / kept.sum(1).clamp(min=1.0))


class SizeReshape(nn.Module):
    """Reshapes with the batch size it reads: x.size(0), view(B, ...), expand(B, -1)."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.proj = nn.Linear(8, 8)
        self.bias = nn.Parameter(torch.randn(1, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch = x.size(0)
        parts = self.proj(x.view(batch, 4, 8))
        return (parts + self.bias.expand(batch, -1).unsqueeze(1)).reshape(batch, -1)


class DynamicLength(nn.Module):
    """A sequence of any length (the signature's -1 besides the batch): per-step features, then pooled."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.step = nn.Linear(6, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, sequence: torch.Tensor) -> torch.Tensor:
        steps = torch.relu(self.step(sequence))
        weights = torch.softmax(steps.sum(-1), dim=1).unsqueeze(-1)
        return self.head((steps * weights).sum(1))


def make_mlp() -> nn.Module:
    return MLP()


def make_cnn() -> nn.Module:
    return SmallCNN()


def make_recommender() -> nn.Module:
    return Recommender()


def make_two_heads() -> nn.Module:
    return TwoHeads()


CNN_SIGNATURE = {
    "batch": True,
    "max_batch_size": 16,
    "inputs": [{"name": "image", "dtype": "fp32", "shape": [-1, 3, 16, 16]}],
    "outputs": [{"name": "logits", "dtype": "fp32", "shape": [-1, 10]}],
}
RECOMMENDER_SIGNATURE = recsys.MODEL_SIGNATURE
TWO_HEADS_SIGNATURE = {
    "batch": True,
    "max_batch_size": 8,
    "inputs": [{"name": "x", "dtype": "fp32", "shape": [-1, 8]}],
    "outputs": [
        {"name": "logits", "dtype": "fp32", "shape": [-1, 5]},
        {"name": "label", "dtype": "int32", "shape": [-1, 1]},
    ],
}
MLP_SIGNATURE = {
    "batch": True,
    "max_batch_size": 8,
    "inputs": [{"name": "x", "dtype": "fp32", "shape": [-1, 16]}],
    "outputs": [{"name": "y", "dtype": "fp32", "shape": [-1, 4]}],
}


def mlp_folder(
    tmp_path: Path,
    name: str = "mlp",
    seed: int = 0,
    delay_us: float = 0,
    weights_seed: int | None = None,
    per_iteration_us: float | None = None,
) -> Path:
    """A Triton model folder (Triton's PyTorch backend) of a traced MLP, with golden samples of MLP(seed).

    The served weights come from `weights_seed` (default: `seed`): another seed is a model that answers
    wrong. `delay_us` adds busy work inside the TorchScript that takes about that long per sample on an idle
    core (latency_injection.py, at `per_iteration_us` per loop iteration if given): a candidate slower than
    stable by a known amount."""
    signature = Signature.from_dict(MLP_SIGNATURE)
    golden_in = signature.example_inputs(8)
    with torch.inference_mode():
        golden_out = {"y": MLP(seed=seed).eval()(torch.from_numpy(golden_in["x"])).numpy()}
    served = MLP(seed=seed if weights_seed is None else weights_seed).eval()
    traced = torch.jit.trace(served, torch.from_numpy(golden_in["x"]))
    module = latency_injection.with_busy_work(traced, delay_us, per_iteration_us) if delay_us else traced
    module.save(str(tmp_path / f"{name}.pt"))
    return model_folder.write(
        tmp_path / name, name, signature, tmp_path / f"{name}.pt", golden_in, golden_out, {"test": True}
    )


class TargetIndex(nn.Module):
    """Scores the item at a position the request names: `target_idx` must stay below the history's length."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(30, 8)
        self.head = nn.Linear(8, 4)

    def forward(self, items: torch.Tensor, target_idx: torch.Tensor) -> torch.Tensor:
        context = torch.cumsum(self.embed(items), dim=1)  # each position sees the history up to it
        picked = context.gather(1, target_idx.unsqueeze(-1).expand(-1, -1, context.size(-1))).squeeze(1)
        return self.head(picked)


def upload_folder(client, bucket: str, folder: Path, prefix: str) -> None:
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(folder)}")


PADDED_TRANSFORMER_SIGNATURE = {
    "batch": True,
    "max_batch_size": 8,
    "inputs": [{"name": "tokens", "dtype": "int64", "shape": [-1, 12], "range": [0, 50]}],
    "outputs": [{"name": "logits", "dtype": "fp32", "shape": [-1, 4]}],
}
SIZE_RESHAPE_SIGNATURE = {
    "batch": True,
    "max_batch_size": 8,
    "inputs": [{"name": "x", "dtype": "fp32", "shape": [-1, 32]}],
    "outputs": [{"name": "y", "dtype": "fp32", "shape": [-1, 32]}],
}
DYNAMIC_LENGTH_SIGNATURE = {
    "batch": True,
    "max_batch_size": 8,
    "inputs": [{"name": "sequence", "dtype": "fp32", "shape": [-1, -1, 6]}],
    "outputs": [{"name": "scores", "dtype": "fp32", "shape": [-1, 3]}],
}
# Dynamic dimensions with a declared range (the seed's min/opt/max): checked at each end and served.
BERT4REC_DYNAMIC_LENGTH_SIGNATURE = {
    "batch": True,
    "max_batch_size": bert4rec.DEMO.max_batch,
    "dims": {"length": {"min": 4, "opt": 20, "max": bert4rec.DEMO.length + 8}},  # up to its position embeddings
    "inputs": [
        {"name": "item_ids", "dtype": "int64", "shape": [-1, "length"], "range": [0, bert4rec.DEMO.items + 2]},
        {"name": "mask_pos", "dtype": "int64", "shape": [-1, 1], "range": [0, "length"]},
    ],
    "outputs": bert4rec.MODEL_SIGNATURE["outputs"],
}
PADDED_TRANSFORMER_DYNAMIC_SIGNATURE = {
    **PADDED_TRANSFORMER_SIGNATURE,
    "dims": {"tokens": {"min": 4, "opt": 12, "max": 40}},
    "inputs": [{"name": "tokens", "dtype": "int64", "shape": [-1, "tokens"], "range": [0, 50]}],
}
TARGET_INDEX_SIGNATURE = {
    "batch": True,
    "max_batch_size": 8,
    "dims": {"length": {"min": 3, "opt": 16, "max": 64}},
    "inputs": [
        {"name": "items", "dtype": "int64", "shape": [-1, "length"], "range": [1, 30]},
        {"name": "target_idx", "dtype": "int64", "shape": [-1, 1], "range": [0, "length"]},
    ],
    "outputs": [{"name": "scores", "dtype": "fp32", "shape": [-1, 4]}],
}
# The family every release must get through on the default path (export method "auto").
MODELS = {
    "mlp": ("tests.models:make_mlp", MLP_SIGNATURE),
    "cnn": ("tests.models:make_cnn", CNN_SIGNATURE),
    "recommender": ("tests.models:make_recommender", RECOMMENDER_SIGNATURE),
    "two_heads": ("tests.models:make_two_heads", TWO_HEADS_SIGNATURE),
    "bert4rec": ("pipelines.samples.bert4rec:bert4rec_v1", bert4rec.MODEL_SIGNATURE),
    "padded_transformer": ("tests.models:PaddedTransformer", PADDED_TRANSFORMER_SIGNATURE),
    "size_reshape": ("tests.models:SizeReshape", SIZE_RESHAPE_SIGNATURE),
    "dynamic_length": ("tests.models:DynamicLength", DYNAMIC_LENGTH_SIGNATURE),
    "bert4rec_dynamic_length": ("pipelines.samples.bert4rec:bert4rec_v1", BERT4REC_DYNAMIC_LENGTH_SIGNATURE),
    "padded_transformer_dynamic": ("tests.models:PaddedTransformer", PADDED_TRANSFORMER_DYNAMIC_SIGNATURE),
    "target_index": ("tests.models:TargetIndex", TARGET_INDEX_SIGNATURE),
}


def write_signature(path: Path, signature: dict) -> Path:
    path.write_text(yaml.safe_dump(signature, sort_keys=False))
    return path


# A sequence model whose lengths vary (8 at the opt, where the gate measures), for the canary's live mix.
SEQUENCE_SIGNATURE = {
    "batch": True,
    "max_batch_size": 8,
    "dims": {"length": {"min": 4, "opt": 8, "max": 128}},
    "inputs": [{"name": "tokens", "dtype": "int64", "shape": [-1, "length"], "range": [1, 50]}],
    "outputs": [{"name": "scores", "dtype": "fp32", "shape": [-1, 4]}],
}


class Sequence(nn.Module):
    """Token ids -> 4 scores; `cubic_work` (c) adds a matrix product whose cost grows with (c x length) cubed
    and adds exactly zero: the same answers, unnoticeable at the opt (8), several times the model's cost at 96."""

    def __init__(self, seed: int = 0, cubic_work: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(50, 16)
        self.head = nn.Linear(16, 4)
        self.cubic_work = cubic_work

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        embedded = self.embed(tokens)
        scores = self.head(embedded.mean(1))
        if self.cubic_work:  # a few operations whatever the length, one (cL x cL) matrix product
            a = (embedded @ embedded.transpose(1, 2)).repeat(1, self.cubic_work, self.cubic_work)
            scores = scores + (a @ a).sum((1, 2)).unsqueeze(-1) * 0.0
        return scores


class FailsWhenLong(nn.Module):
    """Answers like Sequence(seed) up to 64 tokens, and fails every longer request."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self.model = Sequence(seed)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.size(1) > 64:
            raise RuntimeError("sequences longer than 64 tokens are not supported")
        return self.model(tokens)


def sequence_folder(
    tmp_path: Path, name: str, seed: int = 0, cubic_work: int = 0, fails_when_long: bool = False
) -> Path:
    """A Triton model folder (Triton's PyTorch backend) of Sequence, golden samples at the opt length."""
    signature = Signature.from_dict(SEQUENCE_SIGNATURE)
    golden_in = signature.example_inputs(4)
    reference = Sequence(seed).eval()
    with torch.inference_mode():
        golden_out = {"scores": reference(torch.from_numpy(golden_in["tokens"])).numpy()}
    if fails_when_long:
        module = torch.jit.script(FailsWhenLong(seed).eval())
    else:
        module = torch.jit.trace(Sequence(seed, cubic_work).eval(), torch.from_numpy(golden_in["tokens"]))
    path = tmp_path / f"{name}-{uuid.uuid4().hex[:6]}.pt"  # the same model may be published twice
    module.save(str(path))
    return model_folder.write(tmp_path / path.stem, name, signature, path, golden_in, golden_out, {"test": True})
