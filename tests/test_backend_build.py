"""scripts/build_pytorch_backend.sh: a second run does nothing, sources that do not match their pins and a
failing build step stop it with a plain reason, and the installed backend is never touched by a failure."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "build_pytorch_backend.sh"
SOURCES = REPO.parent / "shared" / "third_party" / "triton-r24.10"
ARCHIVES = ("pytorch_backend", "backend", "core", "common")


def _build(tools: Path, sources: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, **env}
    if sources is not None:
        environment["TRITONSHIP_TRITON_SOURCES"] = str(sources)
    return subprocess.run(
        ["bash", str(SCRIPT), "--python", str(REPO / ".venv" / "bin" / "python"), "--tools", str(tools)],
        capture_output=True,
        text=True,
        env=environment,
        cwd=REPO,
        timeout=300,
    )


def test_a_second_run_with_the_same_torch_and_sources_does_nothing():
    built = REPO / ".tools" / "backends" / "pytorch" / "libtriton_pytorch.so"
    assert built.is_file(), "setup builds the backend before the tests run"
    before = built.stat().st_mtime_ns
    result = _build(REPO / ".tools")
    assert result.returncode == 0 and result.stdout == "" and result.stderr == "", result
    assert built.stat().st_mtime_ns == before


@pytest.fixture
def sources(tmp_path: Path) -> Path:
    if not SOURCES.is_dir():
        pytest.skip(f"{SOURCES} is not beside the checkout")
    copy = tmp_path / "sources"
    shutil.copytree(SOURCES, copy)
    return copy


def test_an_archive_that_does_not_match_its_pin_is_refused_and_nothing_is_installed(sources, tmp_path):
    archive = sources / "core-r24.10.tar.gz"
    archive.write_bytes(archive.read_bytes() + b"tampered")
    result = _build(tmp_path / "tools", sources)
    assert result.returncode == 1
    assert f"{archive} does not match its pinned SHA-256" in result.stderr
    assert not (tmp_path / "tools" / "backends" / "pytorch" / "libtriton_pytorch.so").exists()


def test_a_failing_build_step_is_named_with_its_last_lines(sources, tmp_path):
    result = _build(tmp_path / "tools", sources, CXX="/bin/false", CC="/bin/false")
    assert result.returncode == 1
    assert "the step 'cmake configure' failed; its last lines:" in result.stderr
    assert "CMAKE_CXX_COMPILER" in result.stderr or "compiler" in result.stderr.lower()
    log = tmp_path / "tools" / "logs" / "pytorch-backend" / "configure.log"
    assert log.is_file() and f"the whole output is in {log}" in result.stderr
    assert not (tmp_path / "tools" / "backends" / "pytorch" / "libtriton_pytorch.so").exists()
