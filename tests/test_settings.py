"""One home for every default: components/settings.py names the gate's settings (GATE_PARAMETERS: names, defaults,
help) and every other step's defaults; the `tritonship` options, the compiled pipeline's parameters and the
steps agree with it, and "off" is 0 in every form."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest
import typer.main
import yaml
from typer.testing import CliRunner

from components import settings
from components.release.step_settings import (
    STEP_PARAMETERS,
    CompileSettings,
    ExportSettings,
    ModelLoadSettings,
    TuneSettings,
    pipeline_parameters,
    pipeline_settings,
)
from components.repository.maintenance_settings import RepoGcSettings
from components.settings import GateSettings, Thresholds
from pipelines.cli import app

COMPILED = Path(__file__).resolve().parents[1] / "pipelines" / "release_pipeline.yaml"


def _cli_options(*command: str) -> dict[str, Any]:
    group = typer.main.get_command(app)
    for name in command:
        group = group.commands[name]
    return {p.name: p for p in group.params}


def _pipeline_parameters() -> dict[str, Any]:
    spec = next(yaml.safe_load_all(COMPILED.read_text()))
    return spec["root"]["inputDefinitions"]["parameters"]


@pytest.mark.parametrize("command", list(STEP_PARAMETERS), ids=" ".join)
def test_each_steps_options_pipeline_parameters_and_settings_type_take_the_tables_names_defaults_and_help(command):
    table, kind = STEP_PARAMETERS[command]
    options, pipeline = _cli_options(*command), _pipeline_parameters()
    for name, parameter in table.items():
        if parameter.cli:
            assert options[name].default == parameter.default, name
            assert options[name].help == parameter.help, name
        else:
            assert name not in options, name
        if pipeline_name := parameter.pipeline_name(name):
            assert pipeline[pipeline_name].get("defaultValue") == parameter.pipeline_default(name), pipeline_name
            assert pipeline[pipeline_name]["description"] == parameter.help, pipeline_name
    assert kind.from_flat() == kind()  # the table's defaults are the settings type's


def test_the_pipeline_differs_from_the_cli_only_where_it_says_so():
    differing = {n for n, p in pipeline_parameters().items() if p.pipeline_default(n) != p.default}
    assert differing == set(settings.PIPELINE_DIFFERENCES) == {"compile_target", "precision", "compile_device"}
    assert all(p.get("description") for p in _pipeline_parameters().values())  # every parameter is explained


def test_the_pipelines_settings_are_checked_before_anything_runs_and_reach_each_step():
    steps = pipeline_settings({"tune_budget": "4", "export_method": "trace", "max_p99_ms": 5})
    assert TuneSettings.from_flat(**steps["tune"]).budget == 4
    assert ExportSettings.from_flat(**steps["export"]).method == "trace"
    assert CompileSettings.from_flat(**steps["compile"]).target == settings.PIPELINE_TARGET
    assert GateSettings.from_flat(**steps["gate"]).thresholds.max_p99_ms == 5
    with pytest.raises(ValueError, match="instance_counts must be whole numbers"):
        pipeline_settings({"tune_instance_counts": "2,0"})
    with pytest.raises(ValueError, match="no parameter named rounds"):
        pipeline_settings({"rounds": 3})


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


@pytest.mark.parametrize(
    ("kind", "flat", "message"),
    [
        (ExportSettings, {"golden_samples": 0}, "golden_samples must be at least 1"),
        (ExportSettings, {"method": "pickle"}, "method must be one of auto, export, script, trace"),
        (CompileSettings, {"precision": "bf16"}, "precision bf16 needs target tensorrt"),
        (CompileSettings, {"device": "gpu0"}, "device must be cpu, cuda or cuda:N"),
        (CompileSettings, {"opt_batch": "eight"}, "opt_batch must be a int"),
        (CompileSettings, {"atol": -1.0}, "atol must not be negative"),
        (TuneSettings, {"budget": 0}, "budget must be at least 1"),
        (TuneSettings, {"instance_counts": "1,x"}, "instance_counts must be whole numbers"),
        (RepoGcSettings, {"keep": -1}, "keep must not be negative"),
        (ModelLoadSettings, {"load_timeout_s": 0}, "load_timeout_s must be positive"),
    ],
)
def test_each_steps_wrong_settings_are_refused_where_they_are_built(kind, flat, message):
    with pytest.raises(ValueError, match=message):
        kind.from_flat(**flat)


def test_the_step_functions_default_to_their_settings_types():
    from components.model.compile import compile_model
    from components.model.export import export
    from components.release.promote import promote
    from components.release.stage import stage
    from components.repository.leases import Leases
    from components.repository.maintenance import Maintenance
    from components.serving.perf import LoadSettings

    def defaults(fn: Any) -> dict[str, Any]:
        return {n: p.default for n, p in inspect.signature(fn).parameters.items()}

    chosen = ExportSettings()
    assert (defaults(export)["samples"], defaults(export)["method"]) == (chosen.golden_samples, chosen.method)
    arguments = CompileSettings().step_arguments()
    arguments.pop("tolerance")
    assert {n: defaults(compile_model)[n] for n in arguments} == arguments
    for step in (stage, promote):
        assert defaults(step)["load_timeout"] == ModelLoadSettings().load_timeout_s
    assert defaults(Maintenance.gc)["grace_seconds"] == RepoGcSettings().grace
    assert defaults(Leases.acquire_lease)["seconds"] == settings.DEFAULT_LEASE_S
    assert TuneSettings().load.window_ms == LoadSettings().window_ms == settings.DEFAULT_WINDOW_MS
