"""`tritonship stage|tune|gate|promote|reject|reconcile`: a published candidate through the gate."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer

from components import log
from components.errors import TritonshipError
from components.release.promote.settings import PromoteSettings
from components.release.stage import ModelLoadSettings
from components.release.tune.settings import TuneSettings
from components.settings import GateSettings
from pipelines.cli.common import (
    EndpointOption,
    GateMetricsOption,
    GateOption,
    ModelOption,
    RepositoryOption,
    UnloadGateOption,
    VersionOption,
    app,
    console,
    friendly_errors,
    gate_server,
    out,
    out_console_line,
    read_result,
    s3_settings,
    step_options,
)


@contextlib.contextmanager
def lease_given_back_on_failure(
    repository: str, model: str, version: int, endpoint: str | None
) -> Iterator[list[bool]]:
    """A stage or gate run by hand that fails gives its release lease back (a pipeline run's exit handler does
    this for runs): the next release need not wait an hour for it. The body appends True when it succeeded."""
    succeeded: list[bool] = []
    try:
        yield succeeded
    finally:
        if not succeeded:
            from components.repository import ModelRepository, lease_owner

            try:
                ModelRepository(repository, s3_settings(endpoint)).release_lease(model, lease_owner("", model, version))
            except TritonshipError as exc:  # the failure itself is what the user must see; the lease expires
                log.event(log.get("cli"), "lease not given back", model=model, reason=str(exc), level=30)


@app.command("stage")
@friendly_errors
@step_options(ModelLoadSettings)
def stage_cmd(
    repository: RepositoryOption,
    model: ModelOption,
    version: VersionOption,
    gate: GateOption,
    result: Annotated[Path | None, typer.Option(help="write the stage result (JSON) here")] = None,
    *,
    loading: ModelLoadSettings,
    s3_endpoint: EndpointOption = None,
) -> None:
    """Load the candidate dark on the gate server and check its answers against the golden outputs."""
    from components.model.parity import parity_table
    from components.release.run_context import RunContext
    from components.release.stage import stage

    with lease_given_back_on_failure(repository, model, version, s3_endpoint) as succeeded:
        with console.status(f"loading {model} v{version} on the gate"):
            context = RunContext(repository, model, version, gate_server(gate), s3_settings(s3_endpoint))
            staged = stage(context, loading)
        if staged.load_error:
            raise TritonshipError(f"the gate server could not load the candidate: {staged.load_error}")
        out_console_line(parity_table(staged.accuracy))
        if result:
            result.write_text(staged.to_json())
        out_console_line(
            f"staged {staged.candidate} v{version} on {staged.gate_url}: "
            f"accuracy {'ok' if staged.accuracy_passed else 'FAILED'}"
        )
        if not staged.accuracy_passed:
            raise typer.Exit(1)
        succeeded.append(True)


TuningOption = Annotated[Path | None, typer.Option(help="tuning.json written by `tritonship tune`")]


@app.command("tune")
@friendly_errors
@step_options(TuneSettings)
def tune_cmd(
    repository: RepositoryOption,
    model: ModelOption,
    version: VersionOption,
    gate: GateOption,
    out_file: Annotated[Path, typer.Option("--out", help="write the tuning result (JSON) here")],
    tune_settings: TuneSettings,
    gate_metrics: GateMetricsOption = None,
    s3_endpoint: EndpointOption = None,
) -> None:
    """Search the candidate's serving settings on the gate server (config override; S3 untouched)."""
    from rich.table import Table

    from components.release.gate import report as gate_report
    from components.release.run_context import RunContext
    from components.release.tune.tune import tune

    with console.status(f"tuning {model} v{version} on the gate (at most {tune_settings.budget} settings)"):
        context = RunContext(repository, model, version, gate_server(gate, gate_metrics), s3_settings(s3_endpoint))
        result = tune(context, tune_settings)
    out_file.write_text(result.to_json())
    table = Table(*gate_report.TUNING_HEADER)
    for row in gate_report.tuning_rows(json.loads(result.to_json())):
        table.add_row(*row)
    out.print(table)
    out_console_line(f"chosen: {result.chosen} ({result.settings_measured} of {result.grid_size} settings measured)")
    if result.confirmation:
        out_console_line(f"the search's winner, {result.confirmation}")


@app.command("gate")
@friendly_errors
@step_options(GateSettings)
def gate_cmd(
    repository: RepositoryOption,
    model: ModelOption,
    version: VersionOption,
    gate: GateOption,
    out: Annotated[Path, typer.Option(help="folder for verdict.json, report.md/html, the plot and raw CSVs")],
    stage_result: Annotated[Path | None, typer.Option(help="the stage result JSON (its accuracy check counts)")] = None,
    *,
    gate_settings: GateSettings,
    tuning: TuningOption = None,
    quality: Annotated[
        Path | None, typer.Option(help="quality.json written by `tritonship quality`: the verdict is both's")
    ] = None,
    gate_metrics: GateMetricsOption = None,
    s3_endpoint: EndpointOption = None,
) -> None:
    """Measure candidate against stable with perf_analyzer and decide pass / fail / inconclusive. Exit 0 only on pass."""
    from components.release.gate import gate as gate_step
    from components.release.results import QualityResult, StageResult, TuneResult
    from components.release.run_context import RunContext

    staged = read_result(stage_result, "stage result", StageResult) if stage_result else None
    tuned = read_result(tuning, "tuning result", TuneResult) if tuning else None
    judged = read_result(quality, "quality result", QualityResult) if quality else None
    with lease_given_back_on_failure(repository, model, version, s3_endpoint) as succeeded:
        with console.status(f"measuring {model} v{version} against stable (at most {gate_settings.budget_s:g} s)"):
            context = RunContext(repository, model, version, gate_server(gate, gate_metrics), s3_settings(s3_endpoint))
            result = gate_step.gate(context, gate_settings, staged, out, tuning=tuned, quality=judged)
        if (out / "report.md").exists():
            out_console_line((out / "report.md").read_text())
        out_console_line(f"verdict: {result.verdict}")
        if result.verdict != "pass":
            raise typer.Exit(1)
        succeeded.append(True)


