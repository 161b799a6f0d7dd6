"""The KFP v2 release pipeline: export -> compile -> publish -> stage -> gate -> promote | reject.

Each component is a lightweight @dsl.component that imports the step from `components` inside its
body: the images (images/versions.yaml) have the project installed, and KFP's local runner runs the
very same functions in this environment. Secrets never pass through parameters: S3 credentials come
from a Kubernetes Secret as environment variables (kfp-kubernetes), or from the environment locally.
"""

from typing import NamedTuple

from kfp import dsl, kubernetes
from kfp.dsl import HTML, Input, Markdown, Metrics, Model, Output

from components import admin_key
from components import gate as gate_defaults
from pipelines.images import image

AWS_SECRET_KEYS = {"AWS_ACCESS_KEY_ID": "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY": "AWS_SECRET_ACCESS_KEY"}
ADMIN_SECRET_KEYS = {"admin-key": admin_key.ENV}  # the Secret the Helm chart's Tritons take their admin key from
# One line: KFP copies defaults into the compiled file's header comment, and a multi-line default breaks it.
DEFAULT_SIGNATURE = (
    '{"batch": true, "max_batch_size": 16, "inputs": [{"name": "features", "dtype": "fp32", "shape": [-1, 32]}], '
    '"outputs": [{"name": "scores", "dtype": "fp32", "shape": [-1, 8]}]}'
)


@dsl.component(base_image=image("tools"))
def export_op(model_source: str, checkpoint: str, signature: str, golden_samples: int, exported: Output[Model]):
    """Load the user's model, check it against the signature, export it with golden samples."""
    import tempfile
    from pathlib import Path

    from components.export import export

    with tempfile.TemporaryDirectory() as tmp:
        signature_path = Path(tmp) / "signature.yaml"
        signature_path.write_text(signature)
        result = export(
            model_source, signature_path, Path(exported.path), checkpoint=checkpoint or None, samples=golden_samples
        )
    exported.metadata.update({"method": result.method, "fallback_reason": result.fallback_reason or ""})


@dsl.component(base_image=image("tools"))
def export_trained_op(
    trained: Input[Model], model_factory: str, signature: str, golden_samples: int, exported: Output[Model]
):
    """Export a model artifact from a training pipeline: a state_dict for `model_factory`, or a saved model."""
    import tempfile
    from pathlib import Path

    from components.export import export

    source = Path(trained.path)
    with tempfile.TemporaryDirectory() as tmp:
        signature_path = Path(tmp) / "signature.yaml"
        signature_path.write_text(signature)
        if model_factory:
            result = export(
                model_factory, signature_path, Path(exported.path), checkpoint=str(source), samples=golden_samples
            )
        else:
            result = export(str(source), signature_path, Path(exported.path), samples=golden_samples)
    exported.metadata.update({"method": result.method, "fallback_reason": result.fallback_reason or ""})


@dsl.component(base_image=image("compile"))
def compile_op(
    exported: Input[Model],
    model_name: str,
    target: str,
    precision: str,
    device: str,
    flavour: str,
    compiled: Output[Model],
    parity: Output[Metrics],
):
    """Compile for Triton and check parity against the eager model; fails the run on a mismatch."""
    from pathlib import Path

    from components.compile import compile_model

    result = compile_model(Path(exported.path), Path(compiled.path), model_name, target, precision, device, flavour)
    for row in result.parity:
        parity.log_metric(f"{row.name}.{row.check}.max_abs_err", row.max_abs_err)
    parity.log_metric("compile_seconds", round(result.seconds, 3))
    compiled.metadata.update({"target": target, "precision": precision, "device": result.device})


@dsl.component(base_image=image("tools"))
def publish_op(compiled: Input[Model], repository: str, s3_endpoint: str, run_id: str) -> NamedTuple(
    "Published", [("version", int), ("uri", str)]
):
    """Publish the compiled folder as a new immutable candidate version."""
    from collections import namedtuple
    from pathlib import Path

    from components.publish import publish
    from components.s3repo import S3Settings

    result = publish(Path(compiled.path), repository, run_id=run_id, s3=S3Settings.from_env(s3_endpoint))
    return namedtuple("Published", ["version", "uri"])(result.version, result.uri)


@dsl.component(base_image=image("tools"))
def stage_op(repository: str, model_name: str, version: int, gate: str, s3_endpoint: str, run_id: str) -> str:
    """Load the candidate dark on the gate server; check its answers. Returns the stage result (JSON)."""
    from components.replicas import resolve
    from components.s3repo import S3Settings
    from components.stage import stage

    result = stage(
        repository, model_name, int(version), resolve(gate)[0].url, s3=S3Settings.from_env(s3_endpoint), run_id=run_id
    )
    return result.to_json()


