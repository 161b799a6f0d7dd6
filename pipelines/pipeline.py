"""The KFP v2 release pipeline: export -> compile -> publish -> stage -> gate -> promote | reject.

Each component is a lightweight @dsl.component that imports the step from `components` inside its
body: the images (images/versions.yaml) have the project installed, and KFP's local runner runs the
very same functions in this environment. Secrets never pass through parameters: S3 credentials come
from a Kubernetes Secret as environment variables (kfp-kubernetes), or from the environment locally.
"""

import inspect
from collections.abc import Callable
from typing import Any

from kfp import dsl, kubernetes
from kfp.dsl import Input, Model

from components.release.step_settings import PIPELINE_STEPS
from components.serving import admin_key
from pipelines.kfp_components import (
    calibrate_op,
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
from pipelines.kfp_model_components import compile_op, export_op

STEP = PIPELINE_STEPS.parameters()  # every step setting that is a pipeline parameter, by its name there
MODEL_STEPS = ("export", "compile")  # the tasks that take the user's model, before release_steps
# release_steps' tasks' settings, by settings_op's outputs
RELEASE_STEPS = tuple(step for step in PIPELINE_STEPS if step not in MODEL_STEPS)
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


def with_parameters(body: Callable[..., Any], made: list[inspect.Parameter]) -> Callable[..., Any]:
    """`body` with the parameters `made` after its own: KFP reads this signature, and calls it with every parameter
    in order; body gets `made` as keywords."""
    own = [p for p in inspect.signature(body).parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    signature = inspect.Signature([*own, *made])

    def pipeline(*args: Any, **kwargs: Any) -> Any:
        given = signature.bind(*args, **kwargs)
        given.apply_defaults()
        return body(**given.arguments)

    pipeline.__signature__ = signature  # type: ignore[attr-defined]
    pipeline.__doc__ = body.__doc__
    return pipeline


def _release_steps(
    compiled: Input[Model],
    model_name: str,
    repository: str,
    s3_endpoint: str,
    aws_secret_name: str,
    admin_secret_name: str,
    replicas: str,
    gate: str,
    **settings: Any,  # each of RELEASE_STEPS' settings, as `<step>_settings`
):
    """Each task takes its own step's settings (settings_op's outputs, `steps_settings`): a change to one step's
    leaves the other tasks' inputs, and so KFP's cache of them, as they were."""
    step = {name: settings[f"{name}_settings"] for name in RELEASE_STEPS}
    run_id = dsl.PIPELINE_JOB_ID_PLACEHOLDER
    run = {
        "repository": repository,
        "model_name": model_name,
        "gate": gate,
        "s3_endpoint": s3_endpoint,
        "run_id": run_id,
    }

    def task(op: Any, settings_of: str | None = None, **inputs: Any) -> dsl.PipelineTask:
        """A task of a step that reaches the gate or the replicas: the run's arguments, its step's settings (by
        settings_op's output name), its own inputs, S3's and the Tritons' secrets."""
        given = {**run, **inputs, **({"settings": step[settings_of]} if settings_of else {})}
        return _with_secrets(op(**given), aws_secret_name, admin_secret_name)

    cleanup = task(finish_release_op, replicas=replicas)
    with dsl.ExitHandler(cleanup, name="always-finish-release"):
        published = _with_s3_secret(
            publish_op(
                compiled=compiled,
                repository=repository,
                s3_endpoint=s3_endpoint,
                run_id=run_id,
                settings=step["publish"],
            ),
            aws_secret_name,
        )
        version = published.outputs["version"]
        # the stable version is measured under the name the candidate takes next
        calibrated = task(calibrate_op, "gate").after(published)
        staged = task(stage_op, "load", version=version).after(calibrated)
        judged = task(quality_op, "quality", version=version, stage_result=staged.output)
        tuned = task(tune_op, "tune", version=version, stage_result=staged.output).after(judged)  # one at a time
        gated = task(
            gate_op,
            "gate",
            version=version,
            stage_result=staged.output,
            tuning_json=tuned.outputs["Output"],
            quality_json=judged.outputs["Output"],
        )
        decided = {"version": version, "verdict_json": gated.outputs["verdict_json"]}
        with dsl.If(gated.outputs["verdict"] == "pass", name="verdict-pass"):
            task(promote_op, "promote", **decided, replicas=replicas, tuning_json=tuned.outputs["Output"])
        with dsl.Else(name="verdict-not-pass"):
            task(reject_op, **decided)


# KFP reads a pipeline's parameters from its signature: release_steps' settings parameters are made from RELEASE_STEPS
release_steps = dsl.pipeline(
    name="tritonship-release-steps", description="publish, stage, gate, then promote or reject"
)(
    with_parameters(
        _release_steps,
        [
            inspect.Parameter(f"{s}_settings", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=dict)
            for s in RELEASE_STEPS
        ],
    )
)


def steps_settings(checked: dsl.PipelineTask) -> dict[str, Any]:
    """release_steps' settings arguments from settings_op's task."""
    return {f"{step}_settings": checked.outputs[step] for step in RELEASE_STEPS}


def _compile_task(
    exported: dsl.PipelineTask,
    model_name: str,
    settings: Any,  # settings_op's compile output
    image: Any,  # the compile_image parameter
    gpu_count: int,
    gpu_node_selector: dict,
    gpu_tolerations: list,
) -> dsl.PipelineTask:
    task = compile_op(exported=exported.outputs["exported"], model_name=model_name, settings=settings)
    task.set_container_image(image)
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


def _release_pipeline(
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
    **steps: Any,  # every step's settings, by their pipeline names (STEP)
):
    # checked once, before anything runs; each task then gets its own step's. The spec's text goes beside the
    # dict only into settings_op, which hands it on as the quality settings' (its docstring says why)
    parameters = {n: v for n, v in steps.items() if n != "quality_spec"}
    checked = settings_op(parameters=parameters, quality_spec=steps["quality_spec"])
    exported = _with_s3_secret(
        export_op(
            model_source=model_source, checkpoint=checkpoint, signature=signature, settings=checked.outputs["export"]
        ),
        aws_secret_name,
    ).set_container_image(steps["model_image"])  # the one task that imports the user's code
    compiled = _compile_task(
        exported,
        model_name,
        checked.outputs["compile"],
        steps["compile_image"],
        gpu_count,
        gpu_node_selector,
        gpu_tolerations,
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
        **steps_settings(checked),
    )


def with_step_parameters(body: Callable[..., Any], doc: str) -> Callable[..., Any]:
    """`body` with every step setting that is a pipeline parameter (STEP) as a parameter of its own after body's,
    each parameter's description in the docstring, made from the settings types like the CLI's options."""
    release_pipeline = with_parameters(
        body,
        [
            inspect.Parameter(
                name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=p.default, annotation=p.pipeline_kind
            )
            for name, p in STEP.items()
        ],
    )
    release_pipeline.__doc__ = doc + "".join(f"    {n}: {p.help}\n" for n, p in STEP.items())
    return release_pipeline


# The compiled pipeline carries each parameter's description (the UI shows it).
release_pipeline = dsl.pipeline(name="tritonship-release")(with_step_parameters(_release_pipeline, RELEASE_ARGS))
