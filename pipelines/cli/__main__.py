"""`python -m pipelines.cli`: the same as the `tritonship` command."""

from pipelines.cli import app

app()