@dsl.component(base_image=image("gate"))
def tune_op(
    repository: str,
    model_name: str,
    version: int,
    gate: str,
    stage_result: str,
    s3_endpoint: str,
    run_id: str,
    enabled: bool,
    budget: int,
    concurrency: int,
    window_ms: int,
    max_p99_ms: float,
    report: Output[Markdown],
) -> str:
    """Search the candidate's serving settings on the gate (config overrides; S3 untouched). Returns the
    tuning result (JSON); turned off, or after a failed stage, it is the default settings, unmeasured."""
    import json
    from pathlib import Path

    from components.perf import LoadSettings
    from components.replicas import resolve
    from components.report import tuning_markdown
    from components.s3repo import S3Settings
    from components.stage import StageResult
    from components.tune import TuneSettings, tune

    staged = StageResult.from_json(stage_result)
    settings = TuneSettings(
        load=LoadSettings(concurrency=concurrency, window_ms=window_ms),
        max_p99_ms=max_p99_ms if max_p99_ms > 0 else None,
        budget=budget,
    )
    result = tune(
        repository, model_name, int(version), resolve(gate)[0].url, settings, s3=S3Settings.from_env(s3_endpoint),
        run_id=run_id, enabled=enabled and staged.accuracy_passed,
    )  # fmt: skip
    text = result.to_json()
    Path(report.path).write_text("\n".join(tuning_markdown(json.loads(text))) if result.trials else "tuning was off\n")
    return text


