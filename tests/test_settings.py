"""One home for every setting: each step's settings type (components/settings_model.py says how) declares its
options' names, defaults, bounds and help; the `tritonship` options and the compiled pipeline's parameters are
made from them and agree with them, no option is declared anywhere else, and "off" is 0 in every form."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
from pathlib import Path
from typing import Any

import pytest
import typer.main
import yaml
from typer.testing import CliRunner

from components import settings
from components.model.settings import CompileSettings, ExportSettings
from components.release.promote.settings import CanarySettings, PromoteSettings
from components.release.stage import ModelLoadSettings
from components.release.step_settings import (
    COMMANDS,
    PIPELINE_STEPS,
    PublishSettings,
)
from components.release.tune.settings import TuneSettings
from components.repository.maintenance_settings import RepoGcSettings
from components.settings import GateSettings, LoadSettings, Thresholds
from components.settings_model import SettingsError
from pipelines.cli import app

ROOT = Path(__file__).resolve().parents[1]
COMPILED = ROOT / "pipelines" / "release_pipeline.yaml"
# release_pipeline's own parameters: where it runs and what it releases, none a step's setting
WIRING = {
    "model_source",
    "checkpoint",
    "signature",
    "model_name",
    "gpu_count",
    "gpu_node_selector",
    "gpu_tolerations",
    "repository",
    "s3_endpoint",
    "aws_secret_name",
    "admin_secret_name",
    "replicas",
    "gate",
}


def _cli_options(*command: str) -> dict[str, Any]:
    group = typer.main.get_command(app)
    for name in command:
        group = group.commands[name]
    return {p.name: p for p in group.params}


def _compiled() -> dict[str, Any]:
    return next(yaml.safe_load_all(COMPILED.read_text()))


@pytest.mark.parametrize("command", list(COMMANDS), ids=" ".join)
def test_each_steps_cli_options_are_its_settings_options(command):
    kind, options = COMMANDS[command], _cli_options(*command)
    for name, option in kind.options().items():
        if not option.cli:
            assert name not in options, name
            continue
        made = options[name]
        assert (made.default, made.help, made.envvar) == (option.default, option.help, option.envvar), name
        assert option.flag in made.opts and set(option.flags) <= set(made.opts), name
    assert kind.from_flat() == kind() and kind.from_flat(**kind().to_flat()) == kind()


def test_the_pipelines_parameters_are_the_settings_options_by_construction():
    from pipelines.pipeline import release_pipeline

    signature = inspect.signature(release_pipeline.pipeline_func).parameters
    compiled = _compiled()["root"]["inputDefinitions"]["parameters"]
    made = PIPELINE_STEPS.parameters()
    assert set(signature) == set(compiled) == WIRING | set(made)
    for name, parameter in made.items():
        assert signature[name].default == compiled[name].get("defaultValue") == parameter.default, name
        assert signature[name].annotation is parameter.pipeline_kind, name
        assert compiled[name]["description"] == parameter.help, name
    assert all(p.get("description") for p in compiled.values())  # every parameter is explained


def test_the_pipeline_differs_from_the_cli_only_where_it_says_so():
    options = {o.pipeline: o for kind in PIPELINE_STEPS.values() for o in kind.options().values() if o.pipeline}
    differing = {n for n, p in PIPELINE_STEPS.parameters().items() if p.default != options[n].default}
    assert differing == set(settings.PIPELINE_DIFFERENCES) == {"compile_target", "precision", "compile_device"}


def test_the_pipelines_settings_are_checked_before_anything_runs_and_reach_each_step():
    steps = PIPELINE_STEPS.settings({"tune_budget": "4", "export_method": "trace", "max_p99_ms": 5, "concurrency": 2})
    assert set(steps) == set(PIPELINE_STEPS)
    assert ExportSettings.from_dict(steps["export"]).method == "trace"
    assert CompileSettings.from_dict(steps["compile"]).target == settings.PIPELINE_TARGET
    assert GateSettings.from_dict(steps["gate"]).thresholds.max_p99_ms == 5
    tuning = TuneSettings.from_dict(steps["tune"])  # at the gate's load, within its p99 limit
    assert (tuning.budget, tuning.max_p99_ms, tuning.load) == (4, 5, GateSettings.from_dict(steps["gate"]).load)
    assert PromoteSettings.from_dict(steps["promote"]) == PromoteSettings()
    # handed whole, nested as declared: no flat form between settings_op and the task
    assert steps["promote"]["canary"]["round_s"] == PromoteSettings().canary.round_s
    assert json.loads(json.dumps(steps)) == steps


def test_each_steps_settings_pass_as_a_kfp_dict_parameter_and_come_back_the_same():
    from kfp.compiler.pipeline_spec_builder import to_protobuf_value

    for step, whole in PIPELINE_STEPS.settings({}).items():
        to_protobuf_value(whole)  # as KFP hands a task its input: it refuses None inside a dict
        assert PIPELINE_STEPS[step].from_dict(whole).to_dict() == whole
    unset = GateSettings()  # settings that are None by default (no p99 limit, no fixed rate) travel as defaults
    assert "max_p99_ms" not in unset.to_dict()["thresholds"] and GateSettings.from_dict(unset.to_dict()) == unset
    with pytest.raises(SettingsError, match="instance_counts must be whole numbers"):
        PIPELINE_STEPS.settings({"tune_instance_counts": "2,0"})
    with pytest.raises(SettingsError, match="no parameter named rounds"):
        PIPELINE_STEPS.settings({"rounds": 3})


@pytest.mark.parametrize(
    ("changed", "steps"),
    [
        ({"canary_round_s": 30.0}, {"promote"}),
        ({"load_timeout_s": 60.0}, {"load", "promote"}),
        ({"max_p99_ms": 5.0}, {"gate", "tune"}),
        ({"max_throughput_regression_pct": 5.0}, {"gate"}),
        ({"precision": "fp32"}, {"compile"}),
    ],
)
def test_each_task_gets_only_its_own_steps_settings_so_kfp_caches_the_rest(changed, steps):
    before, after = PIPELINE_STEPS.settings({}), PIPELINE_STEPS.settings(changed)
    assert {step for step in before if before[step] != after[step]} == steps


def test_the_pipeline_is_wired_from_the_one_list_of_steps():
    """PIPELINE_STEPS is the one list: the pipeline's parameters, settings_op's outputs (written out, as KFP runs
    the op's source on its own: checked here) and the steps' settings inputs are all made from it."""
    from pipelines.kfp_components import settings_op
    from pipelines.pipeline import MODEL_STEPS, RELEASE_STEPS, release_pipeline, release_steps

    options = {o.pipeline for kind in PIPELINE_STEPS.values() for o in kind.options().values() if o.pipeline}
    assert set(inspect.signature(release_pipeline.pipeline_func).parameters) == WIRING | options
    assert list(settings_op.component_spec.outputs) == list(PIPELINE_STEPS)
    assert (*MODEL_STEPS, *RELEASE_STEPS) == tuple(PIPELINE_STEPS)
    inputs = {n for n in release_steps.component_spec.inputs if n.endswith("_settings")}
    assert inputs == {f"{step}_settings" for step in RELEASE_STEPS}
    spec = _compiled()
    tasks = {
        n: t for c in [spec["root"], *spec["components"].values()] for n, t in c.get("dag", {}).get("tasks", {}).items()
    }

    def fed(task: str, name: str = "settings") -> str:
        given = tasks[task]["inputs"]["parameters"][name]
        return given.get("taskOutputParameter", {}).get("outputParameterKey") or given["componentInputParameter"]

    assert (fed("export-op"), fed("compile-op")) == ("export", "compile")
    release = next(n for n in tasks if n.endswith("release-steps"))
    ops = {
        "publish": "publish",
        "stage": "load",
        "quality": "quality",
        "tune": "tune",
        "gate": "gate",
        "promote": "promote",
    }
    for op, step in ops.items():
        assert fed(release, f"{step}_settings") == step
        assert fed(f"{op}-op").removeprefix("pipelinechannel--") == f"{step}_settings"
    assert {*MODEL_STEPS, *ops.values()} == set(PIPELINE_STEPS)  # every step's settings reach a task


def _commands(tree: ast.Module) -> list[tuple[tuple[str, ...], ast.FunctionDef]]:
    """Every `tritonship` command defined in a module: its words and its function."""
    found = []
    for node in ast.walk(tree):
        for decorator in getattr(node, "decorator_list", []):
            called = decorator.func if isinstance(decorator, ast.Call) else None
            if isinstance(called, ast.Attribute) and called.attr == "command" and decorator.args:
                group = called.value.id  # type: ignore[attr-defined]
                words = (
                    (decorator.args[0].value,)
                    if group == "app"
                    else (group.removesuffix("_app"), decorator.args[0].value)
                )
                found.append((words, node))
    return found


def test_no_step_option_is_declared_anywhere_but_its_settings_type():
    """A command takes its step's options only through step_options(its settings type), no command declares a
    step option's flag by hand, and the pipeline and its tasks take them only through settings_op's dicts."""
    flags = {f for kind in COMMANDS.values() for o in kind.options().values() for f in (o.flag, *o.flags)}
    problems = []
    for path in sorted((ROOT / "pipelines" / "cli").glob("*.py")):
        tree = ast.parse(path.read_text())
        for words, function in _commands(tree):
            arguments = {a.arg for a in (*function.args.args, *function.args.kwonlyargs)}
            kind = COMMANDS.get(words)
            if kind is not None:
                generated = [
                    d
                    for d in function.decorator_list
                    if isinstance(d, ast.Call) and getattr(d.func, "id", "") == "step_options"
                ]
                if [ast.unparse(d.args[0]) for d in generated] != [kind.__name__]:
                    problems.append(f"{path.name}: {' '.join(words)} is not made by step_options({kind.__name__})")
                problems += [
                    f"{path.name}: {' '.join(words)} declares {a}" for a in sorted(arguments & set(kind.options()))
                ]
        for call in ast.walk(tree):
            if isinstance(call, ast.Call) and ast.unparse(call.func) == "typer.Option":
                said = {a.value for a in call.args if isinstance(a, ast.Constant)} & flags
                problems += [f"{path.name}:{call.lineno} declares the option {f}" for f in sorted(said)]
    parameters = set(PIPELINE_STEPS.parameters())
    for name in ("pipeline.py", "kfp_components.py", "kfp_model_components.py"):
        tree = ast.parse((ROOT / "pipelines" / name).read_text())
        for function in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
            arguments = {a.arg for a in (*function.args.args, *function.args.kwonlyargs)}
            # settings_op takes the quality spec apart: KFP's local runner writes a dict's text unescaped
            allowed = {"quality_spec"} if function.name == "settings_op" else set()
            problems += [f"{name}: {function.name} takes {a}" for a in sorted(arguments & parameters - allowed)]
    for path in [*ROOT.glob("components/**/*.py"), *ROOT.glob("pipelines/**/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Name) and node.id.endswith("_PARAMETERS"):  # the old tables
                problems.append(f"{path.relative_to(ROOT)}:{node.lineno} names {node.id}")
    assert problems == []


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
    assert off.thresholds == Thresholds(None, None, None, 15.0) and off.load.request_rate is None
    assert off.to_flat()["max_p99_regression_pct"] == 0.0
    assert Thresholds(max_p99_ms=0) == Thresholds(max_p99_ms=None)  # from Python too
    assert CanarySettings(max_latency_ms=0.0).max_latency_ms is None
    # as KFP hands them over: text, or floats for whole numbers
    assert GateSettings.from_flat(concurrency="2", min_rounds=6.0, budget_s="30").load.concurrency == 2
    tuned = TuneSettings.from_flat(instance_counts="1, 4", request_rate=0, concurrency=3)
    assert (tuned.instance_counts, tuned.load.request_rate, tuned.load.stability_pct) == (
        (1, 4),
        None,
        settings.RELAXED_STABILITY_PCT,  # the rest of tune's load is its default's, not LoadSettings()'
    )
    assert tuned.to_flat()["instance_counts"] == "1,4"


@pytest.mark.parametrize(
    ("flat", "message"),
    [
        ({"concurrency": 0}, "concurrency must be at least 1, not 0"),
        ({"design": "both"}, "design must be one of duet, alternating, not 'both'"),
        ({"min_rounds": 2}, "min_rounds must be at least 5"),
        ({"window_ms": "fast"}, "window_ms must be a whole number, not 'fast'"),
        ({"max_p99_ms": -1}, r"max_p99_ms must be positive \(0 is off\), not -1"),
        ({"rounds": 3}, "no parameter named rounds"),
    ],
)
def test_wrong_settings_are_refused_where_they_are_built(flat, message):
    with pytest.raises(ValueError, match=f"^invalid gate settings: {message}"):
        GateSettings.from_flat(**flat)


@pytest.mark.parametrize(
    ("kind", "flat", "message"),
    [
        (ExportSettings, {"golden_samples": 0}, "golden_samples must be at least 1"),
        (ExportSettings, {"method": "pickle"}, "method must be one of auto, export, script, trace"),
        (CompileSettings, {"precision": "bf16", "device": "cuda"}, "precision bf16 needs target tensorrt or aoti"),
        (CompileSettings, {"precision": "fp16", "target": "aoti"}, "precision fp16 with target aoti compiles on CUDA"),
        (CompileSettings, {"device": "gpu0"}, "device must be cpu, cuda or cuda:N"),
        (CompileSettings, {"opt_batch": "eight"}, "opt_batch must be a whole number"),
        (CompileSettings, {"atol": -1.0}, "atol must not be negative"),
        (PublishSettings, {"serving_torch": "latest"}, "serving_torch must be a torch version such as 2.14.0"),
        (TuneSettings, {"budget": 0}, "budget must be at least 1"),
        (TuneSettings, {"instance_counts": "1,x"}, "instance_counts must be whole numbers"),
        (TuneSettings, {"concurrency": 0}, "concurrency must be at least 1"),
        (RepoGcSettings, {"keep": -1}, "keep must not be negative"),
        (ModelLoadSettings, {"load_timeout_s": 0}, "load_timeout_s must be positive"),
        (PromoteSettings, {"canary_round_s": 0.1}, "canary_round_s must be at least 0.5"),
        (PromoteSettings, {"canary_max_bake_s": 10}, "canary_max_bake_s \\(10\\) must give a warm-up round"),
    ],
)
def test_each_steps_wrong_settings_are_refused_where_they_are_built(kind, flat, message):
    with pytest.raises(SettingsError, match=f"^invalid {kind.WHAT} settings: {message}"):
        kind.from_flat(**flat)


def test_the_compile_help_says_what_the_compile_step_takes():
    """bf16 with tensorrt or aoti, and fp16 and bf16 compiled on CUDA (components/model/compile.py, aoti.py)."""
    for target in ("tensorrt", "aoti"):
        assert CompileSettings(target=target, precision="bf16", device="cuda").precision == "bf16"
    assert CompileSettings(target="tensorrt", precision="fp16").device == "cpu"  # tensorrt moves to a GPU itself
    assert "bf16 with tensorrt or aoti" in CompileSettings.options()["precision"].help


def test_direct_construction_and_replace_are_checked_too():
    with pytest.raises(SettingsError, match="canary_replicas must be at least 1"):
        CanarySettings(replicas=0)
    with pytest.raises(SettingsError, match="confidence must be below 1"):
        dataclasses.replace(GateSettings(), confidence=1.5)
    with pytest.raises(SettingsError, match="no parameter named rounds"):
        GateSettings(rounds=3)  # type: ignore[call-arg]
    assert dataclasses.asdict(LoadSettings())["stability_pct"] == 20.0


def test_the_step_functions_default_to_their_settings_types():
    from components.model.compile import compile_model
    from components.model.export import export
    from components.release.promote.promote import promote
    from components.repository.leases import Leases
    from components.repository.maintenance import Maintenance
    from components.serving.perf import LoadSettings

    def defaults(fn: Any) -> dict[str, Any]:
        return {n: p.default for n, p in inspect.signature(fn).parameters.items()}

    # export and compile take their settings whole: no setting unpacked into an argument
    inputs = ["model_source", "signature_path", "out_dir", "settings", "checkpoint", "golden", "s3"]
    assert list(defaults(export)) == inputs
    assert list(defaults(compile_model)) == ["export_dir", "out_dir", "name", "settings"]
    for step, kind in ((export, ExportSettings), (compile_model, CompileSettings)):
        chosen = inspect.signature(step, eval_str=True).parameters["settings"]
        assert (chosen.annotation, chosen.default) == (kind | None, None), step.__name__
    assert defaults(promote)["settings"] is None and "load_timeout" not in defaults(promote)  # PromoteSettings' own
    assert defaults(Maintenance.gc)["grace_seconds"] == RepoGcSettings().grace
    assert defaults(Leases.acquire_lease)["seconds"] == settings.DEFAULT_LEASE_S
    assert TuneSettings().load.window_ms == LoadSettings().window_ms == settings.DEFAULT_WINDOW_MS


def test_stage_tune_calibrate_and_publish_take_a_context_and_their_settings_whole():
    """step(context, settings, *its inputs): no setting unpacked into an argument, no default bound a second time."""
    from components.release.gate.calibration import calibrate
    from components.release.publish import PublishSettings, publish, publish_bundle
    from components.release.run_context import RunContext
    from components.release.stage import stage
    from components.release.tune.tune import tune

    for step, kind in (
        (stage, ModelLoadSettings),
        (tune, TuneSettings),
        (calibrate, GateSettings),
        (publish, PublishSettings),
        (publish_bundle, PublishSettings),
    ):
        parameters = inspect.signature(step, eval_str=True).parameters
        context, chosen, *inputs = parameters.values()
        assert (context.name, context.annotation) == ("context", RunContext), step.__name__
        assert (chosen.name, chosen.annotation, chosen.default) == ("settings", kind | None, None), step.__name__
        assert all(p.default is inspect.Parameter.empty for p in inputs), step.__name__


def test_the_quality_spec_is_parsed_once_where_its_settings_are_checked(monkeypatch):
    from components.release.quality.spec import QualitySettings, QualitySpec

    parsed = []
    parse = QualitySpec.from_text
    monkeypatch.setattr(QualitySpec, "from_text", lambda *a: parsed.append(a) or parse(*a))
    text = '{"metrics": [{"metric": "hit_rate", "output": "topk", "label": "next_item"}]}'
    checked = QualitySettings.from_flat(eval_data="s3://b/eval.parquet", quality_spec=text)
    assert checked.spec.metrics[0].metric == "hit_rate" and checked.spec is checked.spec
    assert len(parsed) == 1


def test_the_gate_nests_the_perf_analyzer_load_and_takes_three_of_its_options():
    options = GateSettings.options()
    taken = {n for n, o in options.items() if o.path[0] == "load"}
    assert taken == {"concurrency", "request_rate", "window_ms"}
    assert all(options[n].pipeline == n and options[n].cli for n in taken)
    assert options["window_ms"].help != LoadSettings.options()["window_ms"].help  # said in the gate's words
    assert GateSettings().load.stability_pct == settings.RELAXED_STABILITY_PCT
    assert GateSettings.from_flat(window_ms=250).load == dataclasses.replace(GateSettings().load, window_ms=250)
    with pytest.raises(SettingsError, match="no parameter named stability_pct"):
        GateSettings.from_flat(stability_pct=5)
