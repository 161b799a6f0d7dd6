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

REPO_ROOT = Path(__file__).resolve().parents[1]


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


def shared_client_cpus() -> set[int] | None:
    """The CPUs that the gate's duet clients share: the last quarter of those this process may use (at
    least one). Two perf_analyzers left to the scheduler are placed apart, and on a busy machine the one
    placed beside the other work loses for a whole round (a round's A/A p99 ratio then swings by 2x);
    sharing the same CPUs, neither side is favoured (benchmarks/README.md, "Where the duet's clients run")."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    return set(allowed[-max(1, len(allowed) // 4) :])


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
