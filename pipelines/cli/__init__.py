"""`tritonship`: every step is a subcommand, plus the embedded stack, the repository tools and the demo.

One module per command group; importing it registers its commands on `app`."""

import importlib

from pipelines.cli.common import app

for _group in (
    "build",
    "release",
    "calibrate",
    "quality",
    "repository",
    "stack_commands",
    "kubeflow",
    "images",
):  # the order `--help` lists them in
    importlib.import_module(f"pipelines.cli.{_group}")

__all__ = ["app"]
