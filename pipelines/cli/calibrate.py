"""`tritonship calibrate gate|quality`: what an equally good candidate looks like, measured and recorded in S3 (the
gate server's noise for a model; how much a model's metrics move between retrains)."""

from __future__ import annotations

from typing import Annotated

import typer

from components.release.quality.spec import QualitySettings
from components.settings import DEFAULT_CALIBRATION_ROUNDS, GateSettings
from pipelines.cli.common import (
    EndpointOption,
    GateOption,
    ModelOption,
    RepositoryOption,
    app,
    console,
    friendly_errors,
    gate_server,
    s3_settings,
    step_options,
)

calibrate_app = typer.Typer(
    no_args_is_help=True, help="Measure what an equally good candidate looks like; the gate and quality step read it."
)
app.add_typer(calibrate_app, name="calibrate")


@calibrate_app.command("gate")
@friendly_errors
@step_options(GateSettings)
def calibrate_gate_cmd(
    repository: RepositoryOption,
    model: ModelOption,
    gate: GateOption,
    rounds: Annotated[
        int, typer.Option(min=5, help="A/A rounds: the stable version against its own published copy")
    ] = DEFAULT_CALIBRATION_ROUNDS,
    *,
    gate_settings: GateSettings,
    s3_endpoint: EndpointOption = None,
) -> None:
    """Measure an equal candidate's noise on the gate server (the stable version against itself, as the gate measures)
    and record it in S3; say which limits the gate's budget can decide there. The gate then reads it."""
    from components.release.gate.calibration import budgets, calibrate
    from components.release.run_context import RunContext

    with console.status(f"measuring {rounds} A/A rounds of {model} on the gate server"):
        context = RunContext(repository, model, gate=gate_server(gate), s3=s3_settings(s3_endpoint))
        found = calibrate(context, gate_settings, rounds=rounds)
    console.print(
        f"{model} v{found.version} on {found.gate}: {found.rounds} rounds of {found.round_seconds:.1f} s after "
        f"{found.setup_seconds:.1f} s of loading; round-to-round spread (log SD) p99 {found.p99_log_sd:.3f}, "
        f"throughput {found.throughput_log_sd:.3f}",
        highlight=False,
    )
    for name, reach in found.decidable_pct.items():
        console.print(f"  within the {found.budget_s:g} s budget the gate decides {name} limits of {reach:g}% or more")
    limits = {"p99": gate_settings.thresholds.max_p99_regression_pct}
    limits["throughput"] = gate_settings.thresholds.max_throughput_regression_pct
    for name, needed in budgets(found, gate_settings).items():
        decided = f"in about {needed:.0f} s" if needed else "in no budget"
        console.print(f"  the {name} limit of {limits[name]:g}% is decided {decided}", highlight=False)
    console.print(f"recorded in {found.uri}", highlight=False)


@calibrate_app.command("quality")
@friendly_errors
@step_options(QualitySettings)
def calibrate_quality_cmd(
    repository: RepositoryOption,
    model: ModelOption,
    gate: GateOption,
    versions: Annotated[
        str, typer.Option(help="published retrains of the model, equally good (other seeds): comma-separated versions")
    ],
    chosen: QualitySettings,
    s3_endpoint: EndpointOption = None,
) -> None:
    """Measure how much each metric of the quality spec moves between retrains of the model on the labelled data,
    and record it in S3; the quality step then lets a metric without limits of its own drop that much."""
    from components.errors import TritonshipError
    from components.release.quality.calibration import MIN_RETRAINS, calibrate_quality
    from components.release.run_context import RunContext

    if not chosen.enabled:
        raise TritonshipError("give --eval-data (labelled rows) and --quality-spec (the metrics to calibrate).")
    try:
        numbers = [int(v) for v in versions.split(",") if v.strip()]
    except ValueError:
        raise TritonshipError(f"--versions takes version numbers separated by commas, not {versions!r}.") from None
    with console.status(f"sending the labelled rows through {len(numbers)} retrains of {model} on the gate server"):
        context = RunContext(repository, model, gate=gate_server(gate), s3=s3_settings(s3_endpoint))
        found = calibrate_quality(context, chosen, numbers)
    console.print(
        f"{model}: {len(found.versions)} retrains (v{', v'.join(map(str, found.versions))}) on {found.rows:,} rows",
        highlight=False,
    )
    for name, v in found.metrics.items():
        console.print(
            f"  {name}: values {', '.join(f'{x:.4f}' for x in v.values)}; spread {v.sd_pct:.2f}% of its mean; an "
            f"equally good retrain stays within a drop of {v.max_drop_pct:g}%",
            highlight=False,
        )
    if len(found.versions) < 2 * MIN_RETRAINS:
        console.print(
            f"  (with fewer than {2 * MIN_RETRAINS} retrains the limits are wide: measure more to tighten them)"
        )
    console.print(f"recorded in {found.uri}", highlight=False)
