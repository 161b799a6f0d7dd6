"""A latency regression of a known size, inside the TorchScript (Triton's PyTorch backend runs no Python).

`with_busy_work(model, delay_us)` wraps a TorchScript module in a scripted loop of tiny dependent
operations that takes about `delay_us` per sample on an idle core, sized by `iteration_us()`: this
process's own measurement of one loop iteration. The loop's value is exactly zero, so the answers are
the model's. On a busy machine the work takes longer, as a slower model's would.
"""

from __future__ import annotations

import functools
import statistics
import time

import torch
from torch import nn

CALIBRATION_ITERATIONS = 20_000


class BusyWork(nn.Module):
    def __init__(self, model: nn.Module, iterations_per_sample: int) -> None:
        super().__init__()
        self.model = model
        self.iterations_per_sample = iterations_per_sample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x) + self.busy(x)

    def busy(self, x: torch.Tensor) -> torch.Tensor:
        """Exactly zero, after `iterations_per_sample` dependent operations per sample of `x`."""
        acc = x.sum() * 0.0  # depends on the input, so no constant folding removes the loop
        for _ in range(self.iterations_per_sample * x.size(0)):
            acc = torch.sin(acc)
        return acc


class PairBusyWork(BusyWork):
    """The same for a model of two inputs and two outputs (the BERT4Rec's item ids and target position)."""

    def forward(self, x: torch.Tensor, position: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y, z = self.model(x, position)
        acc = self.busy(x)  # on the input's device; a CUDA model's outputs may come back on the host
        return y + acc.to(device=y.device, dtype=y.dtype), z + acc.to(device=z.device, dtype=z.dtype)


@functools.cache
def iteration_us() -> float:
    """Microseconds one loop iteration takes here with one thread (the median of three timings)."""
    loop = torch.jit.script(BusyWork(nn.Identity(), CALIBRATION_ITERATIONS))
    x = torch.zeros(1, 1)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        loop(x)  # the first call profiles and optimises the graph
        timings = []
        for _ in range(3):
            started = time.perf_counter()
            loop(x)
            timings.append(time.perf_counter() - started)
    finally:
        torch.set_num_threads(before)
    return statistics.median(timings) / CALIBRATION_ITERATIONS * 1e6


def with_busy_work(model: nn.Module, delay_us: float, per_iteration_us: float | None = None) -> torch.jit.ScriptModule:
    """`model` (a TorchScript or scriptable module) plus about `delay_us` of work per sample, at
    `per_iteration_us` per loop iteration (default: this process's iteration_us(); a server under load
    may take longer, which benchmarks/gate_quality.py measures)."""
    iterations = max(1, round(delay_us / (per_iteration_us or iteration_us())))
    inputs = len(model.forward.schema.arguments) - 1 if isinstance(model, torch.jit.ScriptModule) else 1
    if inputs not in (1, 2):
        raise ValueError(f"busy work wraps models of one or two inputs, not {inputs}")
    return torch.jit.script((BusyWork if inputs == 1 else PairBusyWork)(model, iterations))
