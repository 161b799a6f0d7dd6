"""`tritonship calibrate`: the gate server's noise for a model, measured and recorded in S3."""

from __future__ import annotations

from typing import Annotated

import typer

from components.settings import DEFAULT_CALIBRATION_ROUNDS, GateSettings
from pipelines.cli.common import (
    EndpointOption,
    GateOption,
    ModelOption,
    RepositoryOption,
    app,
    console,
    friendly_errors,
    one_server,
    s3_settings,
    step_options,
)


@app.command("calibrate")
@friendly_errors
@step_options(GateSettings)
def calibrate_cmd(
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
    from components.release.gate_calibration import budgets, calibrate

    with console.status(f"measuring {rounds} A/A rounds of {model} on the gate server"):
        found = calibrate(repository, model, one_server(gate), gate_settings, rounds, s3_settings(s3_endpoint))
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
