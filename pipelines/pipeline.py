"""The KFP v2 release pipeline: export -> compile -> publish -> stage -> gate -> promote | reject.

Each component is a lightweight @dsl.component that imports the step from `components` inside its
body: the images (images/versions.yaml) have the project installed, and KFP's local runner runs the
very same functions in this environment. Secrets never pass through parameters: S3 credentials come
from a Kubernetes Secret as environment variables (kfp-kubernetes), or from the environment locally.
"""

from typing import NamedTuple

from kfp import dsl, kubernetes
from kfp.dsl import HTML, Input, Markdown, Metrics, Model, Output

from components import admin_key, settings
from components.settings import GATE_PARAMETERS
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
    compiled: Output[Model],
    parity: Output[Metrics],
):
    """Compile for Triton and check parity against the eager model; fails the run on a mismatch."""
    from pathlib import Path

    from components.compile import compile_model

    result = compile_model(Path(exported.path), Path(compiled.path), model_name, target, precision, device)
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
    gate_settings: dict,
    report: Output[Markdown],
) -> str:
    """Search the candidate's serving settings on the gate (config overrides; S3 untouched). Returns the
    tuning result (JSON); turned off, or after a failed stage, it is the default settings, unmeasured."""
    import json
    from pathlib import Path

    from components.replicas import resolve
    from components.report import tuning_markdown
    from components.results import StageResult
    from components.s3repo import S3Settings
    from components.settings import GateSettings
    from components.tune import TuneSettings, tune

    staged = StageResult.from_json(stage_result)
    gating = GateSettings.from_flat(**gate_settings)  # tuned at the gate's load, within its p99 limit
    settings = TuneSettings(
        load=gating.load,
        max_p99_ms=gating.thresholds.max_p99_ms,
        budget=budget,
    )
    server = resolve(gate)[0]  # a k8s:// gate also gives its metrics endpoint: GPU/CPU figures per trial
    result = tune(
        repository,
        model_name,
        int(version),
        server.url,
        settings,
        s3=S3Settings.from_env(s3_endpoint),
        run_id=run_id,
        enabled=enabled and staged.accuracy_passed,
        metrics_url=server.metrics_url,
    )
    text = result.to_json()
    Path(report.path).write_text("\n".join(tuning_markdown(json.loads(text))) if result.trials else "tuning was off\n")
    return text


@dsl.component(base_image=image("tools"))
def gate_settings_op(flat: dict) -> dict:
    """Check the gate's parameters before anything runs: a wrong one fails here, not after the GPU compile."""
    from components.settings import GateSettings

    return GateSettings.from_flat(**flat).to_flat()


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
    gate_settings: dict,
    metrics: Output[Metrics],
    report: Output[Markdown],
    report_html: Output[HTML],
) -> NamedTuple("Gated", [("verdict", str), ("verdict_json", str)]):
    """perf_analyzer rounds against stable until the limits decide, and the verdict; limits of 0 are off."""
    import tempfile
    from collections import namedtuple
    from pathlib import Path

    from components.gate import gate as run_gate
    from components.replicas import resolve
    from components.results import StageResult, TuneResult
    from components.s3repo import S3Settings
    from components.settings import GateSettings

    settings = GateSettings.from_flat(**gate_settings)
    with tempfile.TemporaryDirectory() as tmp:
        server = resolve(gate)[0]
        result = run_gate(
            repository,
            model_name,
            int(version),
            server.url,
            settings,
            StageResult.from_json(stage_result),
            Path(tmp),
            s3=S3Settings.from_env(s3_endpoint),
            run_id=run_id,
            tuning=TuneResult.from_json(tuning_json),
            metrics_url=server.metrics_url,
        )
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
def promote_op(
    repository: str,
    model_name: str,
    version: int,
    replicas: str,
    gate: str,
    verdict_json: str,
    tuning_json: str,
    s3_endpoint: str,
    run_id: str,
):
    """Rolling reload of every production replica with the tuned settings; reverts and fails on any error."""
    from components.promote import promote
    from components.replicas import resolve
    from components.results import TuneResult, Verdict
    from components.s3repo import S3Settings

    verdict = Verdict.from_json(verdict_json).verdict
    promote(
        repository,
        model_name,
        int(version),
        resolve(replicas),
        verdict,
        resolve(gate)[0].url,
        settings=TuneResult.from_json(tuning_json).chosen,
        s3=S3Settings.from_env(s3_endpoint),
        run_id=run_id,
    )


