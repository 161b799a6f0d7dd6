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


def _build(
    tools: Path, sources: Path | None = None, release: str = "r24.10", **env: str
) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, **env}
    if sources is not None:
        environment["TRITONSHIP_TRITON_SOURCES"] = str(sources)
    python = str(REPO / ".venv" / "bin" / "python")
    return subprocess.run(
        ["bash", str(SCRIPT), "--release", release, "--python", python, "--tools", str(tools)],
        capture_output=True,
        text=True,
        env=environment,
        cwd=REPO,
        timeout=300,
    )


@pytest.mark.parametrize("release, name", [("r24.10", "pytorch"), ("r26.05", "torchaoti")])
def test_a_second_run_with_the_same_torch_and_sources_does_nothing(release, name):
    built = REPO / ".tools" / "backends" / name / f"libtriton_{name}.so"
    assert built.is_file(), "setup builds both backends before the tests run"
    before = built.stat().st_mtime_ns
    result = _build(REPO / ".tools", release=release)
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


def test_a_patch_that_does_not_apply_stops_the_build_naming_it(tmp_path):
    """The r26.05 build applies scripts/patches/r26.05/ to the pinned sources; one that no longer fits stops it
    before anything is compiled or installed."""
    sources = tmp_path / "sources"
    sources.mkdir()
    for folder in (SOURCES, SOURCES.parent / "triton-r26.05"):
        if not folder.is_dir():
            pytest.skip(f"{folder} is not beside the checkout")
        for archive in folder.glob("*.tar.gz"):
            shutil.copy(archive, sources)
    work = tmp_path / "repo"
    shutil.copytree(REPO / "scripts", work / "scripts")
    patch = work / "scripts" / "patches" / "r26.05" / "pytorch_backend-2-pt2-read-parameters.patch"
    patch.write_text(patch.read_text().replace("Find(", "Lookup("))
    script, python = work / "scripts" / "build_pytorch_backend.sh", REPO / ".venv" / "bin" / "python"
    result = subprocess.run(
        ["bash", str(script), "--release", "r26.05", "--python", str(python), "--tools", str(tmp_path / "tools")],
        capture_output=True,
        text=True,
        env={**os.environ, "TRITONSHIP_TRITON_SOURCES": str(sources)},
        cwd=work,
        timeout=300,
    )
    assert result.returncode == 1
    assert "the step 'patch pytorch_backend-2-pt2-read-parameters.patch' failed" in result.stderr
    assert not (tmp_path / "tools" / "backends" / "torchaoti").exists()


def test_a_failing_build_step_is_named_with_its_last_lines(sources, tmp_path):
    result = _build(tmp_path / "tools", sources, CXX="/bin/false", CC="/bin/false")
    assert result.returncode == 1
    assert "the step 'cmake configure' failed; its last lines:" in result.stderr
    assert "CMAKE_CXX_COMPILER" in result.stderr or "compiler" in result.stderr.lower()
    log = tmp_path / "tools" / "logs" / "pytorch-backend" / "configure.log"
    assert log.is_file() and f"the whole output is in {log}" in result.stderr
    assert not (tmp_path / "tools" / "backends" / "pytorch" / "libtriton_pytorch.so").exists()
