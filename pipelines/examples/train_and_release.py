"""Example: a user's training pipeline that ends by releasing what it trained. Training and export run in the
user's image (`model_image`: the project's tools image plus their package, `tritonship images build
--model-package`), where their code is; compile and every later step run in the project's images, on the
self-contained export alone.

By default it trains the demo's BERT4Rec for real (synthetic sessions with structure, on the CPU), judged on
held-out labelled sessions in S3 (`eval_data`) by the sample's quality spec as well as on speed. For your own
model, give `trainer` (`package.module:function`, called as `function(out_path, seed)`: it saves a state_dict for
`model_source`, or a saved model with `model_source` empty, to out_path and returns its metrics), `model_source`,
`signature` and `model_image`. Runs on Kubeflow (docs/guide.md has a recurring run of it) and under the local
runner:

    .venv/bin/python -m pipelines.examples.train_and_release   # local, against the embedded stack
"""

from kfp import dsl
from kfp.dsl import Metrics, Model, Output

from components.settings import DEFAULT_WINDOW_MS, TOOLS_IMAGE
from pipelines.kfp_components import settings_op, step
from pipelines.kfp_model_components import compile_op, export_trained_op
from pipelines.pipeline import release_steps, steps_settings
from pipelines.samples.bert4rec import DYNAMIC_SIGNATURE_JSON, QUALITY_SPEC_TEXT


@step("tools")
def train_op(trainer: str, seed: int, trained: Output[Model], metrics: Output[Metrics]):
    """Run the user's trainer in their image; its metrics go to the run's metrics."""
    from components.errors import refused_in_one_sentence
    from components.model.model_source import load_callable

    with refused_in_one_sentence():
        train = load_callable(trainer, "trainer")
    for name, value in (train(trained.path, seed) or {}).items():
        metrics.log_metric(name, float(value))


@dsl.pipeline(name="train-and-release", description="Train a model in its own image, then release it with tritonship.")
def train_and_release(
    repository: str,
    s3_endpoint: str,
    replicas: str,
    gate: str,
    eval_data: str = "",
    trainer: str = "pipelines.samples.bert4rec.training:train_to",
    model_source: str = "pipelines.samples.bert4rec:demo_v1",
    signature: str = DYNAMIC_SIGNATURE_JSON,
    quality_spec: str = QUALITY_SPEC_TEXT,
    model_image: str = TOOLS_IMAGE,
    model_name: str = "trained-bert4rec",
    seed: int = 0,
    aws_secret_name: str = "tritonship-s3",
    admin_secret_name: str = "tritonship-triton-admin",
    max_p99_ms: float = 50.0,
    window_ms: int = DEFAULT_WINDOW_MS,  # the gate's measured window: shorter decides a small model sooner
):
    # every other setting at the pipeline's default; compiled on this machine's CPU, not tuned
    checked = settings_op(
        parameters={
            "compile_target": "torchscript",
            "precision": "fp32",
            "compile_device": "cpu",
            "tune": False,
            "max_p99_ms": max_p99_ms,
            "window_ms": window_ms,
            "eval_data": eval_data,
            "model_image": model_image,
        },
        quality_spec=quality_spec,
    )
    trained = train_op(trainer=trainer, seed=seed).set_container_image(model_image)
    exported = export_trained_op(
        trained=trained.outputs["trained"],
        model_source=model_source,
        signature=signature,
        settings=checked.outputs["export"],
    ).set_container_image(model_image)
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
