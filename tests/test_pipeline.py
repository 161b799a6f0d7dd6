"""The KFP pipeline: compiled YAML kept current and safe, and whole runs under KFP's local runner."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from components.errors import TritonshipError
from components.repository import ModelRepository
from components.serving.triton_admin import TritonAdmin
from pipelines.demo import demo_parameters
from pipelines.images import matrix
from pipelines.kubeflow import COMPILED, compile_pipeline, parse_parameters, validate_cron
from pipelines.local import LocalRun, run_local
from pipelines.sample_models import SAMPLE_SIGNATURE
from tests.release_helpers import unique

REPO = Path(__file__).resolve().parents[1]


def test_checked_in_yaml_is_what_the_code_compiles_to(tmp_path):
    # Compared as YAML: the compiler's header comment lists dict defaults in no fixed order.
    fresh = list(yaml.safe_load_all(compile_pipeline(tmp_path / "p.yaml").read_text()))
    assert list(yaml.safe_load_all(COMPILED.read_text())) == fresh, (
        "run `tritonship pipeline compile` and commit pipelines/release_pipeline.yaml"
    )


def test_compiled_yaml_has_the_kubernetes_settings_and_pinned_images_and_no_secret():
    text = COMPILED.read_text()
    docs = list(yaml.safe_load_all(text))
    spec, platform = docs[0], docs[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    executors = spec["deploymentSpec"]["executors"]
    images = {n: e["container"]["image"] for n, e in executors.items()}
    # export and compile run in the model_image and compile_image parameters (the user's package, where it is
    # needed), whose defaults are the project's images
    defaults = spec["root"]["inputDefinitions"]["parameters"]
    for task, parameter, kind in (("export", "model_image", "tools"), ("compile", "compile_image", "compile")):
        assert images.pop(f"exec-{task}-op") == f"{{{{$.inputs.parameters['pipelinechannel--{parameter}']}}}}"
        assert defaults[parameter]["defaultValue"] == matrix()["images"][kind]
    assert set(images.values()) == {matrix()["images"][k] for k in ("tools", "gate")}
    assert all(re.search(r":[\w.-]+$", i) and not i.endswith(":latest") for i in images.values())
    compile_exec = executors["exec-compile-op"]["container"]
    assert compile_exec["resources"]["accelerator"]["resourceType"] == "nvidia.com/gpu"
    compile_k8s = platform["exec-compile-op"]
    assert compile_k8s["nodeSelector"]["nodeSelectorJson"]["componentInputParameter"] == "gpu_node_selector"
    assert compile_k8s["tolerations"][0]["tolerationJson"]["componentInputParameter"] == "gpu_tolerations"
    for name in (
        "exec-export-op",
        "exec-publish-op",
        "exec-stage-op",
        "exec-gate-op",
        "exec-promote-op",
        "exec-reject-op",
        "exec-finish-release-op",
    ):
        env = platform[name]["secretAsEnv"][0]
        assert {k["envVar"] for k in env["keyToEnv"]} == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
        assert env["secretNameParameter"]["componentInputParameter"].endswith("aws_secret_name")
        # the Tritons' admin key, only for the steps that load or unload models
        admin = [e for e in platform[name]["secretAsEnv"] if "admin_secret_name" in str(e)]
        wanted = [] if name in ("exec-export-op", "exec-publish-op") else [{"envVar": "TRITONSHIP_ADMIN_KEY"}]
        assert [{"envVar": k["envVar"]} for e in admin for k in e["keyToEnv"]] == wanted, name
    assert defaults["gpu_node_selector"]["defaultValue"] == {"nvidia.com/gpu.present": "true"}
    assert not re.search(r"AKIA[0-9A-Z]{12}", text)


def test_compiling_with_credentials_in_the_environment_leaks_none_of_them(tmp_path, monkeypatch):
    secret = "wJalrXUtnFEMI-" + unique("secret")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLEKEYID0001")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("TRITONSHIP_ADMIN_KEY", secret + "-admin")
    text = compile_pipeline(tmp_path / "p.yaml").read_text()
    assert secret not in text and "AKIAEXAMPLEKEYID0001" not in text


def test_parameters_are_typed_like_the_pipeline_and_cron_has_six_fields():
    params = parse_parameters(["min_rounds=5", "max_p99_ms=12", "gpu_node_selector={pool: gpu}", "model_name=0123"])
    assert params == {"min_rounds": 5, "max_p99_ms": 12.0, "gpu_node_selector": {"pool": "gpu"}, "model_name": "0123"}
    with pytest.raises(TritonshipError, match="no parameter 'nope'"):
        parse_parameters(["nope=1"])
    with pytest.raises(TritonshipError, match="takes a int"):
        parse_parameters(["min_rounds=many"])
    assert validate_cron("0 0 3 * * *")
    with pytest.raises(TritonshipError, match="KFP takes 6, seconds first"):
        validate_cron("0 3 * * *")


def _metrics(run) -> dict:
    return run.artifact("gate-op", "metrics")["metadata"]


@pytest.mark.slow
def test_pipeline_runs_locally_for_a_passing_and_a_failing_candidate(tmp_path, stack):
    name = unique("pipe")
    # short windows: the tasks' machinery is the subject here, not the gate's statistics (tests/test_gate*.py)
    base = demo_parameters(stack, "pipelines.sample_models:sample_v1", SAMPLE_SIGNATURE, name) | {
        "tune_budget": 3,
        "window_ms": 250,
    }
    first = run_local(base, tmp_path / "runs", env=stack.s3.env())
    assert first.version == 1 and first.verdict["verdict"] == "pass" and first.promoted
    assert _metrics(first)["passed"] == 1.0 and _metrics(first)["candidate_p99_ms"] > 0

    # tuning switched off: the gate measures the default settings
    slow = run_local(
        base | {"model_source": "pipelines.sample_models:sample_v3_slow", "tune": False},
        tmp_path / "runs",
        env=stack.s3.env(),
    )
    assert slow.version == 2 and slow.verdict["verdict"] == "fail" and slow.rejected and not slow.promoted
    assert slow.verdict["gate_url"] == stack.gate.http_url  # the one gate server named
    metrics = _metrics(slow)
    assert metrics["passed"] == 0.0 and metrics["p99_regression_pct"] > 20
    report = Path(slow.artifact("gate-op", "report")["uri"]).read_text()
    assert report.startswith(f"# Gate: {name} v2 — **FAIL**") and "| stable | " in report
    assert "<img" in Path(slow.artifact("gate-op", "report_html")["uri"]).read_text()
    parity = slow.artifact("compile-op", "parity")["metadata"]
    assert parity["scores.golden.max_abs_err"] < 1e-4

    history = ModelRepository(f"s3://{stack.bucket}", stack.s3).history(name)
    assert [(e["event"], e["version"]) for e in history] == [
        ("published", 1),
        ("staged", 1),
        ("tuned", 1),
        ("gate", 1),
        ("promoted", 1),
        ("published", 2),
        ("staged", 2),
        ("gate", 2),
        ("rejected", 2),
    ]
    tuned = next(e for e in history if e["event"] == "tuned")
    # the budget (the default twice for the p99 limit, one other setting), and if that one won, it and the
    # default once more to confirm it
    assert len(tuned["trials"]) == 3 + 2 * bool(tuned["confirmation"])
    assert "Serving settings" in Path(first.artifact("tune-op", "report")["uri"]).read_text()
    desired = ModelRepository(f"s3://{stack.bucket}", stack.s3).desired_config(name)[0]
    assert desired.instance_group[0].count == tuned["chosen"]["instance_count"]  # promoted with what was chosen
    assert {e["run_id"] for e in history if e["version"] == 1} != {e["run_id"] for e in history if e["version"] == 2}
    _assert_no_secret_in_outputs(stack, tmp_path, [first.log, slow.log], name)
    features = {"features": __import__("numpy").zeros((1, 32), "float32")}
    assert [TritonAdmin(s.http_url).served_version(name, features, ["scores"]) for s in stack.replicas] == [1, 1]
    assert not TritonAdmin(stack.gate.http_url).is_ready(f"{name}__candidate")  # the exit handler ran


@pytest.mark.slow
def test_example_training_pipeline_releases_what_it_trained(tmp_path, stack, monkeypatch):
    from kfp import local

    from pipelines.examples.train_and_release import train_and_release

    for key, value in stack.s3.env().items():
        monkeypatch.setenv(key, value)
    from pipelines.samples.bert4rec import training

    training.write_eval(training.eval_set(2000, seed=1000), tmp_path / "sessions.npz")
    stack.s3.client().upload_file(str(tmp_path / "sessions.npz"), stack.bucket, "eval/sessions.npz")
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "runs"))
    name = unique("trained")
    train_and_release(
        repository=f"s3://{stack.bucket}",
        s3_endpoint=stack.s3.endpoint_url,
        replicas=",".join(s.http_url for s in stack.replicas),
        gate=stack.gate.http_url,
        eval_data=f"s3://{stack.bucket}/eval/sessions.npz",
        model_name=name,
        window_ms=250,  # the tasks' machinery is the subject here, not the gate's statistics
    )
    run = LocalRun.read(next((tmp_path / "runs").iterdir()))
    assert run.artifact("train-op", "metrics")["metadata"]["hit_rate_at_10"] > 0.3  # trained: chance is 0.02
    metrics = run.artifact("quality-op", "metrics")["metadata"]  # what the Kubeflow UI compares runs by
    assert metrics["quality_passed"] == 1.0 and metrics["hit_rate_10_candidate"] > 0.3, metrics
    assert "ndcg_10_candidate" in metrics and "hit_rate_10_difference" not in metrics  # a first release
    assert run.verdict["quality"]["decision"] == "pass" and run.promoted
    events = [e["event"] for e in ModelRepository(f"s3://{stack.bucket}", stack.s3).history(name)]
    assert events == ["published", "staged", "quality", "gate", "promoted"]


def _assert_no_secret_in_outputs(stack, run_root: Path, logs: list[str], model: str) -> None:
    """Every output of the runs: task outputs and artifacts, the runner's log, the S3 history and
    objects of the release, and the servers' logs, searched for the S3 credentials."""
    secrets = [stack.s3.secret_access_key, stack.s3.access_key_id]
    assert all(secrets)
    texts = {f"log {i}": text for i, text in enumerate(logs)}
    texts |= {str(p): p.read_bytes().decode(errors="replace") for p in run_root.rglob("*") if p.is_file()}
    texts |= {str(p): p.read_text(errors="replace") for p in (stack.workdir / "logs").glob("*.log")}
    client = stack.s3.client()
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=stack.bucket):
        for entry in page.get("Contents", []):
            if model in entry["Key"]:
                body = client.get_object(Bucket=stack.bucket, Key=entry["Key"])["Body"].read()
                texts[entry["Key"]] = body.decode(errors="replace")
    assert len(texts) > 20
    leaks = [where for where, text in texts.items() if any(s in text for s in secrets)]
    assert leaks == [], f"credentials found in {leaks}"