@dsl.component(base_image=image("tools"))
def reject_op(
    repository: str, model_name: str, version: int, gate: str, verdict_json: str, s3_endpoint: str, run_id: str
):
    """Leave production untouched, unload the candidate, record why."""
    from components.promote import reject
    from components.replicas import resolve
    from components.results import Verdict
    from components.s3repo import S3Settings

    decided = Verdict.from_json(verdict_json)
    reject(
        repository,
        model_name,
        int(version),
        decided.verdict,
        decided.reasons,
        resolve(gate)[0].url,
        s3=S3Settings.from_env(s3_endpoint),
        run_id=run_id,
    )


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
    gate_settings: dict,
    tune: bool,
    tune_budget: int,
):
    run_id = dsl.PIPELINE_JOB_ID_PLACEHOLDER
    cleanup = _with_secrets(
        finish_release_op(
            repository=repository, model_name=model_name, gate=gate, s3_endpoint=s3_endpoint, run_id=run_id
        ),
        aws_secret_name,
        admin_secret_name,
    )
    with dsl.ExitHandler(cleanup, name="always-finish-release"):
        published = _with_s3_secret(
            publish_op(compiled=compiled, repository=repository, s3_endpoint=s3_endpoint, run_id=run_id),
            aws_secret_name,
        )
        version = published.outputs["version"]
        staged = _with_secrets(
            stage_op(
                repository=repository,
                model_name=model_name,
                version=version,
                gate=gate,
                s3_endpoint=s3_endpoint,
                run_id=run_id,
            ),
            aws_secret_name,
            admin_secret_name,
        )
        tuned = _with_secrets(
            tune_op(
                repository=repository,
                model_name=model_name,
                version=version,
                gate=gate,
                stage_result=staged.output,
                s3_endpoint=s3_endpoint,
                run_id=run_id,
                enabled=tune,
                budget=tune_budget,
                gate_settings=gate_settings,
            ),
            aws_secret_name,
            admin_secret_name,
        )
        gated = _with_secrets(
            gate_op(
                repository=repository,
                model_name=model_name,
                version=version,
                gate=gate,
                stage_result=staged.output,
                tuning_json=tuned.outputs["Output"],
                s3_endpoint=s3_endpoint,
                run_id=run_id,
                gate_settings=gate_settings,
            ),
            aws_secret_name,
            admin_secret_name,
        )
        with dsl.If(gated.outputs["verdict"] == "pass", name="verdict-pass"):
            _with_secrets(
                promote_op(
                    repository=repository,
                    model_name=model_name,
                    version=version,
                    replicas=replicas,
                    gate=gate,
                    verdict_json=gated.outputs["verdict_json"],
                    tuning_json=tuned.outputs["Output"],
                    s3_endpoint=s3_endpoint,
                    run_id=run_id,
                ),
                aws_secret_name,
                admin_secret_name,
            )
        with dsl.Else(name="verdict-not-pass"):
            _with_secrets(
                reject_op(
                    repository=repository,
                    model_name=model_name,
                    version=version,
                    gate=gate,
                    verdict_json=gated.outputs["verdict_json"],
                    s3_endpoint=s3_endpoint,
                    run_id=run_id,
                ),
                aws_secret_name,
                admin_secret_name,
            )


def _compile_task(
    exported: dsl.PipelineTask,
    model_name: str,
    target: str,
    precision: str,
    device: str,
    gpu_count: int,
    gpu_node_selector: dict,
    gpu_tolerations: list,
) -> dsl.PipelineTask:
    task = compile_op(
        exported=exported.outputs["exported"],
        model_name=model_name,
        target=target,
        precision=precision,
        device=device,
    )
    task.set_accelerator_type("nvidia.com/gpu").set_accelerator_limit(gpu_count)
    kubernetes.add_node_selector_json(task, gpu_node_selector)
    kubernetes.add_toleration_json(task, gpu_tolerations)
    return task


