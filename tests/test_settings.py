"""One source of truth for the gate's settings: components/settings.py's GATE_PARAMETERS names, defaults and
explains every gate setting; the `tritonship gate` options and the compiled pipeline's parameters agree
with it, and "off" is 0 in every form."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer.main
import yaml
from typer.testing import CliRunner

from components.settings import GATE_PARAMETERS, GateSettings, Thresholds
from pipelines.cli import app

COMPILED = Path(__file__).resolve().parents[1] / "pipelines" / "release_pipeline.yaml"


def _cli_gate_options() -> dict[str, object]:
    command = typer.main.get_command(app).commands["gate"]
    return {p.name: p for p in command.params}


def test_cli_gate_options_have_the_settings_names_defaults_and_help():
    options = _cli_gate_options()
    for name, parameter in GATE_PARAMETERS.items():
        assert name in options, name
        assert options[name].default == parameter.default, name
        assert options[name].help == parameter.help, name


def test_pipeline_parameters_have_the_settings_names_defaults_and_descriptions():
    spec = next(yaml.safe_load_all(COMPILED.read_text()))
    parameters = spec["root"]["inputDefinitions"]["parameters"]
    for name, parameter in GATE_PARAMETERS.items():
        assert name in parameters, name
        assert parameters[name].get("defaultValue") == parameter.default, name
        assert parameters[name]["description"] == parameter.help, name
    assert all(p.get("description") for p in parameters.values())  # every parameter is explained in the UI


def test_design_is_a_choice_typer_checks_and_lists():
    runner = CliRunner()
    assert "<duet|alternating>" in runner.invoke(app, ["gate", "--help"], env={"COLUMNS": "200"}).output
    refused = runner.invoke(
        app, ["gate", "-r", "s3://b", "-m", "m", "--version", "1", "--gate", "h:1", "--out", "o", "--design", "both"]
    )
    assert refused.exit_code == 2 and "alternating" in refused.output


def test_flat_settings_round_trip_and_zero_is_off_everywhere():
    defaults = GateSettings()
    assert GateSettings.from_flat() == defaults
    assert GateSettings.from_flat(**defaults.to_flat()) == defaults
    off = GateSettings.from_flat(
        max_p99_ms=0, max_p99_regression_pct=0, request_rate=0, max_throughput_regression_pct=15
    )
    assert off.thresholds == Thresholds(None, None, None, 15.0) and off.request_rate is None
    assert off.to_flat()["max_p99_regression_pct"] == 0.0
    # as KFP hands them over: text, or floats for whole numbers
    assert GateSettings.from_flat(concurrency="2", min_rounds=6.0, budget_s="30").concurrency == 2


@pytest.mark.parametrize(
    ("flat", "message"),
    [
        ({"concurrency": 0}, "concurrency must be at least 1"),
        ({"design": "both"}, "design must be one of duet, alternating"),
        ({"min_rounds": 2}, "min_rounds must be at least 5"),
        ({"window_ms": "fast"}, "window_ms must be a int"),
        ({"max_p99_ms": -1}, "must be positive"),
        ({"rounds": 3}, "no parameter named rounds"),
    ],
)
def test_wrong_settings_are_refused_where_they_are_built(flat, message):
    with pytest.raises(ValueError, match=message):
        GateSettings.from_flat(**flat)
