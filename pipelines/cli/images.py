"""`tritonship images`: build the project's images (pipelines/image_build.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from components.errors import TritonshipError
from pipelines.cli.common import app, console, friendly_errors, out_console_line
from pipelines.images import REGISTRY_ENV

images_app = typer.Typer(no_args_is_help=True, help="Build the project's container images.")
app.add_typer(images_app, name="images")


@images_app.command("build")
@friendly_errors
def build_cmd(
    local: Annotated[
        bool, typer.Option(help="build on a local Debian base (debootstrap) where the NGC bases cannot be pulled")
    ] = False,
    push: Annotated[bool, typer.Option(help="push each image after building it")] = False,
    registry: Annotated[
        str | None,
        typer.Option(
            envvar=REGISTRY_ENV,
            help="registry to tag (and push) the images in, host[:port][/path]; default: images/versions.yaml's",
        ),
    ] = None,
    model_package: Annotated[
        Path | None,
        typer.Option(
            help="build only your model's image instead: the tools image plus this package (a source folder or a "
            "wheel), for the pipeline's model_image"
        ),
    ] = None,
    tag: Annotated[
        str | None, typer.Option(help="the model image's name (default: <registry>/<package>:<version>)")
    ] = None,
    on: Annotated[
        str,
        typer.Option(
            help="the model image's base: tools (for model_image) or compile (for compile_image, needed only where "
            "the model calls operators its package registers)"
        ),
    ] = "tools",
    json_out: Annotated[
        Path | None, typer.Option("--json", help="write each image's build seconds and MB here")
    ] = None,
) -> None:
    """Build the images images/versions.yaml names, with docker buildx or podman (cached layers reused); with
    --model-package, your model's image on the tools image."""
    from pipelines.image_build import build_all, build_model_image

    if json_out is not None and (json_out.is_dir() or not json_out.parent.is_dir()):
        raise TritonshipError(f"--json {json_out} must name a file in an existing folder.")
    if (tag is not None or on != "tools") and model_package is None:
        raise TritonshipError("--tag and --on are for a model image; give --model-package too.")
    with console.status("building images") as status:

        def log(line: str) -> None:
            status.update(line)
            console.print(line, highlight=False)

        if model_package is None:
            report = build_all(local, push, log=log, registry=registry)
        else:
            built, figures = build_model_image(model_package, local, push, registry, tag, log=log, on=on)
            report = {built: figures}
            out_console_line(built)
            console.print(f"release with it: -p {on.replace('tools', 'model')}_image={built}", highlight=False)
    if json_out:
        json_out.write_text(json.dumps(report, indent=2) + "\n")
