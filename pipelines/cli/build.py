"""`tritonship export|compile|ensemble|publish`: from a trained model to a published candidate version."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from components.model.settings import CompileSettings, ExportSettings
from components.release.publish import PublishSettings
from pipelines.cli.common import (
    EndpointOption,
    RepositoryOption,
    app,
    console,
    friendly_errors,
    out_console_line,
    s3_settings,
    step_options,
)


# ------------------------------------------------------------------------------------ export / compile
@app.command("export")
@friendly_errors
@step_options(ExportSettings)
def export_cmd(
    model: Annotated[str, typer.Option(help="package.module:factory, a TorchScript file or an ExportedProgram .pt2")],
    signature: Annotated[Path, typer.Option(help="the I/O signature (YAML or JSON)")],
    out: Annotated[Path, typer.Option(help="output folder (must not exist)")],
    checkpoint: Annotated[str | None, typer.Option(help="state_dict for the factory's model: a path or s3://")] = None,
    golden: Annotated[Path | None, typer.Option(help=".npz of golden inputs keyed by input name")] = None,
    *,
    chosen: ExportSettings,
) -> None:
    """Load a model, check it against its signature, export it with golden samples (or the --golden ones)."""
    from components.model.export import export
    from components.model.model_packages import install_model_packages

    if chosen.model_packages.strip():
        with console.status(f"installing {chosen.model_packages}"):
            install_model_packages(chosen.model_packages)
    result = export(model, signature, out, chosen, checkpoint=checkpoint, golden=golden)
    out_console_line(f"exported with {result.method} to {result.out_dir / result.artifact}")
    if result.fallback_reason:
        out_console_line(f"  (fell back: {result.fallback_reason})")


@app.command("compile")
@friendly_errors
@step_options(CompileSettings)
def compile_cmd(
    export_dir: Annotated[Path, typer.Argument(help="the output folder of `tritonship export`")],
    name: Annotated[str, typer.Option(help="the Triton model name")],
    out: Annotated[Path, typer.Option(help="output model folder (must not exist)")],
    chosen: CompileSettings,
) -> None:
    """Compile an export for Triton, check parity against the eager model, write the model folder."""
    from components.model.compile import compile_model, parity_table

    with console.status(f"compiling for {chosen.target} ({chosen.precision}, {chosen.device})"):
        result = compile_model(export_dir, out, name, chosen)
    out_console_line(parity_table(result.parity))
    out_console_line(
        f"compiled {chosen.target}/{chosen.precision} on {result.device} in {result.seconds:.1f} s -> {result.out_dir}"
    )


@app.command("publish")
@friendly_errors
@step_options(PublishSettings)
def publish_cmd(
    folder: Annotated[Path, typer.Argument(help="the output folder of `tritonship compile` or `ensemble` (a bundle)")],
    repository: RepositoryOption,
    run_id: Annotated[
        str | None, typer.Option(help="source run id (default: KFP_RUN_ID, else from the content)")
    ] = None,
    s3_endpoint: EndpointOption = None,
    *,
    chosen: PublishSettings,
) -> None:
    """Publish a compiled model folder (or an ensemble bundle) as a new immutable candidate version (staging)."""
    from components.release.publish import publish
    from components.release.run_context import RunContext

    with console.status("publishing"):
        context = RunContext(repository, "", s3=s3_settings(s3_endpoint), run_id=run_id or "")  # the folder's model
        result = publish(context, chosen, folder=folder)
    verb = "already published as" if result.resumed else "published"
    out_console_line(f"{verb} {result.model} version {result.version} -> {result.uri}")


@app.command("ensemble")
@friendly_errors
def ensemble_cmd(
    compiled: Annotated[Path, typer.Argument(help="the output folder of `tritonship compile`")],
    name: Annotated[str, typer.Option(help="the ensemble's name (what clients call)")],
    signature: Annotated[Path, typer.Option(help="the ensemble's I/O signature (YAML/JSON)")],
    model: Annotated[str, typer.Option(help="the eager model for the reference: pkg.mod:factory or a file")],
    pre: Annotated[
        Path,
        typer.Option(help="preprocessing: a folder with step.py and the files it reads, or a compiled model folder"),
    ],
    post: Annotated[
        Path,
        typer.Option(help="postprocessing: a folder with step.py and the files it reads, or a compiled model folder"),
    ],
    inputs: Annotated[Path, typer.Option(help="golden ensemble inputs: .npz with one array per input")],
    out: Annotated[Path, typer.Option(help="the bundle folder to write")],
    pre_signature: Annotated[Path | None, typer.Option(help="a step.py preprocessing's I/O signature")] = None,
    post_signature: Annotated[Path | None, typer.Option(help="a step.py postprocessing's I/O signature")] = None,
    checkpoint: Annotated[str | None, typer.Option(help="state_dict for the factory (local or s3://)")] = None,
) -> None:
    """Assemble a release bundle: the compiled model, its pre/post-processing steps and the ensemble that
    chains them, with reference outputs computed in Python from the same step code and the eager model. A
    step compiled to TorchScript (`tritonship compile` of an nn.Module) is served by the PyTorch backend,
    with no Python process between the steps."""
    import numpy as np

    from components.model.ensemble import assemble, step_at
    from components.model.model_source import load_model
    from components.model.signature import Signature

    with np.load(inputs, allow_pickle=False) as data:
        golden = {k: data[k] for k in data.files}
    pre_name, post_name = f"{name}_pre", f"{name}_post"
    with console.status("running the reference and writing the bundle"):
        assemble(
            out,
            name,
            Signature.load(signature),
            compiled,
            step_at(pre_name, pre, pre_signature),
            step_at(post_name, post, post_signature),
            load_model(model, checkpoint),
            golden,
        )
    out_console_line(f"wrote the {name} bundle ({pre_name} -> {compiled.name} -> {post_name}) to {out}")
