"""The user's model code for a task that runs in an image without it: `model_packages`, pip requirement specifiers
and wheel URIs (a path, https:// or s3://), installed into a folder of the task's own before the model is imported.

For trials: the install runs at every task start and needs the index (or the wheels) to answer then. A scheduled
run should use an image with the package in it (`tritonship images build --model-package`, docs/guide.md).

pip installs with `--prefix` into a fresh folder, resolving against what the image already has: a package that
needs torch uses the image's torch (`--target` would install every dependency again, torch included), and the
image's own environment, owned by root, stays as it was."""

from __future__ import annotations

import atexit
import importlib
import shutil
import site
import subprocess
import sys
import tempfile
from pathlib import Path

from components import log
from components.model.model_source import ExportError, where_this_runs
from components.s3 import S3Settings, download_file, split_s3_uri

LOG = log.get("export")


def install_model_packages(packages: str, s3: S3Settings | None = None) -> Path | None:
    """pip-install `packages` (separated by spaces) into a folder of their own and put it on sys.path; the folder,
    or None when there is nothing to install. One sentence when pip refuses them; nothing is installed then."""
    wanted = packages.split()
    if not wanted:
        return None
    prefix = Path(tempfile.mkdtemp(prefix="tritonship-packages-"))
    atexit.register(shutil.rmtree, prefix, ignore_errors=True)
    requirements = [_local_wheel(spec, prefix / "wheels", s3) if spec.startswith("s3://") else spec for spec in wanted]
    command = [sys.executable, "-m", "pip", "install", "--prefix", str(prefix), "--no-warn-script-location"]
    log.event(LOG, "installing model packages", packages=" ".join(wanted), into=prefix)
    installed = subprocess.run(
        [*command, "--disable-pip-version-check", "--no-input", *requirements], capture_output=True, text=True
    )
    if installed.returncode:
        raise ExportError(
            f"pip could not install model_packages {' '.join(wanted)!r} in {where_this_runs()}: "
            f"{_pip_reason(installed.stderr or installed.stdout)}; check each specifier or wheel URI, and that the "
            "task reaches its package index."
        )
    # lib/python3.11/site-packages, or Debian's local/lib/python3.11/dist-packages outside a venv
    for folder in [*prefix.glob("lib/python*/site-packages"), *prefix.glob("local/lib/python*/dist-packages")]:
        site.addsitedir(str(folder))
    importlib.invalidate_caches()
    return prefix


def _local_wheel(uri: str, folder: Path, s3: S3Settings | None) -> str:
    """An s3:// wheel downloaded under its own file name (pip reads the name: package, version, tags)."""
    bucket, key = split_s3_uri(uri)
    name = key.rsplit("/", 1)[-1]
    if not name.endswith(".whl"):
        raise ExportError(f"model_packages names {uri}, which is not a wheel (.whl); give a wheel's S3 URI.")
    folder.mkdir(parents=True, exist_ok=True)
    download_file(s3 or S3Settings.from_env(), bucket, key, folder / name)
    return str(folder / name)


def _pip_reason(output: str) -> str:
    """pip's own reason: its first ERROR line, without the prefix."""
    errors = [line.removeprefix("ERROR:").strip() for line in output.splitlines() if line.startswith("ERROR:")]
    lines = errors or [line.strip() for line in output.splitlines() if line.strip()] or ["no output"]
    return lines[0].rstrip(".")[:300]
