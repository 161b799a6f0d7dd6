"""Real PyTorch models built in the tests, with their signatures."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from components import model_folder
from components.signature import Signature


class MLP(nn.Module):
    def __init__(self, features: int = 16, outputs: int = 4, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.net = nn.Sequential(nn.Linear(features, 32), nn.ReLU(), nn.Linear(32, outputs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


MLP_SIGNATURE = {
    "batch": True,
    "max_batch_size": 8,
    "inputs": [{"name": "x", "dtype": "fp32", "shape": [-1, 16]}],
    "outputs": [{"name": "y", "dtype": "fp32", "shape": [-1, 4]}],
}


def mlp_folder(tmp_path: Path, name: str = "mlp", seed: int = 0) -> Path:
    """A Triton model folder (python flavour) of a traced MLP, with golden samples."""
    signature = Signature.from_dict(MLP_SIGNATURE)
    model = MLP(seed=seed).eval()
    golden_in = signature.example_inputs(8)
    with torch.inference_mode():
        golden_out = {"y": model(torch.from_numpy(golden_in["x"])).numpy()}
    torch.jit.trace(model, torch.from_numpy(golden_in["x"])).save(tmp_path / f"{name}.pt")
    return model_folder.write(
        tmp_path / name, name, signature, tmp_path / f"{name}.pt", "python", golden_in, golden_out, {"test": True}
    )


def upload_folder(client, bucket: str, folder: Path, prefix: str) -> None:
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(folder)}")
