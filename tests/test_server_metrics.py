"""The gate server's own figures while it is measured, from its metrics endpoint (components/serving/server_metrics.py).
The embedded Triton is a CPU server started with GPU metrics off: it reports CPU utilisation and memory only,
which is what these tests can see; the GPU lines are read the same way on a GPU server."""

from __future__ import annotations

import json
import time
from pathlib import Path

from components.serving import server_metrics
from pipelines.processes import free_port
from tests.models import mlp_folder
from tests.release_helpers import ABSOLUTE_GATE, stage_and_gate, unique


def test_one_sample_reads_the_cpu_figures_and_no_gpu_from_a_cpu_triton(stack):
    deadline = time.monotonic() + 10  # a server just started reports zeros until its first metrics interval (2 s)
    sample = server_metrics.read(stack.gate.metrics_url)
    while sample and not sample["cpu_memory_bytes"] and time.monotonic() < deadline:
        time.sleep(0.5)
        sample = server_metrics.read(stack.gate.metrics_url)
    assert sample is not None and set(sample) == {"cpu_util", "cpu_memory_bytes"}
    assert 0 <= sample["cpu_util"] <= 1 and sample["cpu_memory_bytes"] > 2**20
    assert server_metrics.read(f"127.0.0.1:{free_port()}") is None  # no endpoint: no figures, no error


def test_the_gate_reports_the_servers_utilisation_while_it_measured(tmp_path, stack):
    name = unique("metrics")
    _version, _staged, verdict = stage_and_gate(stack, mlp_folder(tmp_path, name), ABSOLUTE_GATE, tmp_path / "gate")
    assert verdict.verdict == "pass", verdict.reasons
    assert verdict.server["samples"] >= 2 and 0 < verdict.server["cpu_util_pct_mean"] <= 100
    assert "gpu_util_pct_mean" not in verdict.server
    written = json.loads(Path(tmp_path / "gate" / "verdict.json").read_text())
    assert written["server"] == verdict.server
    report = (tmp_path / "gate" / "report.md").read_text()
    assert "Gate server while measuring: no GPU metrics (a CPU server); CPU " in report
    assert "no server metrics" in server_metrics.describe({})
