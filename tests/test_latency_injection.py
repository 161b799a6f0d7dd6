"""The injected latency regression (tests/latency_injection.py) keeps the model's answers exactly, for
models of one input and of two (the BERT4Rec that benchmarks/gate_quality.py --gpu gates), and adds work."""

from __future__ import annotations

import time

import pytest
import torch

from pipelines.samples import bert4rec
from tests import latency_injection


def _seconds(module, *inputs) -> float:
    """The fastest of three calls: a busy machine only adds time, to either side."""
    module(*inputs)  # the first call profiles and optimises the graph
    timings = []
    for _ in range(3):
        started = time.perf_counter()
        module(*inputs)
        timings.append(time.perf_counter() - started)
    return min(timings)


def test_busy_work_on_a_two_input_model_answers_as_the_model_and_takes_longer():
    ids = torch.randint(1, bert4rec.DEMO.items, (3, bert4rec.DEMO.length))
    position = torch.full((3, 1), bert4rec.DEMO.length - 1)
    traced = torch.jit.trace(bert4rec.bert4rec_v1(), (ids, position))
    slow = latency_injection.with_busy_work(traced, 20_000)  # 20 ms a sample on an idle core
    for answer, expected in zip(slow(ids, position), traced(ids, position), strict=True):
        assert answer.dtype == expected.dtype and torch.equal(answer, expected)
    assert _seconds(slow, ids, position) > _seconds(traced, ids, position) + 0.03  # 60 ms added, at least half


def test_busy_work_refuses_a_model_of_three_inputs():
    class Three(torch.nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
            return a + b + c

    with pytest.raises(ValueError, match="one or two inputs, not 3"):
        latency_injection.with_busy_work(torch.jit.script(Three()), 100)


@pytest.mark.gpu
def test_busy_work_on_a_cuda_model_that_answers_on_the_host_answers_as_the_model():
    """The gate's GPU candidates: the compile step's CUDA TorchScript hands its outputs back on the host
    while the busy work runs on the input's device (the CPU sibling is the test above)."""
    from components.model.compile import GpuServing

    ids = torch.randint(1, bert4rec.DEMO.items, (3, bert4rec.DEMO.length), device="cuda")
    position = torch.full((3, 1), bert4rec.DEMO.length - 1, device="cuda")
    served = GpuServing(bert4rec.bert4rec_v1().cuda(), [torch.int64, torch.float32], half=False)
    traced = torch.jit.trace(served, (ids, position), check_trace=False)
    slow = latency_injection.with_busy_work(traced, 1_000)
    for answer, expected in zip(slow(ids, position), traced(ids, position), strict=True):
        assert answer.device.type == "cpu" and answer.dtype == expected.dtype and torch.equal(answer, expected)