@app.command("promote")
@friendly_errors
@step_options(PromoteSettings)
def promote_cmd(
    repository: RepositoryOption,
    verdict: Annotated[Path, typer.Option(help="verdict.json written by `tritonship gate`; must say pass")],
    replicas: Annotated[
        str,
        typer.Option(
            envvar="TRITONSHIP_REPLICAS", help="production replicas: host:port[:metrics-port],... or k8s://ns/selector"
        ),
    ],
    gate: UnloadGateOption = None,
    tuning: TuningOption = None,
    *,
    chosen: PromoteSettings,
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="where the canary's report.md and report.html go")
    ] = None,
    s3_endpoint: EndpointOption = None,
) -> None:
    """Roll the gated candidate out to every production replica, one at a time; revert on any failure.
    With the canary (the default), the first replicas switched are measured against the others on live
    traffic first; exit 1 when it reverts."""
    from components.release.promote import canary_report
    from components.release.promote.canary_report import reverted_by_canary
    from components.release.promote.promote import PromotionError, promote
    from components.release.promote.records import Outcome
    from components.release.results import TuneResult, Verdict
    from components.release.run_context import RunContext
    from components.serving.replicas import resolve

    decided = read_result(verdict, "verdict", Verdict)
    targets = resolve(replicas)
    serving = read_result(tuning, "tuning result", TuneResult).chosen if tuning else None
    server = gate_server(gate) if gate else None  # to unload the candidate from
    context = RunContext(repository, decided.model, decided.version, server, s3_settings(s3_endpoint))
    with console.status(f"promoting {decided.model} v{decided.version} to {len(targets)} replicas") as status:
        result = promote(
            context,
            chosen,
            replicas=targets,
            verdict=decided.verdict,
            quality=decided.quality.decision if decided.quality else None,
            serving=serving,
            progress=lambda what, replica: status.update(f"{what} ({replica.name})"),
        )
    if result.outcome is Outcome.REVERTED:  # by the canary: its report, and exit 1
        if result.canary:
            canary_report.write(result.canary, out_dir)
        raise PromotionError(reverted_by_canary(result), result)
    if result.canary:
        canary_report.write(result.canary, out_dir)
        out_console_line(canary_report.summary(result.canary))
    out_console_line(
        f"promoted {result.model} v{result.version} (was {result.previous_version}) on {len(result.replicas)} replicas"
    )


@app.command("reject")
@friendly_errors
def reject_cmd(
    repository: RepositoryOption,
    verdict: Annotated[Path, typer.Option(help="verdict.json written by `tritonship gate`")],
    gate: UnloadGateOption = None,
    s3_endpoint: EndpointOption = None,
) -> None:
    """Unload the candidate from the gate, leave production untouched, record the verdict."""
    from components.release.promote.promote import reject
    from components.release.results import Verdict
    from components.release.run_context import RunContext

    decided = read_result(verdict, "verdict", Verdict)
    server = gate_server(gate) if gate else None  # to unload the candidate from
    context = RunContext(repository, decided.model, decided.version, server, s3_settings(s3_endpoint))
    reject(context, decided.verdict, decided.reasons)
    out_console_line(f"rejected {decided.model} v{decided.version} ({decided.verdict}); production unchanged")


@app.command("reconcile")
@friendly_errors
def reconcile_cmd(
    repository: RepositoryOption,
    replicas: Annotated[
        str,
        typer.Option(
            envvar="TRITONSHIP_REPLICAS", help="production replicas: host:port[:metrics-port],... or k8s://ns/selector"
        ),
    ],
    model: Annotated[list[str] | None, typer.Option("--model", "-m", help="only these models (repeat)")] = None,
    dry_run: Annotated[bool, typer.Option(help="only report what differs")] = False,
    s3_endpoint: EndpointOption = None,
) -> None:
    """Make every production replica serve the desired state in S3; exit 1 if any replica does not."""
    from rich.table import Table

    from components.release.promote.reconcile import reconcile
    from components.serving.replicas import resolve
    from components.serving.triton_admin import TritonAdmin

    targets = resolve(replicas)
    if not any(TritonAdmin(r.url, timeout=10, retries=1).is_live() for r in targets):
        raise TritonshipError(
            f"no replica answered ({', '.join(r.url for r in targets)}); check the addresses and that Triton runs there."
        )
    states = reconcile(repository, targets, model or None, dry_run, s3_settings(s3_endpoint))
    table = Table("replica", "model", "desired", "was serving", "action")
    for s in states:
        table.add_row(s.replica, s.model, ",".join(map(str, s.desired)), ",".join(map(str, s.serving)) or "-", s.action)
    out.print(table)
    if not all(s.ok for s in states):
        raise typer.Exit(1)