def test_demo_table_without_a_terminal_prints_every_reason_in_full():
    import io

    from rich.console import Console
    from rich.table import Table

    from pipelines.demo import print_table

    reasons = [
        "p99 +3.1% [-2.0, +8.2] (limit +10%): within; throughput -0.4% [-3.1, +2.4] (limit -10%): within",
        "still undecided when the 90 s budget was spent: p99 +9.1% [+2.2, +16.5] (limit +10%): straddles; "
        "throughput -8.0% [-12.9, -2.8] (limit -10%): straddles",
    ]
    rows = [[f"v{i + 1}", str(i + 1), "pass (promoted)", "3.10", "1,234", r] for i, r in enumerate(reasons)]
    table = Table(*("release", "version", "verdict", "p99 ms", "infer/s", "reason"))
    for row in rows:
        table.add_row(*row)
    buffer = io.StringIO()
    print_table(Console(file=buffer, width=80, force_terminal=False), table, rows)
    lines = buffer.getvalue().splitlines()
    for row in rows:
        assert f"{row[0]}: {row[-1]}" in lines  # whole, on one line of its own
    assert all("straddles" not in line for line in lines if "│" in line)  # reasons left the table


def test_only_the_local_runners_expected_image_warning_is_silenced():
    import warnings

    from pipelines.local import expected_warnings_silenced

    expected = (
        'You may be attemping to run a task that uses custom or non-Python base image "gate:1" in a Python '
        "environment. This may result in incorrect dependencies and/or incorrect behavior."
    )
    accelerator = (
        "Task 'compile-op': settings ['accelerator'] have no effect in the current local runner and will be ignored."
    )
    other = "Task 'gate-op': settings ['cpu_limit'] have no effect in the current local runner and will be ignored."
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with expected_warnings_silenced():
            for message, category in (
                (expected, RuntimeWarning),
                (accelerator, UserWarning),
                ("a task failed to report its metrics", RuntimeWarning),
                (other, UserWarning),
            ):
                warnings.warn(message, category, stacklevel=1)
    assert [str(w.message) for w in seen] == ["a task failed to report its metrics", other]


