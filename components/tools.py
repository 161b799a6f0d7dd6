"""Where the external tools are: perf_analyzer on the PATH (the tritonserver -py3-sdk image), else the
embedded 2.51 builds that scripts/setup.sh installs into .tools/ (docs/design.md section 5)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
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

    def start(self, args: Sequence[str]) -> subprocess.Popen[str]:
        """Start perf_analyzer; its stdout and stderr come back together from communicate()."""
        return subprocess.Popen(
            [str(self.path), *args], env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )


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
