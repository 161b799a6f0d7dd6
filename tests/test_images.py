"""Dockerfiles checked statically with the official BuildKit parser (no Docker engine here), and the
version matrix kept consistent: compile image, Triton server image and gate image of one NGC release."""

from __future__ import annotations

import configparser
import os
import re
import subprocess
import sys
from pathlib import Path

import dockerfile
import pytest
import yaml

from pipelines.image_build import host_pip_mounts, plan
from pipelines.images import check_one_ngc_release, matrix

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "images"
KINDS = ("compile", "gate", "tools", "gate-local")  # built from the project's folder
USER_KINDS = ("model",)  # built from a context image_build makes: the user's package as package/
SECRET_WORDS = re.compile(r"(SECRET|PASSWORD|TOKEN|ACCESS_KEY|PRIVATE_KEY|AWS_)", re.I)


def parsed(path: Path) -> list[dockerfile.Command]:
    return list(dockerfile.parse_file(str(path)))


def commands(kind: str) -> list[dockerfile.Command]:
    return parsed(IMAGES / f"{kind}.Dockerfile")


def test_the_compile_and_triton_images_come_from_one_ngc_release():
    check_one_ngc_release(matrix())
    chart_values = yaml.safe_load((ROOT / "manifests/helm/tritonship-triton/values.yaml").read_text())
    assert f"{chart_values['image']['repository']}:{chart_values['image']['tag']}" == matrix()["base"]["triton"]
    assert all(matrix()["ngc_release"] in matrix()["images"][k] for k in ("compile", "gate"))


def test_the_settings_name_the_matrix_torch_and_tools_image():
    from components.settings import COMPILE_IMAGE, SERVING_TORCH, TOOLS_IMAGE

    assert matrix()["serving_torch"] == SERVING_TORCH  # publish checks packages against it
    assert matrix()["images"]["tools"] == TOOLS_IMAGE  # model_image's default
    assert matrix()["images"]["compile"] == COMPILE_IMAGE  # compile_image's


def test_a_mismatched_release_is_caught():
    versions = yaml.safe_load(yaml.safe_dump(matrix()))
    versions["base"]["compile"] = "nvcr.io/nvidia/pytorch:26.09-py3"
    with pytest.raises(ValueError, match="different NGC releases"):
        check_one_ngc_release(versions)
    versions["base"]["compile"] = "pytorch/pytorch:2.14.0"
    with pytest.raises(ValueError, match="not an NGC <YY.MM>-py3 image"):
        check_one_ngc_release(versions)


def build_arg_defaults(path: Path) -> dict[str, str]:
    return dict(v.split("=", 1) for c in parsed(path) if c.cmd == "ARG" for v in c.value if "=" in v)


# A Dockerfile's defaults are its upstream build's; the local build passes its own (plan(local=True)).
DEFAULT_BUILDS = list({b.dockerfile: b for b in plan(local=True) + plan()}.values())


@pytest.mark.parametrize("build", DEFAULT_BUILDS, ids=lambda b: b.dockerfile.stem)
def test_every_dockerfile_takes_its_base_and_pins_as_arguments_whose_defaults_are_the_matrix(build):
    froms = [c.value[0] for c in parsed(build.dockerfile) if c.cmd == "FROM"]
    assert froms == ["${BASE}"]
    assert build_arg_defaults(build.dockerfile) == build.build_args | {"IMAGE": build.tag}
    for base in (build.build_args["BASE"], build.tag):
        assert re.search(r":[\w][\w.-]*$", base) and not base.endswith(":latest"), base


@pytest.mark.parametrize("kind", KINDS + USER_KINDS)
def test_hadolint_passes(kind):
    hadolint = Path(sys.executable).with_name("hadolint")
    linted = subprocess.run(
        [str(hadolint), "--no-color", str(IMAGES / f"{kind}.Dockerfile")], capture_output=True, text=True
    )
    assert linted.returncode == 0, linted.stdout + linted.stderr


@pytest.mark.parametrize("kind", KINDS)
def test_every_copy_source_exists(kind):
    for command in commands(kind):
        if command.cmd in ("COPY", "ADD"):
            sources = [v for v in command.value[:-1] if not v.startswith("--")]
            assert sources, command.original
            for source in sources:
                assert (ROOT / source).exists(), f"{kind}.Dockerfile: {source} does not exist"


