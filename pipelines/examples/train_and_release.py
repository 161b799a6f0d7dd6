"""Example: a user's training pipeline that ends by releasing what it trained, through tritonship's
release steps as a sub-pipeline. Runs on Kubeflow and under the local runner:

    .venv/bin/python -m pipelines.examples.train_and_release   # local, against the embedded stack
"""

from kfp import dsl
from kfp.dsl import Model, Output

from pipelines.images import image
from pipelines.kfp_components import compile_op, export_trained_op, settings_op
from pipelines.pipeline import release_steps
from pipelines.sample_models import SAMPLE_SIGNATURE


@dsl.component(base_image=image("tools"))
def train_op(steps: int, seed: int, trained: Output[Model]):
    """Fit the sample model to a synthetic teacher for a few steps; save its state_dict."""
    import torch

    from pipelines.sample_models import sample_v1

    torch.manual_seed(seed)
    model, teacher = sample_v1().train(), torch.nn.Linear(32, 8)
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        x = torch.randn(64, 32)
        loss = torch.nn.functional.mse_loss(model(x), teacher(x).detach())
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    torch.save(model.state_dict(), trained.path)
    trained.metadata["final_loss"] = float(loss)


@dsl.pipeline(name="train-and-release", description="Train the sample model, then release it with tritonship.")
def train_and_release(
    repository: str,
    s3_endpoint: str,
    replicas: str,
    gate: str,
    model_name: str = "trained-sample",
    steps: int = 50,
    seed: int = 0,
    aws_secret_name: str = "tritonship-s3",
    admin_secret_name: str = "tritonship-triton-admin",
    max_p99_ms: float = 50.0,
):
    # every other setting at the pipeline's default; compiled on this machine's CPU, not tuned
    checked = settings_op(
        flat={
            "compile_target": "torchscript",
            "precision": "fp32",
            "compile_device": "cpu",
            "tune": False,
            "max_p99_ms": max_p99_ms,
        }
    )
    trained = train_op(steps=steps, seed=seed)
    exported = export_trained_op(
        trained=trained.outputs["trained"],
        model_factory="pipelines.sample_models:sample_v1",
        signature=SAMPLE_SIGNATURE,
        settings=checked.output,
    )
    compiled = compile_op(exported=exported.outputs["exported"], model_name=model_name, settings=checked.output)
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


if __name__ == "__main__":
    import tempfile
    from pathlib import Path

    from kfp import local

    from pipelines.stack import EmbeddedStack

    with EmbeddedStack(replicas=2, gate=True) as stack:
        import os

        os.environ.update(stack.env())
        local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(Path(tempfile.mkdtemp())))
        train_and_release(
            repository=f"s3://{stack.bucket}",
            s3_endpoint=stack.s3.endpoint_url,
            replicas=",".join(s.http_url for s in stack.replicas),
            gate=stack.gate.http_url,
        )
