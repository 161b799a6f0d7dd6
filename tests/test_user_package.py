"""A model whose code lives only in the user's own package (tests/fixtures/acme_ranker, copied outside the project
tree and never installed in the project's images), released with every pipeline task in its image (KFP's
DockerRunner through podman) in the three ways docs/guide.md gives: the export task in the user's image
(`images build --model-package`, `model_image`), the training example's (trained and exported in the user's image),
and `model_packages` (a wheel in S3: the export task alone). Given none of them, the run stops at export with
one sentence."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from components.model.signature import Signature
from components.repository import ModelRepository
from components.serving.triton_admin import TritonAdmin
from pipelines.demo import demo_parameters
from pipelines.images import matrix
from pipelines.local import LocalRun, LocalRunError, run_local
from tests.release_helpers import unique

pytestmark = [pytest.mark.containers, pytest.mark.slow]
FIXTURE = Path(__file__).parent / "fixtures" / "acme_ranker"
TOOLS = matrix()["local"]["images"]["tools"]
OUTPUTS = ["probabilities", "label"]


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The user's package, outside the project's tree, importable by this test process for the eager reference."""
    source = tmp_path_factory.mktemp("user") / "acme_ranker"
    shutil.copytree(FIXTURE, source)
    sys.path.insert(0, str(source))
    yield source
    sys.path.remove(str(source))


