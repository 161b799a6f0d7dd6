"""Example: a user's training pipeline that ends by releasing what it trained, through tritonship's release steps
as a sub-pipeline. It trains the demo's BERT4Rec for real (synthetic sessions with structure, on the CPU) and the
release is judged on held-out labelled sessions in S3 (`eval_data`) by the sample's quality spec as well as on
speed. Runs on Kubeflow and under the local runner:

    .venv/bin/python -m pipelines.examples.train_and_release   # local, against the embedded stack
"""

from kfp import dsl
from kfp.dsl import Input, Model, Output

from pipelines.kfp_components import compile_op, settings_op, step
from pipelines.pipeline import release_steps, steps_settings
from pipelines.samples.bert4rec import DYNAMIC_SIGNATURE_JSON, QUALITY_SPEC_TEXT


@step("tools")
def train_op(seed: int, steps: int, trained: Output[Model]):
    """Train the sample recommender on synthetic sessions; save its state_dict with its hit rate@10."""
    from pipelines.samples.bert4rec import training

    model = training.train(seed, steps)
    training.save_checkpoint(model, trained.path)
    trained.metadata["hit_rate_at_10"] = training.hit_rate_at_10(model, training.eval_set(1000, seed=7))


@step("tools")
def export_trained_op(
    trained: Input[Model], model_factory: str, signature: str, settings: dict, exported: Output[Model]
):
    """Export a model artifact from a training pipeline: a state_dict for `model_factory`, or a saved model."""
    import tempfile
    from pathlib import Path

    from components.model.export import export
    from components.release.step_settings import ExportSettings

    chosen = ExportSettings.from_flat(**settings)
    source = Path(trained.path)
    with tempfile.TemporaryDirectory() as tmp:
        signature_path = Path(tmp) / "signature.yaml"
        signature_path.write_text(signature)
        model, checkpoint = (model_factory, str(source)) if model_factory else (str(source), None)
        result = export(
            model,
            signature_path,
            Path(exported.path),
            checkpoint=checkpoint,
            samples=chosen.golden_samples,
            method=chosen.method,
        )
    exported.metadata.update({"method": result.method, "fallback_reason": result.fallback_reason or ""})


@dsl.pipeline(name="train-and-release", description="Train the recommender, then release it with tritonship.")
def train_and_release(
    repository: str,
    s3_endpoint: str,
    replicas: str,
    gate: str,
    eval_data: str,
    model_name: str = "trained-bert4rec",
    steps: int = 1500,  # training.DEFAULT_STEPS
    seed: int = 0,
    aws_secret_name: str = "tritonship-s3",
    admin_secret_name: str = "tritonship-triton-admin",
    max_p99_ms: float = 50.0,
):
    # every other setting at the pipeline's default; compiled on this machine's CPU, not tuned
    checked = settings_op(
        parameters={
            "compile_target": "torchscript",
            "precision": "fp32",
            "compile_device": "cpu",
            "tune": False,
            "max_p99_ms": max_p99_ms,
            "eval_data": eval_data,
        },
        quality_spec=QUALITY_SPEC_TEXT,
    )
    trained = train_op(seed=seed, steps=steps)
    exported = export_trained_op(
        trained=trained.outputs["trained"],
        model_factory="pipelines.samples.bert4rec:demo_v1",
        signature=DYNAMIC_SIGNATURE_JSON,
        settings=checked.outputs["export"],
    )
    compiled = compile_op(
        exported=exported.outputs["exported"], model_name=model_name, settings=checked.outputs["compile"]
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


if __name__ == "__main__":
    import os
    import tempfile
    from pathlib import Path

    from kfp import local

    from pipelines.samples.bert4rec import training
    from pipelines.stack import EmbeddedStack

    with EmbeddedStack(replicas=2, gate=True) as stack:
        os.environ.update(stack.env())
        work = Path(tempfile.mkdtemp())
        training.write_eval(training.eval_set(4000, seed=1000), work / "sessions.parquet")
        stack.s3.client().upload_file(str(work / "sessions.parquet"), stack.bucket, "eval/sessions.parquet")
        local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(work))
        train_and_release(
            repository=f"s3://{stack.bucket}",
            s3_endpoint=stack.s3.endpoint_url,
            replicas=",".join(s.http_url for s in stack.replicas),
            gate=stack.gate.http_url,
            eval_data=f"s3://{stack.bucket}/eval/sessions.parquet",
        )
