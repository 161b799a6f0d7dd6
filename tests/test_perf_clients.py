"""Where the gate's duet clients run: both perf_analyzers on the same CPUs, a different group each round."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np

from components.model.model_folder import load_golden
from components.serving import perf
from components.serving.tools import PerfAnalyzerTool, client_cpu_groups, shared_client_cpus
from components.serving.triton_admin import TritonAdmin
from components.settings import RELAXED_STABILITY_PCT
from tests.models import mlp_folder, upload_folder


def _allowed_cpus(status: str) -> set[int]:
    """CPUs from a /proc/<pid>/status text's Cpus_allowed_list ("0-3,6")."""
    line = next(x for x in status.splitlines() if x.startswith("Cpus_allowed_list:"))
    cpus: set[int] = set()
    for part in line.split(":", 1)[1].strip().split(","):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def test_rounds_take_turns_on_groups_of_a_quarter_of_the_cpus_and_a_started_process_keeps_its_group():
    allowed = os.sched_getaffinity(0)
    groups = client_cpu_groups()
    size = max(1, len(allowed) // 4)
    assert all(len(g) == size for g in groups) and set().union(*groups) <= allowed
    assert len(set().union(*groups)) == size * len(groups) == size * (len(allowed) // size)  # disjoint
    assert [shared_client_cpus(i) for i in range(len(groups) + 1)] == [*groups, groups[0]]
    shared = shared_client_cpus(len(groups) - 1)
    cat = PerfAnalyzerTool(Path("/bin/cat"), dict(os.environ))  # any program: it prints its own mask
    output, _ = cat.start(["/proc/self/status"], shared).communicate(timeout=10)
    assert _allowed_cpus(output) == shared
    assert os.sched_getaffinity(0) == allowed  # the caller's own mask is given back
    unpinned, _ = cat.start(["/proc/self/status"]).communicate(timeout=10)
    assert _allowed_cpus(unpinned) == allowed


def test_a_duet_runs_both_perf_analyzers_on_the_shared_cpus(stack, s3, tmp_path):
    folder = mlp_folder(tmp_path, "duet_mlp")
    upload_folder(s3, stack.bucket, folder, "models/duet_mlp")
    golden_in, _ = load_golden(folder / "1" / "golden.npz")
    seen: dict[int, set[int]] = {}
    done = threading.Event()

    def watch() -> None:  # the masks of this test's perf_analyzers (not another run's) while they run
        while not done.is_set():
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    status = Path(f"/proc/{pid}/status").read_text()
                except OSError:
                    continue
                if status.startswith("Name:\tperf_analyzer") and f"\nPPid:\t{os.getpid()}\n" in status:
                    seen[int(pid)] = _allowed_cpus(status)
            done.wait(0.05)

    with TritonAdmin(stack.gate.http_url) as admin:
        admin.load("duet_mlp")
        try:
            data = perf.write_input_data(golden_in, tmp_path / "input.json", batched=True)
            watcher = threading.Thread(target=watch)
            watcher.start()
            try:
                runs = perf.measure_together(
                    stack.gate.http_url,
                    [perf.Target("duet_mlp", "1")] * 2,
                    data,
                    perf.LoadSettings(window_ms=500, stability_pct=RELAXED_STABILITY_PCT),  # as the gate's duet
                    client_cpus=shared_client_cpus(0),
                )
            finally:
                done.set()
                watcher.join()
        finally:
            admin.unload("duet_mlp")
    assert all(run.ok for run in runs), [run.stderr_tail for run in runs]
    assert all(np.size(run.latencies_us) > 0 for run in runs)
    assert len(seen) == 2, seen
    assert all(cpus == shared_client_cpus(0) for cpus in seen.values()), seen  # a first round's group
