"""The KFP v2 release pipeline: export -> compile -> publish -> stage -> gate -> promote | reject.

Each component is a lightweight @dsl.component that imports the step from `components` inside its
body: the images (images/versions.yaml) have the project installed, and KFP's local runner runs the
very same functions in this environment. Secrets never pass through parameters: S3 credentials come
from a Kubernetes Secret as environment variables (kfp-kubernetes), or from the environment locally.
"""

from typing import Any

from kfp import dsl, kubernetes
from kfp.dsl import Input, Model

from components.release.step_settings import pipeline_parameters
from components.serving import admin_key
from pipelines.kfp_components import (
    compile_op,
    export_op,
    finish_release_op,
    gate_op,
    promote_op,
    publish_op,
    quality_op,
    reject_op,
    settings_op,
    stage_op,
    tune_op,
)

STEP = pipeline_parameters()
AWS_SECRET_KEYS = {"AWS_ACCESS_KEY_ID": "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY": "AWS_SECRET_ACCESS_KEY"}
ADMIN_SECRET_KEYS = {"admin-key": admin_key.ENV}  # the Secret the Helm chart's Tritons take their admin key from
# One line: KFP copies defaults into the compiled file's header comment, and a multi-line default breaks it.
DEFAULT_SIGNATURE = (
    '{"batch": true, "max_batch_size": 16, "inputs": [{"name": "features", "dtype": "fp32", "shape": [-1, 32]}], '
    '"outputs": [{"name": "scores", "dtype": "fp32", "shape": [-1, 8]}]}'
)


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
    settings: dict,
):
    run_id = dsl.PIPELINE_JOB_ID_PLACEHOLDER
    cleanup = _with_secrets(
        finish_release_op(
            repository=repository,
            model_name=model_name,
            gate=gate,
            replicas=replicas,
            s3_endpoint=s3_endpoint,
            run_id=run_id,
        ),
        aws_secret_name,
        admin_secret_name,
    )
    with dsl.ExitHandler(cleanup, name="always-finish-release"):
        published = _with_s3_secret(
            publish_op(
                compiled=compiled, repository=repository, s3_endpoint=s3_endpoint, run_id=run_id, settings=settings
            ),
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
                settings=settings,
            ),
            aws_secret_name,
            admin_secret_name,
        )
        judged = _with_secrets(
            quality_op(
                repository=repository,
                model_name=model_name,
                version=version,
                gate=gate,
                stage_result=staged.output,
                s3_endpoint=s3_endpoint,
                run_id=run_id,
                settings=settings,
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
                settings=settings,
            ),
            aws_secret_name,
            admin_secret_name,
        ).after(judged)  # one measurement on the gate server at a time
        gated = _with_secrets(
            gate_op(
                repository=repository,
                model_name=model_name,
                version=version,
                gate=gate,
                stage_result=staged.output,
                tuning_json=tuned.outputs["Output"],
                quality_json=judged.outputs["Output"],
                s3_endpoint=s3_endpoint,
                run_id=run_id,
                settings=settings,
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
                    settings=settings,
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
    settings: Any,  # the settings step's output
    gpu_count: int,
    gpu_node_selector: dict,
    gpu_tolerations: list,
) -> dsl.PipelineTask:
    task = compile_op(exported=exported.outputs["exported"], model_name=model_name, settings=settings)
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
    gpu_count: GPUs the compile step asks for
    gpu_node_selector: node selector of the compile step
    gpu_tolerations: tolerations of the compile step
    repository: the repository root, s3://bucket/prefix
    s3_endpoint: an S3-compatible endpoint URL; empty for AWS
    aws_secret_name: Kubernetes Secret with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (optional, for IRSA)
    admin_secret_name: Kubernetes Secret with the Tritons' admin key (key admin-key)
    replicas: production replicas, host:port,... or k8s://namespace/label-selector
    gate: the gate server, in the same forms
"""


def release_pipeline(
    model_source: str = "mypackage.models:build_model",
    checkpoint: str = "",
    signature: str = DEFAULT_SIGNATURE,
    model_name: str = "model",
    gpu_count: int = 1,
    gpu_node_selector: dict = {"nvidia.com/gpu.present": "true"},  # noqa: B006 (KFP parameter default)
    gpu_tolerations: list = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],  # noqa: B006
    repository: str = "s3://models/tritonship",
    s3_endpoint: str = "",
    aws_secret_name: str = "tritonship-s3",
    admin_secret_name: str = "tritonship-triton-admin",
    replicas: str = "k8s://triton/app.kubernetes.io/component=production",
    gate: str = "k8s://triton/app.kubernetes.io/component=gate",
    # every step's settings: names, defaults and help from components/release/step_settings.py's tables
    golden_samples: int = STEP["golden_samples"].default,
    export_method: str = STEP["export_method"].default,
    compile_target: str = STEP["compile_target"].pipeline_default("compile_target"),
    precision: str = STEP["precision"].pipeline_default("precision"),
    compile_device: str = STEP["compile_device"].pipeline_default("compile_device"),
    tensorrt_opt_batch: int = STEP["tensorrt_opt_batch"].default,
    tensorrt_workspace_gb: float = STEP["tensorrt_workspace_gb"].default,
    serving_torch: str = STEP["serving_torch"].default,
    load_timeout_s: float = STEP["load_timeout_s"].default,
    tune: bool = STEP["tune"].default,
    tune_budget: int = STEP["tune_budget"].default,
    tune_p99_slack_pct: float = STEP["tune_p99_slack_pct"].default,
    tune_min_gain_pct: float = STEP["tune_min_gain_pct"].default,
    tune_instance_counts: str = STEP["tune_instance_counts"].default,
    tune_intra_op_threads: str = STEP["tune_intra_op_threads"].default,
    eval_data: str = STEP["eval_data"].default,
    quality_spec: str = STEP["quality_spec"].default,
    concurrency: int = STEP["concurrency"].default,
    request_rate: float = STEP["request_rate"].default,
    window_ms: int = STEP["window_ms"].default,
    design: str = STEP["design"].default,
    min_rounds: int = STEP["min_rounds"].default,
    budget_s: float = STEP["budget_s"].default,
    max_p99_ms: float = STEP["max_p99_ms"].default,
    min_throughput: float = STEP["min_throughput"].default,
    max_p99_regression_pct: float = STEP["max_p99_regression_pct"].default,
    max_throughput_regression_pct: float = STEP["max_throughput_regression_pct"].default,
    canary: bool = STEP["canary"].default,
    canary_replicas: int = STEP["canary_replicas"].default,
    canary_round_s: float = STEP["canary_round_s"].default,
    canary_max_bake_s: float = STEP["canary_max_bake_s"].default,
    canary_min_rounds: int = STEP["canary_min_rounds"].default,
    canary_min_requests: int = STEP["canary_min_requests"].default,
    canary_max_latency_regression_pct: float = STEP["canary_max_latency_regression_pct"].default,
    canary_max_p99_regression_pct: float = STEP["canary_max_p99_regression_pct"].default,
    canary_max_failure_increase_pct: float = STEP["canary_max_failure_increase_pct"].default,
    canary_max_latency_ms: float = STEP["canary_max_latency_ms"].default,
    canary_max_p99_ms: float = STEP["canary_max_p99_ms"].default,
    canary_on_inconclusive: str = STEP["canary_on_inconclusive"].default,
):
    given = locals()  # the steps' settings travel as one dict, checked before anything runs
    checked = settings_op(flat={n: given[n] for n in STEP if n != "quality_spec"}, quality_spec=quality_spec)
    exported = _with_s3_secret(
        export_op(model_source=model_source, checkpoint=checkpoint, signature=signature, settings=checked.output),
        aws_secret_name,
    )
    compiled = _compile_task(exported, model_name, checked.output, gpu_count, gpu_node_selector, gpu_tolerations)
    release_steps(
        compiled=compiled.outputs["compiled"],
        model_name=model_name,
        repository=repository,
        s3_endpoint=s3_endpoint,
        aws_secret_name=aws_secret_name,
        admin_secret_name=admin_secret_name,
        replicas=replicas,
        gate=gate,
        settings=checked.output,
    )


# The compiled pipeline carries each parameter's description (the UI shows it); the steps' come from their
# tables like the CLI's.
release_pipeline.__doc__ = RELEASE_ARGS + "".join(f"    {n}: {p.help}\n" for n, p in STEP.items())
release_pipeline = dsl.pipeline(name="tritonship-release")(release_pipeline)