RELEASE_ARGS = """Export, compile, publish, gate and promote a PyTorch model to Triton on S3.

Args:
    model_source: the model, package.module:factory returning a torch.nn.Module
    checkpoint: a state_dict for it (local path or s3:// URI); empty for none
    signature: the I/O signature (YAML or JSON): input and output names, dtypes, shapes, batching
    model_name: the name production serves the model under
    golden_samples: golden input samples kept for the accuracy checks
    compile_target: tensorrt or torchscript
    precision: fp32 or fp16
    compile_device: cuda or cpu
    gpu_count: GPUs the compile step asks for
    gpu_node_selector: node selector of the compile step
    gpu_tolerations: tolerations of the compile step
    repository: the repository root, s3://bucket/prefix
    s3_endpoint: an S3-compatible endpoint URL; empty for AWS
    aws_secret_name: Kubernetes Secret with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (optional, for IRSA)
    admin_secret_name: Kubernetes Secret with the Tritons' admin key (key admin-key)
    replicas: production replicas, host:port,... or k8s://namespace/label-selector
    gate: the gate server, in the same forms
    tune: search the candidate's serving settings on the gate before the gate measures it
    tune_budget: settings the tune step measures at most
"""


def release_pipeline(
    model_source: str = "mypackage.models:build_model",
    checkpoint: str = "",
    signature: str = DEFAULT_SIGNATURE,
    model_name: str = "model",
    golden_samples: int = 16,
    compile_target: str = "tensorrt",
    precision: str = "fp16",
    compile_device: str = "cuda",
    gpu_count: int = 1,
    gpu_node_selector: dict = {"nvidia.com/gpu.present": "true"},  # noqa: B006 (KFP parameter default)
    gpu_tolerations: list = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],  # noqa: B006
    repository: str = "s3://models/tritonship",
    s3_endpoint: str = "",
    aws_secret_name: str = "tritonship-s3",
    admin_secret_name: str = "tritonship-triton-admin",
    replicas: str = "k8s://triton/app.kubernetes.io/component=production",
    gate: str = "k8s://triton/app.kubernetes.io/component=gate",
    concurrency: int = settings.DEFAULT_CONCURRENCY,
    request_rate: float = 0.0,
    window_ms: int = settings.DEFAULT_WINDOW_MS,
    design: str = settings.DEFAULT_DESIGN,
    min_rounds: int = settings.DEFAULT_MIN_ROUNDS,
    budget_s: float = settings.DEFAULT_BUDGET_S,
    max_p99_ms: float = 0.0,
    min_throughput: float = 0.0,
    max_p99_regression_pct: float = settings.DEFAULT_MAX_REGRESSION_PCT,
    max_throughput_regression_pct: float = settings.DEFAULT_MAX_REGRESSION_PCT,
    tune: bool = True,
    tune_budget: int = 16,
):
    given = locals()  # the gate's parameters travel as one dict, checked before anything runs
    gating = gate_settings_op(flat={name: given[name] for name in GATE_PARAMETERS})
    exported = _with_s3_secret(
        export_op(model_source=model_source, checkpoint=checkpoint, signature=signature, golden_samples=golden_samples),
        aws_secret_name,
    ).after(gating)
    compiled = _compile_task(
        exported, model_name, compile_target, precision, compile_device, gpu_count, gpu_node_selector, gpu_tolerations
    )
    release_steps(
        compiled=compiled.outputs["compiled"],
        model_name=model_name,
        repository=repository,
        s3_endpoint=s3_endpoint,
        aws_secret_name=aws_secret_name,
        admin_secret_name=admin_secret_name,
        replicas=replicas,
        gate=gate,
        gate_settings=gating.output,
        tune=tune,
        tune_budget=tune_budget,
    )


# The compiled pipeline carries each parameter's description (the UI shows it); the gate's come from
# components/settings.py like the CLI's.
release_pipeline.__doc__ = RELEASE_ARGS + "".join(f"    {n}: {p.help}\n" for n, p in GATE_PARAMETERS.items())
release_pipeline = dsl.pipeline(name="tritonship-release")(release_pipeline)
