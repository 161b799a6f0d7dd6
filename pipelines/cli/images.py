"""`tritonship images`: build the project's images (pipelines/image_build.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from components.errors import TritonshipError
from pipelines.cli.common import app, console, friendly_errors

images_app = typer.Typer(no_args_is_help=True, help="Build the project's container images.")
app.add_typer(images_app, name="images")


@images_app.command("build")
@friendly_errors
def build_cmd(
    local: Annotated[
        bool, typer.Option(help="build on a local Debian base (debootstrap) where the NGC bases cannot be pulled")
    ] = False,
    push: Annotated[bool, typer.Option(help="push each image after building it")] = False,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="write each image's build seconds and MB here")
    ] = None,
) -> None:
    """Build the images images/versions.yaml names, with docker buildx or podman (cached layers reused)."""
    from pipelines.image_build import build_all

    if json_out is not None and (json_out.is_dir() or not json_out.parent.is_dir()):
        raise TritonshipError(f"--json {json_out} must name a file in an existing folder.")
    with console.status("building images") as status:

        def log(line: str) -> None:
            status.update(line)
            console.print(line, highlight=False)

        report = build_all(local, push, log=log)
    if json_out:
        json_out.write_text(json.dumps(report, indent=2) + "\n")