@pytest.mark.parametrize("kind", KINDS + USER_KINDS)
def test_runs_as_a_non_root_user_and_bakes_in_no_secret(kind):
    parsed = commands(kind)
    users = [c.value[0] for c in parsed if c.cmd == "USER"]
    assert users and users[-1] not in ("root", "0"), "the last USER must not be root"
    for command in parsed:
        if command.cmd in ("ENV", "ARG", "LABEL"):
            names = command.value[0::2] if command.cmd == "ENV" else [v.split("=")[0] for v in command.value]
            assert not any(SECRET_WORDS.search(n) for n in names), command.original
        assert "AKIA" not in command.original
    assert (ROOT / ".dockerignore").exists()
    ignored = (ROOT / ".dockerignore").read_text()
    assert ".venv" in ignored and ".stack" in ignored


def test_pipeline_components_use_the_matrix_images():
    from kfp.dsl import PipelineTask  # noqa: F401 (kfp loaded: the pipeline module imports it)

    from pipelines import pipeline

    for component in (pipeline.export_op, pipeline.compile_op, pipeline.gate_op, pipeline.promote_op):
        image = component.component_spec.implementation.container.image
        assert image in matrix()["images"].values()
    assert pipeline.compile_op.component_spec.implementation.container.image == matrix()["images"]["compile"]
    assert pipeline.gate_op.component_spec.implementation.container.image == matrix()["images"]["gate"]


def test_a_podman_build_gets_the_hosts_pip_configuration_as_read_only_mounts(tmp_path, monkeypatch):
    wheels, bundle = tmp_path / "wheels", tmp_path / "proxy-ca.crt"
    wheels.mkdir()
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    for name in [n for n in os.environ if n.startswith("PIP_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # no file: only what the environment says
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    monkeypatch.setenv("PIP_CERT", str(bundle))
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", f"file://{wheels} https://pypi.example/simple")
    build_dir = tmp_path / "build"
    build_dir.mkdir()
    mounts = host_pip_mounts(build_dir)
    assert mounts[0::2] == ["-v"] * 3
    assert mounts[1::2] == [f"{build_dir}/pip.conf:/etc/pip.conf:ro", f"{bundle}:{bundle}:ro", f"{wheels}:{wheels}:ro"]
    conf = configparser.ConfigParser()
    conf.read(build_dir / "pip.conf")
    assert dict(conf["global"]) == {
        "find-links": str(wheels),
        "cert": str(bundle),
        "extra-index-url": f"file://{wheels} https://pypi.example/simple",
    }


def test_a_model_image_is_named_after_its_package_and_refuses_what_it_cannot_build(tmp_path):
    from pipelines.image_build import ImageBuildError, build_model_image, model_package_tag

    folder = ROOT / "tests" / "fixtures" / "acme_ranker"  # pyproject.toml: acme-ranker 0.3.0
    assert model_package_tag(folder) == "localhost/acme-ranker:0.3.0"
    assert model_package_tag(folder, "registry.example.com/ml", on="compile") == (
        "registry.example.com/ml/acme-ranker-compile:0.3.0"
    )
    wheel = tmp_path / "Acme_Ranker-1.2.post1+cpu-py3-none-any.whl"
    wheel.write_bytes(b"")
    assert model_package_tag(wheel, "r.example:5000") == "r.example:5000/acme-ranker:1.2.post1-cpu"
    (tmp_path / "no-version").mkdir()
    (tmp_path / "no-version" / "pyproject.toml").write_text('[project]\nname = "x"\ndynamic = ["version"]\n')
    for package, says in [
        (tmp_path / "no-version", "names no [project] name and version; give the image's name with --tag"),
        (tmp_path / "missing", "does not exist; give a source folder or a wheel"),
        (ROOT / "README.md", "is neither a wheel (.whl) nor a folder with a pyproject.toml"),
    ]:
        with pytest.raises(ImageBuildError, match=re.escape(says)):
            build_model_image(package, local=True)
    with pytest.raises(ImageBuildError, match=r"--push of localhost/acme-ranker:0\.3\.0 needs a registry"):
        build_model_image(folder, local=True, push=True)
    with pytest.raises(ImageBuildError, match="--on gpu is not one of tools, compile"):
        build_model_image(folder, local=True, on="gpu")