@dsl.component(base_image=image("gate"))
def gate_op(
    repository: str,
    model_name: str,
    version: int,
    gate: str,
    stage_result: str,
    tuning_json: str,
    s3_endpoint: str,
    run_id: str,
    concurrency: int,
    window_ms: int,
    design: str,
    min_rounds: int,
    budget_s: float,
    max_p99_ms: float,
    min_throughput: float,
    max_p99_regression_pct: float,
    max_throughput_regression_pct: float,
    metrics: Output[Metrics],
    report: Output[Markdown],
    report_html: Output[HTML],
) -> NamedTuple("Gated", [("verdict", str), ("verdict_json", str)]):
    """perf_analyzer rounds against stable until the limits decide, and the verdict; limits of 0 are off."""
    import tempfile
    from collections import namedtuple
    from pathlib import Path

    from components.gate import GateSettings
    from components.gate import gate as run_gate
    from components.replicas import resolve
    from components.s3repo import S3Settings
    from components.stage import StageResult
    from components.tune import TuneResult

    settings = GateSettings.from_flat(
        concurrency=concurrency, window_ms=window_ms, design=design, min_rounds=min_rounds, budget_s=budget_s,
        max_p99_ms=max_p99_ms, min_throughput=min_throughput, max_p99_regression_pct=max_p99_regression_pct,
        max_throughput_regression_pct=max_throughput_regression_pct,
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        result = run_gate(
            repository, model_name, int(version), resolve(gate)[0].url, settings,
            StageResult.from_json(stage_result), Path(tmp), s3=S3Settings.from_env(s3_endpoint), run_id=run_id,
            tuning=TuneResult.from_json(tuning_json),
        )  # fmt: skip
        Path(report.path).write_text((Path(tmp) / "report.md").read_text())
        Path(report_html.path).write_text((Path(tmp) / "report.html").read_text())
    for prefix, figures in (("candidate", result.candidate.summary()), ("stable", result.stable.summary())):
        for key, value in figures.items():
            if value is not None:
                metrics.log_metric(f"{prefix}_{key}", round(value, 4))
    for key in ("p99_regression_pct", "throughput_regression_pct", "measurement_seconds", "rounds"):
        if getattr(result, key) is not None:
            metrics.log_metric(key, round(getattr(result, key), 3))
    metrics.log_metric("passed", 1.0 if result.verdict == "pass" else 0.0)
    return namedtuple("Gated", ["verdict", "verdict_json"])(result.verdict, result.to_json())


@dsl.component(base_image=image("tools"))
def promote_op(repository: str, model_name: str, version: int, replicas: str, gate: str, verdict_json: str,
               tuning_json: str, s3_endpoint: str, run_id: str):  # fmt: skip
    """Rolling reload of every production replica with the tuned settings; reverts and fails on any error."""
    import json

    from components.promote import promote
    from components.replicas import resolve
    from components.s3repo import S3Settings
    from components.tune import TuneResult

    verdict = json.loads(verdict_json)["verdict"]
    promote(repository, model_name, int(version), resolve(replicas), verdict, resolve(gate)[0].url,
            settings=TuneResult.from_json(tuning_json).chosen, s3=S3Settings.from_env(s3_endpoint),
            run_id=run_id)  # fmt: skip


@dsl.component(base_image=image("tools"))
def reject_op(
    repository: str, model_name: str, version: int, gate: str, verdict_json: str, s3_endpoint: str, run_id: str
):
    """Leave production untouched, unload the candidate, record why."""
    import json

    from components.promote import reject
    from components.replicas import resolve
    from components.s3repo import S3Settings

    decided = json.loads(verdict_json)
    reject(repository, model_name, int(version), decided["verdict"], decided["reasons"], resolve(gate)[0].url,
           s3=S3Settings.from_env(s3_endpoint), run_id=run_id)  # fmt: skip


@dsl.component(base_image=image("tools"))
def finish_release_op(repository: str, model_name: str, gate: str, s3_endpoint: str, run_id: str):
    """Exit handler: whatever happened, the candidate leaves the gate server and this run's release
    lease on the model is given back (promote and reject give it back themselves on their paths)."""
    from components.promote import unload_candidate
    from components.replicas import resolve
    from components.repository import ModelRepository
    from components.s3repo import S3Settings

    unload_candidate(resolve(gate)[0].url, model_name)
    ModelRepository(repository, S3Settings.from_env(s3_endpoint)).release_lease(model_name, run_id)


def _with_s3_secret(task: dsl.PipelineTask, secret_name: str) -> dsl.PipelineTask:
    # optional: with IRSA / workload identity there is no Secret and boto3's chain finds the role.
    return kubernetes.use_secret_as_env(task, secret_name=secret_name, secret_key_to_env=AWS_SECRET_KEYS, optional=True)


def _with_secrets(task: dsl.PipelineTask, aws_secret_name: str, admin_secret_name: str) -> dsl.PipelineTask:
    """S3 credentials and the Tritons' admin key, for the steps that load and unload models."""
    _with_s3_secret(task, aws_secret_name)
    return kubernetes.use_secret_as_env(
        task, secret_name=admin_secret_name, secret_key_to_env=ADMIN_SECRET_KEYS, optional=True
    )


@dsl.pipeline(name="tritonship-release-steps", description="publish, stage, gate, then promote or reject")
def release_steps(
    compiled: Input[Model],
    model_name: str,
    repository: str,
    s3_endpoint: str,
    aws_secret_name: str,
    admin_secret_name: str,
    replicas: str,
    gate: str,
    concurrency: int,
    window_ms: int,
    design: str,
    min_rounds: int,
    budget_s: float,
    max_p99_ms: float,
    min_throughput: float,
    max_p99_regression_pct: float,
    max_throughput_regression_pct: float,
    tune: bool,
    tune_budget: int,
):
    run_id = dsl.PIPELINE_JOB_ID_PLACEHOLDER
    cleanup = _with_secrets(
        finish_release_op(repository=repository, model_name=model_name, gate=gate, s3_endpoint=s3_endpoint,
                          run_id=run_id),
        aws_secret_name, admin_secret_name,
    )  # fmt: skip
    with dsl.ExitHandler(cleanup, name="always-finish-release"):
        published = _with_s3_secret(
            publish_op(compiled=compiled, repository=repository, s3_endpoint=s3_endpoint, run_id=run_id),
            aws_secret_name,
        )
        version = published.outputs["version"]
        staged = _with_secrets(
            stage_op(repository=repository, model_name=model_name, version=version, gate=gate, s3_endpoint=s3_endpoint,
                     run_id=run_id),
            aws_secret_name, admin_secret_name,
        )  # fmt: skip
        tuned = _with_secrets(
            tune_op(
                repository=repository, model_name=model_name, version=version, gate=gate, stage_result=staged.output,
                s3_endpoint=s3_endpoint, run_id=run_id, enabled=tune, budget=tune_budget, concurrency=concurrency,
                window_ms=window_ms, max_p99_ms=max_p99_ms,
            ),
            aws_secret_name, admin_secret_name,
        )  # fmt: skip
        gated = _with_secrets(
            gate_op(
                repository=repository, model_name=model_name, version=version, gate=gate, stage_result=staged.output,
                tuning_json=tuned.outputs["Output"], s3_endpoint=s3_endpoint, run_id=run_id, concurrency=concurrency,
                window_ms=window_ms, design=design, min_rounds=min_rounds, budget_s=budget_s, max_p99_ms=max_p99_ms,
                min_throughput=min_throughput, max_p99_regression_pct=max_p99_regression_pct,
                max_throughput_regression_pct=max_throughput_regression_pct,
            ),
            aws_secret_name, admin_secret_name,
        )  # fmt: skip
        with dsl.If(gated.outputs["verdict"] == "pass", name="verdict-pass"):
            _with_secrets(
                promote_op(repository=repository, model_name=model_name, version=version, replicas=replicas, gate=gate,
                           verdict_json=gated.outputs["verdict_json"], tuning_json=tuned.outputs["Output"],
                           s3_endpoint=s3_endpoint, run_id=run_id),
                aws_secret_name, admin_secret_name,
            )  # fmt: skip
        with dsl.Else(name="verdict-not-pass"):
            _with_secrets(
                reject_op(repository=repository, model_name=model_name, version=version, gate=gate,
                          verdict_json=gated.outputs["verdict_json"], s3_endpoint=s3_endpoint, run_id=run_id),
                aws_secret_name, admin_secret_name,
            )  # fmt: skip


def _compile_task(
    exported: dsl.PipelineTask, model_name: str, target: str, precision: str, device: str, flavour: str,
    gpu_count: int, gpu_node_selector: dict, gpu_tolerations: list,
) -> dsl.PipelineTask:  # fmt: skip
    task = compile_op(
        exported=exported.outputs["exported"], model_name=model_name, target=target, precision=precision, device=device,
        flavour=flavour,
    )  # fmt: skip
    task.set_accelerator_type("nvidia.com/gpu").set_accelerator_limit(gpu_count)
    kubernetes.add_node_selector_json(task, gpu_node_selector)
    kubernetes.add_toleration_json(task, gpu_tolerations)
    return task


@dsl.pipeline(
    name="tritonship-release",
    description="Export, compile, publish, gate and promote a PyTorch model to Triton on S3.",
)
def release_pipeline(
    model_source: str = "mypackage.models:build_model",
    checkpoint: str = "",
    signature: str = DEFAULT_SIGNATURE,
    model_name: str = "model",
    golden_samples: int = 16,
    compile_target: str = "tensorrt",
    precision: str = "fp16",
    compile_device: str = "cuda",
    serving_flavour: str = "libtorch",
    gpu_count: int = 1,
    gpu_node_selector: dict = {"nvidia.com/gpu.present": "true"},  # noqa: B006 (KFP parameter default)
    gpu_tolerations: list = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],  # noqa: B006
    repository: str = "s3://models/tritonship",
    s3_endpoint: str = "",
    aws_secret_name: str = "tritonship-s3",
    admin_secret_name: str = "tritonship-triton-admin",
    replicas: str = "k8s://triton/app.kubernetes.io/component=production",
    gate: str = "k8s://triton/app.kubernetes.io/component=gate",
    concurrency: int = gate_defaults.DEFAULT_CONCURRENCY,
    window_ms: int = gate_defaults.DEFAULT_WINDOW_MS,
    design: str = "duet",
    min_rounds: int = gate_defaults.DEFAULT_MIN_ROUNDS,
    budget_s: float = gate_defaults.DEFAULT_BUDGET_S,
    max_p99_ms: float = 0.0,
    min_throughput: float = 0.0,
    max_p99_regression_pct: float = gate_defaults.DEFAULT_MAX_REGRESSION_PCT,
    max_throughput_regression_pct: float = gate_defaults.DEFAULT_MAX_REGRESSION_PCT,
    tune: bool = True,
    tune_budget: int = 16,
):
    exported = _with_s3_secret(
        export_op(model_source=model_source, checkpoint=checkpoint, signature=signature, golden_samples=golden_samples),
        aws_secret_name,
    )
    compiled = _compile_task(exported, model_name, compile_target, precision, compile_device, serving_flavour, gpu_count,
                             gpu_node_selector, gpu_tolerations)  # fmt: skip
    release_steps(
        compiled=compiled.outputs["compiled"], model_name=model_name, repository=repository, s3_endpoint=s3_endpoint,
        aws_secret_name=aws_secret_name, admin_secret_name=admin_secret_name, replicas=replicas, gate=gate,
        concurrency=concurrency, window_ms=window_ms, design=design, min_rounds=min_rounds, budget_s=budget_s, max_p99_ms=max_p99_ms, min_throughput=min_throughput,
        max_p99_regression_pct=max_p99_regression_pct, max_throughput_regression_pct=max_throughput_regression_pct,
        tune=tune, tune_budget=tune_budget,
    )  # fmt: skip
