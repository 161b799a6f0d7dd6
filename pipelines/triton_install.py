"""The embedded tritonserver's backends and environment: the wheel's Python backend beside Triton's PyTorch backend
built by scripts/build_pytorch_backend.sh (docs/design.md section 5), and what each server process is given."""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from pathlib import Path

from components.s3 import S3Settings
from components.serving import admin_key
from components.serving.tools import tools_dir
from pipelines.processes import StackError

PYTORCH_BACKEND = "libtriton_pytorch.so"
# r26.05's backend, which serves torch_aoti, under a name of its own: 2.51 refuses that platform for `pytorch`
AOTI_BACKEND = "torchaoti"


def triton_env(s3: S3Settings) -> dict[str, str]:
    """The environment a tritonserver of the stack runs in: its principal's S3 credentials (no other AWS_*
    variable and no admin key leaks in), the wheel's libraries, and the Python backend stub's packages."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k != admin_key.ENV}
    env.update(s3.env())
    libs = tools_dir() / "nvidia_pytriton.libs"
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(libs), env.get("LD_LIBRARY_PATH", "")) if p)
    # The Python backend stub embeds the system libpython3.11; packages reach it through PYTHONPATH
    # (which model.py honours). The stub's pybind11 code needs numpy 1.x, so the numpy that
    # setup.sh put in .tools/stub-site comes before our environment's (torch) and the caller's PYTHONPATH.
    inherited = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([str(tools_dir() / "stub-site"), *inherited, sysconfig.get_paths()["purelib"]])
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def backend_directory(workdir: Path) -> Path:
    """Triton's PyTorch backend (built by scripts/build_pytorch_backend.sh) beside the wheel's Python
    backend, which an ensemble's pre/post steps run on."""
    backends = workdir / "backends"
    python = backends / "python"
    if not (python / "triton_python_backend_stub").exists():
        source = tools_dir() / "pytriton" / "tritonserver"
        if not source.exists():
            raise StackError(f"the embedded tritonserver is not installed under {tools_dir()}; run scripts/setup.sh.")
        python.mkdir(parents=True, exist_ok=True)
        for item in (source / "backends" / "python").iterdir():
            if item.is_file():
                shutil.copy2(item, python / item.name)
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        shutil.copy2(source / "python_backend_stubs" / version / "triton_python_backend_stub", python)
    pytorch = backends / "pytorch" / PYTORCH_BACKEND
    if not pytorch.exists():
        built = tools_dir() / "backends" / "pytorch" / PYTORCH_BACKEND
        if not built.is_file():
            raise StackError(f"Triton's PyTorch backend is not built ({built} is missing); run scripts/setup.sh.")
        pytorch.parent.mkdir(parents=True, exist_ok=True)
        pytorch.symlink_to(built.resolve())
    aoti = backends / AOTI_BACKEND / f"libtriton_{AOTI_BACKEND}.so"
    built = tools_dir() / "backends" / AOTI_BACKEND / aoti.name
    if built.is_file() and not aoti.exists():  # without it, a torch_aoti load fails with the server's reason
        aoti.parent.mkdir(parents=True, exist_ok=True)
        aoti.symlink_to(built.resolve())
    return backends
