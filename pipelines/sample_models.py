"""The sample model of the demo and the local pipeline runs: a small recommender-style scorer, in three
releases. v2 is retrained (other weights, same size); v3 is deliberately slower (a much wider network
with the same signature), so that the gate has a real regression to catch."""

from __future__ import annotations

import torch
from torch import nn

SAMPLE_SIGNATURE = """batch: true
max_batch_size: 16
inputs:
  - {name: features, dtype: fp32, shape: [-1, 32]}
outputs:
  - {name: scores, dtype: fp32, shape: [-1, 8]}
"""


def _mlp(hidden: int, layers: int, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    blocks: list[nn.Module] = [nn.Linear(32, hidden), nn.ReLU()]
    for _ in range(layers - 1):
        blocks += [nn.Linear(hidden, hidden), nn.ReLU()]
    return nn.Sequential(*blocks, nn.Linear(hidden, 8)).eval()


def sample_v1() -> nn.Module:
    return _mlp(hidden=64, layers=1, seed=0)


def sample_v2() -> nn.Module:
    return _mlp(hidden=64, layers=1, seed=1)


def sample_v3_slow() -> nn.Module:
    return _mlp(hidden=1024, layers=4, seed=2)
