"""`tritonship stage|tune|gate|promote|reject|reconcile`: a published candidate through the gate."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from components import log, settings
from components.errors import TritonshipError
from components.settings import DEFAULT_INSTANCE_COUNTS, GATE_PARAMETERS, RELAXED_STABILITY_PCT
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
    one_server,
    out,
    out_console_line,
    read_result,
    s3_settings,
    validated_gate_settings,
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
def stage_cmd(
    repository: RepositoryOption,
    model: ModelOption,
    version: VersionOption,
    gate: GateOption,
    result: Annotated[Path | None, typer.Option(help="write the stage result (JSON) here")] = None,
    s3_endpoint: EndpointOption = None,
) -> None:
    """Load the candidate dark on the gate server and check its answers against the golden outputs."""
    from components.parity import parity_table
    from components.stage import stage

    with lease_given_back_on_failure(repository, model, version, s3_endpoint) as succeeded:
        with console.status(f"loading {model} v{version} on the gate"):
            staged = stage(repository, model, version, one_server(gate), s3=s3_settings(s3_endpoint))
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


def _counts(text: str, option: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(part) for part in text.split(","))
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise typer.BadParameter(
            f"give whole numbers of 1 or more, comma-separated (like 1,2,4), not {text!r}", param_hint=option
        )
    return counts


@app.command("tune")
@friendly_errors
def tune_cmd(
    repository: RepositoryOption,
    model: ModelOption,
    version: VersionOption,
    gate: GateOption,
    out_file: Annotated[Path, typer.Option("--out", help="write the tuning result (JSON) here")],
    concurrency: Annotated[
        int, typer.Option(help="perf_analyzer concurrency (use the gate's)")
    ] = settings.DEFAULT_CONCURRENCY,
    window_ms: Annotated[int, typer.Option(help="perf_analyzer measurement window")] = settings.DEFAULT_WINDOW_MS,
    stability_pct: Annotated[
        float, typer.Option(help="perf_analyzer stability threshold, %; the default takes any three windows")
    ] = RELAXED_STABILITY_PCT,
    max_p99_ms: Annotated[
        float | None, typer.Option(help="p99 limit; default: the default settings' p99 + slack")
    ] = None,
    p99_slack_pct: Annotated[
        float, typer.Option(help="how much p99 may grow over the default's")
    ] = settings.DEFAULT_TUNE_P99_SLACK_PCT,
    budget: Annotated[int, typer.Option(help="settings measured at most")] = settings.DEFAULT_TUNE_BUDGET,
    min_gain_pct: Annotated[
        float, typer.Option(help="smallest throughput gain that moves the search")
    ] = settings.DEFAULT_TUNE_MIN_GAIN_PCT,
    instance_counts: Annotated[
        str,
        typer.Option(help="instance counts tried, comma-separated, for the model and for an ensemble's pre/post steps"),
    ] = ",".join(map(str, DEFAULT_INSTANCE_COUNTS)),
    intra_op_threads: Annotated[
        str,
        typer.Option(help="the PyTorch backend's intra-op thread counts tried, comma-separated (CPU models)"),
    ] = ",".join(map(str, settings.DEFAULT_INTRA_OP_THREAD_COUNTS)),
    gate_metrics: GateMetricsOption = None,
    s3_endpoint: EndpointOption = None,
) -> None:
    """Search the candidate's serving settings on the gate server (config override; S3 untouched)."""
    from rich.table import Table

    from components import report
    from components.perf import LoadSettings
    from components.tune import TuneSettings, tune

    tune_settings = TuneSettings(
        load=LoadSettings(concurrency=concurrency, window_ms=window_ms, stability_pct=stability_pct),
        max_p99_ms=max_p99_ms,
        p99_slack_pct=p99_slack_pct,
        budget=budget,
        min_gain_pct=min_gain_pct,
        instance_counts=_counts(instance_counts, "--instance-counts"),
        intra_op_thread_counts=_counts(intra_op_threads, "--intra-op-threads"),
    )
    with console.status(f"tuning {model} v{version} on the gate (at most {budget} settings)"):
        url, metrics_url = gate_server(gate, gate_metrics)
        result = tune(
            repository, model, version, url, tune_settings, s3=s3_settings(s3_endpoint), metrics_url=metrics_url
        )
    out_file.write_text(result.to_json())
    table = Table(*report.TUNING_HEADER)
    for row in report.tuning_rows(json.loads(result.to_json())):
        table.add_row(*row)
    out.print(table)
    out_console_line(f"chosen: {result.chosen} ({result.settings_measured} of {result.grid_size} settings measured)")
    if result.confirmation:
        out_console_line(f"the search's winner, {result.confirmation}")


def _gate_option(name: str) -> Any:
    """A `gate` option named, defaulted and explained by components/settings.py's GATE_PARAMETERS."""
    return typer.Option(help=GATE_PARAMETERS[name].help)


