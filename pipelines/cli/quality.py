"""`tritonship quality`: the candidate against the stable version on labelled data, as the gate serves both."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from components.release.quality.spec import QualitySettings
from pipelines.cli.common import (
    EndpointOption,
    GateOption,
    ModelOption,
    RepositoryOption,
    VersionOption,
    app,
    console,
    friendly_errors,
    gate_server,
    out_console_line,
    s3_settings,
    step_options,
)
from pipelines.cli.release import lease_given_back_on_failure


@app.command("quality")
@friendly_errors
@step_options(QualitySettings)
def quality_cmd(
    repository: RepositoryOption,
    model: ModelOption,
    version: VersionOption,
    gate: GateOption,
    out: Annotated[Path, typer.Option(help="folder for quality.json, quality.md/html and the plot")],
    chosen: QualitySettings,
    s3_endpoint: EndpointOption = None,
) -> None:
    """Send labelled rows to the staged candidate and to stable on the gate, and judge each metric's change.
    Exit 0 only on pass; `tritonship gate --quality` folds the result into the verdict."""
    from components.errors import TritonshipError
    from components.release.quality import report as quality_report
    from components.release.quality.quality import quality
    from components.release.run_context import RunContext

    if not chosen.enabled:
        raise TritonshipError("give --eval-data (labelled rows) and --quality-spec (the metrics and their limits).")
    with (
        lease_given_back_on_failure(repository, model, version, s3_endpoint) as succeeded,
        Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
        ) as bar,
    ):
        task = bar.add_task(f"rows through {model} v{version} and stable", total=None)
        context = RunContext(repository, model, version, gate_server(gate), s3_settings(s3_endpoint))
        result = quality(context, chosen, progress=lambda done, total: bar.update(task, completed=done, total=total))
        bar.stop()
        quality_report.write(result, out)
        out_console_line("\n".join(quality_report.markdown_lines(result)))
        out_console_line(quality_report.summary(result))
        if result.decision != "pass":
            raise typer.Exit(1)
        succeeded.append(True)