def test_a_failed_tasks_own_error_ends_the_local_runs_message():
    """What KFP's SubprocessRunner printed for a task that failed, recorded: its traceback's last line."""
    from pipelines.local import task_error

    log = (Path(__file__).parent / "fixtures" / "kfp_local_failed_task.log").read_text()
    assert task_error(log) == (
        "ExportError: pipelines.samples.bert4rec has no callable 'no_such_model'; the factory must return an nn.Module."
    )
    assert task_error("Task 'export-op' finished with status FAILURE") == ""


def test_a_tasks_image_given_as_a_parameter_is_read_from_its_own_inputs():
    """kfp's local runner hands set_container_image(parameter) over as the placeholder; Kubeflow resolves it."""
    from pipelines.container_runner import ContainerRunError, resolved_image

    placeholder = "{{$.inputs.parameters['pipelinechannel--model_image']}}"
    inputs = {"inputs": {"parameterValues": {"pipelinechannel--model_image": "registry.example/ml/mypkg:1.0"}}}
    command = ["sh", "-c", "...", "--executor_input", json.dumps(inputs), "--function_to_execute", "export_op"]
    assert resolved_image(placeholder, command) == "registry.example/ml/mypkg:1.0"
    assert resolved_image("ghcr.io/tritonship/gate:0.1.0-26.10", command) == "ghcr.io/tritonship/gate:0.1.0-26.10"
    inputs["inputs"]["parameterValues"]["pipelinechannel--model_image"] = ""
    with pytest.raises(ContainerRunError, match="the parameter pipelinechannel--model_image, which is empty"):
        resolved_image(placeholder, ["--executor_input", json.dumps(inputs)])


def test_a_release_the_demo_did_not_expect_is_explained_by_what_decided_it():
    """A promotion the canary reverted is explained by the canary, not by the gate's figures it passed."""
    from components.release.promote.records import CanaryResult, PromoteResult
    from pipelines.demo import story_differences

    canary = CanaryResult("m", 2, 1, "inconclusive", ["still undecided: mean latency +40% [-5, +85] (limit +75%)"])
    reverted = PromoteResult("m", 2, 1, ["prod-0"], promoted=False, reverted=True, canary=canary).to_json()
    gate = {"verdict": "pass", "reasons": ["p99 +2.4% [-4.0, +9.3] (limit +10%): within"]}
    run = LocalRun(
        Path("run"),
        outputs={
            "gate-op": {"parameterValues": {"verdict_json": json.dumps(gate)}},
            "promote-op": {"parameterValues": {"promote_json": reverted, "promoted": False}},
        },
    )
    [problem] = [p for p in story_differences([run] * 5, served=[None]) if p.startswith("v2")]
    assert "v2: retrained was reverted, expected promoted (canary inconclusive" in problem, problem
    assert "mean latency +40%" in problem and "p99 +2.4%" not in problem