@app.command("gate")
@friendly_errors
def gate_cmd(
    repository: RepositoryOption,
    model: ModelOption,
    version: VersionOption,
    gate: GateOption,
    out: Annotated[Path, typer.Option(help="folder for verdict.json, report.md/html, the plot and raw CSVs")],
    stage_result: Annotated[Path | None, typer.Option(help="the stage result JSON (its accuracy check counts)")] = None,
    concurrency: Annotated[int, _gate_option("concurrency")] = settings.DEFAULT_CONCURRENCY,
    request_rate: Annotated[float, _gate_option("request_rate")] = 0.0,
    window_ms: Annotated[int, _gate_option("window_ms")] = settings.DEFAULT_WINDOW_MS,
    design: Annotated[settings.Design, _gate_option("design")] = settings.DEFAULT_DESIGN,
    min_rounds: Annotated[int, _gate_option("min_rounds")] = settings.DEFAULT_MIN_ROUNDS,
    budget_s: Annotated[float, _gate_option("budget_s")] = settings.DEFAULT_BUDGET_S,
    max_p99_ms: Annotated[float, _gate_option("max_p99_ms")] = 0.0,
    min_throughput: Annotated[float, _gate_option("min_throughput")] = 0.0,
    max_p99_regression_pct: Annotated[
        float, _gate_option("max_p99_regression_pct")
    ] = settings.DEFAULT_MAX_REGRESSION_PCT,
    max_throughput_regression_pct: Annotated[
        float, _gate_option("max_throughput_regression_pct")
    ] = settings.DEFAULT_MAX_REGRESSION_PCT,
    tuning: TuningOption = None,
    gate_metrics: GateMetricsOption = None,
    s3_endpoint: EndpointOption = None,
) -> None:
    """Measure candidate against stable with perf_analyzer and decide pass / fail / inconclusive. Exit 0 only on pass."""
    from components import gate as gate_step
    from components.results import StageResult, TuneResult

    given = locals()
    gate_settings = validated_gate_settings({name: given[name] for name in GATE_PARAMETERS})
    staged = read_result(stage_result, "stage result", StageResult) if stage_result else None
    tuned = read_result(tuning, "tuning result", TuneResult) if tuning else None
    with lease_given_back_on_failure(repository, model, version, s3_endpoint) as succeeded:
        with console.status(f"measuring {model} v{version} against stable (at most {budget_s:g} s)"):
            url, metrics_url = gate_server(gate, gate_metrics)
            result = gate_step.gate(
                repository,
                model,
                version,
                url,
                gate_settings,
                staged,
                out,
                s3=s3_settings(s3_endpoint),
                tuning=tuned,
                metrics_url=metrics_url,
            )
        if (out / "report.md").exists():
            out_console_line((out / "report.md").read_text())
        out_console_line(f"verdict: {result.verdict}")
        if result.verdict != "pass":
            raise typer.Exit(1)
        succeeded.append(True)


@app.command("promote")
@friendly_errors
def promote_cmd(
    repository: RepositoryOption,
    verdict: Annotated[Path, typer.Option(help="verdict.json written by `tritonship gate`; must say pass")],
    replicas: Annotated[str, typer.Option(help="production replicas: host:port,... or k8s://ns/selector")],
    gate: UnloadGateOption = None,
    tuning: TuningOption = None,
    s3_endpoint: EndpointOption = None,
) -> None:
    """Roll the gated candidate out to every production replica, one at a time; revert on any failure."""
    from components.promote import promote
    from components.replicas import resolve
    from components.results import TuneResult, Verdict

    decided = read_result(verdict, "verdict", Verdict)
    targets = resolve(replicas)
    serving = read_result(tuning, "tuning result", TuneResult).chosen if tuning else None
    with console.status(f"promoting {decided.model} v{decided.version} to {len(targets)} replicas") as status:
        result = promote(
            repository,
            decided.model,
            decided.version,
            targets,
            decided.verdict,
            gate_url=one_server(gate) if gate else None,
            settings=serving,
            s3=s3_settings(s3_endpoint),
            progress=lambda what, replica: status.update(f"{what} {replica.name}"),
        )
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
    from components.promote import reject
    from components.results import Verdict

    decided = read_result(verdict, "verdict", Verdict)
    reject(
        repository,
        decided.model,
        decided.version,
        decided.verdict,
        decided.reasons,
        gate_url=one_server(gate) if gate else None,
        s3=s3_settings(s3_endpoint),
    )
    out_console_line(f"rejected {decided.model} v{decided.version} ({decided.verdict}); production unchanged")


@app.command("reconcile")
@friendly_errors
def reconcile_cmd(
    repository: RepositoryOption,
    replicas: Annotated[str, typer.Option(help="production replicas: host:port,... or k8s://ns/selector")],
    model: Annotated[list[str] | None, typer.Option("--model", "-m", help="only these models (repeat)")] = None,
    dry_run: Annotated[bool, typer.Option(help="only report what differs")] = False,
    s3_endpoint: EndpointOption = None,
) -> None:
    """Make every production replica serve the desired state in S3; exit 1 if any replica does not."""
    from rich.table import Table

    from components.reconcile import reconcile
    from components.replicas import resolve
    from components.triton_admin import TritonAdmin

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