@pytest.fixture(scope="module")
def user_image(package: Path) -> str:
    """The user's image, built as the guide says: the local tools image plus the package's source folder."""
    built = subprocess.run(
        [
            str(Path(sys.executable).with_name("tritonship")),
            "images",
            "build",
            "--local",
            "--model-package",
            str(package),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert built.returncode == 0, built.stderr
    assert built.stdout.strip() == "localhost/acme-ranker:0.3.0"  # the package's name and version
    return built.stdout.strip()


def parameters(stack, name: str, **extra: object) -> dict[str, object]:
    signature = json.dumps(yaml.safe_load((FIXTURE / "signature.yaml").read_text()))
    # first releases, judged on an absolute limit far off: short windows decide them in a few seconds
    return demo_parameters(stack, "acme_ranker.model:build", signature=signature, model_name=name) | {
        "tune": False,
        "window_ms": 250,
        **extra,
    }


def eager(checkpoint: Path | None = None) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    from acme_ranker.model import build

    model = build().eval()
    if checkpoint is not None:
        model.load_state_dict(torch.load(checkpoint, weights_only=True))
    request = Signature.load(FIXTURE / "signature.yaml").example_inputs(5, seed=11)
    with torch.no_grad():
        return request, [t.numpy() for t in model(*(torch.from_numpy(request[k]) for k in ("ids", "dense")))]


def assert_every_replica_answers_as_eager(stack, name: str, checkpoint: Path | None = None) -> None:
    request, expected = eager(checkpoint)
    for replica in stack.replicas:
        version, served = TritonAdmin(replica.http_url).served(name, request, OUTPUTS)
        assert version == 1
        np.testing.assert_allclose(served["probabilities"], expected[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(served["label"], expected[1])


def assert_compiled_without_the_package(run: LocalRun) -> None:
    """compile ran in the project's tools image (its build.json), where the package cannot be imported."""
    build = json.loads((Path(run.artifact("compile-op", "compiled")["uri"]) / "1" / "build.json").read_text())
    assert build["image"] == TOOLS, build["image"]
    imported = subprocess.run(
        ["podman", "run", "--rm", "--network", "none", TOOLS, "python", "-c", "import acme_ranker"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert imported.returncode == 1 and "No module named 'acme_ranker'" in imported.stderr, imported.stderr


def test_a_users_package_reaches_export_in_its_image_and_nowhere_else(tmp_path, stack, package, user_image):
    name = unique("acme")
    run = run_local(
        parameters(stack, name, model_image=user_image, tune=True, tune_budget=2),
        tmp_path / "runs",
        env=stack.env(),
        runner="docker",
    )
    assert run.version == 1 and run.verdict["verdict"] == "pass" and run.promoted, run.verdict
    exported = json.loads((Path(run.artifact("export-op", "exported")["uri"]) / "export.json").read_text())
    assert exported["image"] == user_image and exported["method"] == "torch.export"
    assert_compiled_without_the_package(run)
    assert_every_replica_answers_as_eager(stack, name)
    # every task ran as the image's user: what each wrote is owned by uid 10001
    owners = {p.parent.name: p.stat().st_uid for p in run.root.glob("*/executor_output.json")}
    assert set(owners) >= {"export-op", "compile-op", "publish-op", "stage-op", "gate-op", "promote-op"}
    assert set(owners.values()) == {10001}, owners
    # the credentials reached the tasks as container environment: never in a task's output or log
    secrets = [stack.s3.secret_access_key, stack.admin_key]
    outputs = [run.log] + [p.read_text(errors="replace") for p in run.root.rglob("*") if p.is_file()]
    assert all(secret and not any(secret in text for text in outputs) for secret in secrets)

    # given by none of the ways, the next release of the model stops at export: one sentence, production untouched
    history = ModelRepository(f"s3://{stack.bucket}", stack.s3).history(name)
    with pytest.raises(LocalRunError) as refused:
        run_local(parameters(stack, name), tmp_path / "runs", env=stack.env(), runner="docker")
    said = str(refused.value)
    assert f"cannot import 'acme_ranker.model' for the model factory in the image {TOOLS}" in said, said
    assert "model_image" in said and "model_packages" in said
    tasks_said = refused.value.log  # every task's output: the export task's sentence, no traceback anywhere
    assert "error: cannot import 'acme_ranker.model'" in tasks_said and "Traceback" not in tasks_said
    failed = sorted((tmp_path / "runs").iterdir(), key=lambda p: p.stat().st_mtime)[-1]
    assert not (failed / "compile-op").exists()
    assert ModelRepository(f"s3://{stack.bucket}", stack.s3).history(name) == history  # nothing published
    assert_every_replica_answers_as_eager(stack, name)


def test_the_training_example_trains_and_exports_in_the_users_image(tmp_path, stack, package, user_image):
    from pipelines.examples.train_and_release import train_and_release

    name = unique("acme-trained")
    run = run_local(
        {
            "repository": f"s3://{stack.bucket}",
            "s3_endpoint": stack.s3.endpoint_url,
            "replicas": ",".join(s.replica_spec for s in stack.replicas),
            "gate": stack.gate.http_url,
            "trainer": "acme_ranker.train:train",
            "model_source": "acme_ranker.model:build",
            "signature": parameters(stack, name)["signature"],
            "quality_spec": "",
            "model_image": user_image,
            "model_name": name,
            "window_ms": 250,
        },
        tmp_path / "runs",
        env=stack.env(),
        runner="docker",
        pipeline=train_and_release,
    )
    assert run.promoted, run.verdict
    assert run.artifact("train-op", "metrics")["metadata"]["loss"] < 0.69  # trained: chance is ln 2
    exported = json.loads((Path(run.artifact("export-trained-op", "exported")["uri"]) / "export.json").read_text())
    assert exported["image"] == user_image
    assert_compiled_without_the_package(run)
    assert_every_replica_answers_as_eager(stack, name, Path(run.artifact("train-op", "trained")["uri"]))


def test_model_packages_installs_a_wheel_from_s3_into_the_export_task(tmp_path, stack, package):
    """The wheel is the subject: the export task alone runs (in the project's image, as the pipeline runs it), and
    its reference outputs are the user's eager model's. What follows export is the same for any model (the tests
    above release one from the user's image to every replica)."""
    from kfp import dsl

    from components.model.model_folder import load_golden
    from components.model.settings import ExportSettings
    from pipelines.kfp_model_components import export_op

    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(package)],
        check=True,
        timeout=300,
    )
    [wheel] = wheels.glob("acme_ranker-0.3.0-*.whl")
    stack.s3.client().upload_file(str(wheel), stack.bucket, f"wheels/{wheel.name}")

    def export_only(model_source, signature, settings):
        export_op(model_source=model_source, checkpoint="", signature=signature, settings=settings)

    export_only.__annotations__ = {"model_source": str, "signature": str, "settings": dict}  # not postponed strings

    chosen = ExportSettings(model_packages=f"s3://{stack.bucket}/wheels/{wheel.name}")
    given = parameters(stack, "unused")
    run = run_local(
        {"model_source": given["model_source"], "signature": given["signature"], "settings": chosen.to_dict()},
        tmp_path / "runs",
        env=stack.env(),
        runner="docker",
        pipeline=dsl.pipeline(name="export-only")(export_only),
    )
    folder = Path(run.artifact("export-op", "exported")["uri"])
    exported = json.loads((folder / "export.json").read_text())
    assert exported["image"] == TOOLS  # the project's image, with the wheel installed for the task alone
    inputs, outputs = load_golden(folder / "golden.npz")
    from acme_ranker.model import build

    with torch.no_grad():
        expected = build().eval()(*(torch.from_numpy(inputs[k]) for k in ("ids", "dense")))
    np.testing.assert_allclose(outputs["probabilities"], expected[0].numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(outputs["label"], expected[1].numpy())
