"""The KFP components that take the user's model: export (in the pipeline, and as a training pipeline's last
step) and compile. Export runs in `model_image`, compile in `compile_image` (set_container_image); the user's
code is needed in export only (docs/guide.md, "Your model's code")."""

from kfp.dsl import Input, Metrics, Model, Output

from pipelines.kfp_components import step


@step("tools")
def export_op(model_source: str, checkpoint: str, signature: str, settings: dict, exported: Output[Model]):
    """Load the user's model, check it against the signature, export it with golden samples. The task runs in
    model_image, after installing model_packages; a model that cannot be imported is one sentence, no traceback."""
    from pathlib import Path

    from components.errors import refused_in_one_sentence
    from components.model.export_task import export_in_task
    from components.model.settings import ExportSettings

    chosen = ExportSettings.from_dict(settings)
    with refused_in_one_sentence():
        result = export_in_task(model_source, signature, Path(exported.path), chosen, checkpoint or None)
    exported.metadata.update({"method": result.method, "fallback_reason": result.fallback_reason or ""})


@step("tools")
def export_trained_op(
    trained: Input[Model], model_source: str, signature: str, settings: dict, exported: Output[Model]
):
    """A training pipeline's last step, run in its own image (set_container_image): the trained model exported for
    the release, self-contained (pipelines/examples/train_and_release.py). `trained` is a state_dict for the
    factory `model_source`, or (`model_source` empty) a saved TorchScript or ExportedProgram file."""
    from pathlib import Path

    from components.errors import refused_in_one_sentence
    from components.model.export_task import export_in_task
    from components.model.settings import ExportSettings

    chosen = ExportSettings.from_dict(settings)
    model, checkpoint = (model_source, trained.path) if model_source else (trained.path, None)
    with refused_in_one_sentence():
        result = export_in_task(model, signature, Path(exported.path), chosen, checkpoint)
    exported.metadata.update({"method": result.method, "fallback_reason": result.fallback_reason or ""})


@step("compile")
def compile_op(
    exported: Input[Model],
    model_name: str,
    settings: dict,
    compiled: Output[Model],
    parity: Output[Metrics],
):
    """Compile for Triton and check parity against the eager model; fails the run on a mismatch."""
    from pathlib import Path

    from components.errors import refused_in_one_sentence
    from components.model.compile import compile_model
    from components.model.settings import CompileSettings

    chosen = CompileSettings.from_dict(settings)
    with refused_in_one_sentence():
        result = compile_model(Path(exported.path), Path(compiled.path), model_name, chosen)
    for row in result.parity:
        parity.log_metric(f"{row.name}.{row.check}.max_abs_err", row.max_abs_err)
    parity.log_metric("compile_seconds", round(result.seconds, 3))
    compiled.metadata.update({"target": chosen.target, "precision": chosen.precision, "device": result.device})
