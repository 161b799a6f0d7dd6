"""One home for every default: components/settings.py names the gate's settings (GATE_PARAMETERS: names, defaults,
help) and every other step's defaults; the `tritonship` options, the compiled pipeline's parameters and the
steps agree with it, and "off" is 0 in every form."""

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


def _cli_defaults(*command: str) -> dict[str, object]:
    group = typer.main.get_command(app)
    for name in command:
        group = group.commands[name]
    return {p.name: p.default for p in group.params}


def _pipeline_defaults() -> dict[str, object]:
    spec = next(yaml.safe_load_all(COMPILED.read_text()))
    return {n: p.get("defaultValue") for n, p in spec["root"]["inputDefinitions"]["parameters"].items()}


def test_every_steps_defaults_have_one_home_that_the_cli_the_pipeline_and_the_step_read():
    import inspect

    from components import settings
    from components.compile import compile_model
    from components.export import export
    from components.perf import LoadSettings
    from components.repository.maintenance import Maintenance
    from components.tune import TuneSettings

    pipeline = _pipeline_defaults()
    # export
    assert _cli_defaults("export")["samples"] == settings.DEFAULT_GOLDEN_SAMPLES == pipeline["golden_samples"]
    assert inspect.signature(export).parameters["samples"].default == settings.DEFAULT_GOLDEN_SAMPLES
    # compile: the CLI and the step on this machine; the pipeline on a GPU node, on purpose
    step = inspect.signature(compile_model).parameters
    cli = _cli_defaults("compile")
    assert cli["target"] == step["target"].default == settings.DEFAULT_TARGET
    assert cli["precision"] == step["precision"].default == settings.DEFAULT_PRECISION
    assert cli["device"] == step["device"].default == settings.DEFAULT_COMPILE_DEVICE
    assert pipeline["compile_target"] == settings.PIPELINE_TARGET
    assert pipeline["precision"] == settings.PIPELINE_PRECISION
    assert pipeline["compile_device"] == settings.PIPELINE_COMPILE_DEVICE
    # tune: at the gate's load by default
    tune, cli = TuneSettings(), _cli_defaults("tune")
    assert cli["budget"] == tune.budget == settings.DEFAULT_TUNE_BUDGET == pipeline["tune_budget"]
    assert cli["concurrency"] == tune.load.concurrency == settings.DEFAULT_CONCURRENCY == pipeline["concurrency"]
    assert cli["window_ms"] == tune.load.window_ms == LoadSettings().window_ms == settings.DEFAULT_WINDOW_MS
    assert cli["p99_slack_pct"] == tune.p99_slack_pct == settings.DEFAULT_TUNE_P99_SLACK_PCT
    assert cli["min_gain_pct"] == tune.min_gain_pct == settings.DEFAULT_TUNE_MIN_GAIN_PCT
    assert cli["instance_counts"] == ",".join(map(str, tune.instance_counts))
    assert cli["intra_op_threads"] == ",".join(map(str, tune.intra_op_thread_counts))
    # repo gc
    grace = inspect.signature(Maintenance.gc).parameters["grace_seconds"].default
    assert _cli_defaults("repo", "gc")["grace"] == grace == settings.DEFAULT_CLEANUP_GRACE_S
