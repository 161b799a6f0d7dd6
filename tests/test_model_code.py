"""Where the user's model code is needed, and the one sentence where it is not there: export imports the factory's
package (given by model_packages, an image or the environment); compile needs none of it, unless the model calls
an operator its package registers. Each command runs as a user runs it, in a process of its own, so that no
package imported here is found by it. The same ways through the pipeline, in containers: test_user_package.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from components.model.model_packages import install_model_packages
from components.model.model_source import ExportError

FIXTURE = Path(__file__).parent / "fixtures" / "acme_ranker"
TRITONSHIP = str(Path(sys.executable).with_name("tritonship"))
CUSTOM_OPERATOR_PACKAGE = """
import torch
from torch import nn


@torch.library.custom_op("scalers::double", mutates_args=())
def double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@double.register_fake
def _(x):
    return torch.empty_like(x)


class Doubled(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 3)

    def forward(self, x):
        return double(self.linear(x))


def build():
    torch.manual_seed(0)
    return Doubled()
"""
SIGNATURE = """batch: true
max_batch_size: 8
inputs: [{name: x, dtype: fp32, shape: [-1, 4]}]
outputs: [{name: y, dtype: fp32, shape: [-1, 3]}]
"""


def tritonship(*args: str, cwd: Path, pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | (
        {"PYTHONPATH": str(pythonpath)} if pythonpath else {}
    )
    return subprocess.run([TRITONSHIP, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def one_sentence(ran: subprocess.CompletedProcess[str]) -> str:
    assert ran.returncode != 0 and "Traceback" not in ran.stderr, ran.stderr
    [line] = [line for line in ran.stderr.splitlines() if line.strip()]
    assert line.startswith("error: ")
    return line


def test_export_installs_model_packages_and_refuses_a_model_it_cannot_import(tmp_path):
    package = tmp_path / "acme_ranker"
    shutil.copytree(FIXTURE, package)
    signature = str(package / "signature.yaml")
    refused = tritonship(
        "export", "--model", "acme_ranker.model:build", "--signature", signature, "--out", "e", cwd=tmp_path
    )
    said = one_sentence(refused)
    assert "cannot import 'acme_ranker.model' for the model factory in this Python environment" in said
    assert "install its package here or put it on PYTHONPATH" in said and not (tmp_path / "e").exists()

    given = ["--model", "acme_ranker.model:build", "--signature", signature, "--model-packages", str(package)]
    exported = tritonship("export", *given, "--out", "e", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    assert (tmp_path / "e" / "exported.pt2").is_file() and (tmp_path / "e" / "model.ts").is_file()
    # compile needs none of the package: a process without it compiles the export
    compiled = tritonship("compile", "e", "--name", "acme", "--out", "c", cwd=tmp_path)
    assert compiled.returncode == 0, compiled.stderr
    assert (tmp_path / "c" / "1" / "model.pt").is_file()


@pytest.mark.parametrize(
    ("packages", "reason"),
    [
        ("[bad", "Invalid requirement: '[bad': Expected package name"),
        ("./acme_ranker-0.3.0-py3-none-any.whl", "No such file or directory"),
    ],
)
def test_packages_pip_refuses_are_one_sentence_and_nothing_is_installed(tmp_path, monkeypatch, packages, reason):
    monkeypatch.chdir(tmp_path)
    before = list(sys.path)
    with pytest.raises(ExportError) as refused:
        install_model_packages(packages)
    said = str(refused.value)
    assert said.startswith(f"pip could not install model_packages '{packages}' in this Python environment")
    assert reason in said and "\n" not in said and said.endswith("reaches its package index.")
    assert sys.path == before


def test_an_s3_package_must_be_a_wheel(tmp_path):
    with pytest.raises(ExportError, match=r"names s3://bucket/pkgs/acme.tar.gz, which is not a wheel \(\.whl\)"):
        install_model_packages("s3://bucket/pkgs/acme.tar.gz")
    assert install_model_packages("  ") is None


@pytest.mark.parametrize("target", ["torchscript", "aoti"])
def test_compile_names_an_operator_the_models_package_registers_where_it_is_missing(tmp_path, target):
    (tmp_path / "pkg" / "scalers").mkdir(parents=True)
    (tmp_path / "pkg" / "scalers" / "__init__.py").write_text(CUSTOM_OPERATOR_PACKAGE)
    (tmp_path / "signature.yaml").write_text(SIGNATURE)
    given = ("--model", "scalers:build", "--signature", "signature.yaml", "--out", "e")
    assert tritonship("export", *given, cwd=tmp_path, pythonpath=tmp_path / "pkg").returncode == 0

    compile_args = ("compile", "e", "--name", "doubled", "--target", target)
    said = one_sentence(tritonship(*compile_args, "--out", "c", cwd=tmp_path))
    artifact = "model.ts" if target == "torchscript" else "exported.pt2"
    assert f"e/{artifact} calls the operator scalers::double, which the model's package registers" in said
    assert "compile_image" in said and not (tmp_path / "c").exists()
    # where the package is, the export's factory module registers it and compile checks parity as always
    compiled = tritonship(*compile_args, "--out", "c", cwd=tmp_path, pythonpath=tmp_path / "pkg")
    assert compiled.returncode == 0, compiled.stderr
