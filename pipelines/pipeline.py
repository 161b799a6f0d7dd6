"""The KFP v2 release pipeline: export -> compile -> publish -> stage -> gate -> promote | reject.

Each component is a lightweight @dsl.component that imports the step from `components` inside its
body: the images (images/versions.yaml) have the project installed, and KFP's local runner runs the
very same functions in this environment. Secrets never pass through parameters: S3 credentials come
from a Kubernetes Secret as environment variables (kfp-kubernetes), or from the environment locally.
"""

from kfp import dsl, kubernetes
from kfp.dsl import Input, Model

from components import admin_key, settings
from components.settings import GATE_PARAMETERS
from pipelines.kfp_components import (
    compile_op,
    export_op,
    finish_release_op,
    gate_op,
    gate_settings_op,
    promote_op,
    publish_op,
    reject_op,
    stage_op,
    tune_op,
)

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
    compile_target: tensorrt or torchscript (tensorrt here on a GPU node; the CLI's default is torchscript)
    precision: fp32, fp16 or bf16 (bf16 with tensorrt only)
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
    golden_samples: int = settings.DEFAULT_GOLDEN_SAMPLES,
    compile_target: str = settings.PIPELINE_TARGET,
    precision: str = settings.PIPELINE_PRECISION,
    compile_device: str = settings.PIPELINE_COMPILE_DEVICE,
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
    tune_budget: int = settings.DEFAULT_TUNE_BUDGET,
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
