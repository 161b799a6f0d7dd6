"""Where the external tools are: perf_analyzer on the PATH (the tritonserver -py3-sdk image), else the
embedded 2.51 builds that scripts/setup.sh installs into .tools/ (docs/design.md section 5)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from components.errors import TritonshipError

REPO_ROOT = Path(__file__).resolve().parents[2]


def tools_dir() -> Path:
    return Path(os.environ.get("TRITONSHIP_TOOLS", REPO_ROOT / ".tools"))


@dataclass
class PerfAnalyzerTool:
    """Where the perf_analyzer binary is and what it needs in its environment."""

    path: Path
    env: dict[str, str]

    def start(self, args: Sequence[str], cpus: set[int] | None = None) -> subprocess.Popen[str]:
        """Start perf_analyzer, on `cpus` only if given; its stdout and stderr come back together from
        communicate()."""
        with _on_cpus(cpus):
            return subprocess.Popen(
                [str(self.path), *args], env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )


@contextlib.contextmanager
def _on_cpus(cpus: set[int] | None) -> Iterator[None]:
    """Run the block with this thread pinned to `cpus`: a process started in it inherits the pinning.
    Only the calling thread's mask changes (and is restored), so other threads are not disturbed."""
    if not cpus or not hasattr(os, "sched_setaffinity"):
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def client_cpu_groups() -> list[set[int]]:
    """The CPU groups the gate's duet clients take turns on: the CPUs this process may use, in groups of a
    quarter of them (at least one CPU each).

    Both perf_analyzers of a round run on one group. Left to the scheduler, they are placed apart, and on
    a busy machine the one placed beside the other work loses for the whole round (a round's A/A p99
    ratio then swings by 2x). Sharing CPUs, neither client is favoured; and taking a different group each
    round, the clients do not always crowd the same CPUs, which would favour for a whole decision the
    server-side backend process that happens to run elsewhere (benchmarks/README.md, "Where the duet's
    clients run")."""
    if not hasattr(os, "sched_getaffinity"):
        return []
    allowed = sorted(os.sched_getaffinity(0))
    size = max(1, len(allowed) // 4)
    return [set(allowed[i : i + size]) for i in range(0, len(allowed) - size + 1, size)]


def shared_client_cpus(round_index: int = 0) -> set[int] | None:
    """The CPUs both duet clients of round `round_index` run on (see client_cpu_groups)."""
    groups = client_cpu_groups()
    return groups[round_index % len(groups)] if groups else None


def find_perf_analyzer() -> PerfAnalyzerTool:
    env = dict(os.environ)
    on_path = shutil.which("perf_analyzer")
    if on_path:
        return PerfAnalyzerTool(Path(on_path), env)
    embedded = tools_dir() / "bin" / "perf_analyzer"
    if not embedded.exists():
        raise TritonshipError(
            "perf_analyzer was not found on the PATH nor in the embedded tools; run `make setup` "
            "(or run this step in the tritonserver -py3-sdk image)."
        )
    cudart = tools_dir() / "nvidia" / "cuda_runtime" / "lib"
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(cudart), env.get("LD_LIBRARY_PATH", "")) if p)
    return PerfAnalyzerTool(embedded, env)
