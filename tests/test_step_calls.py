"""A step's `tritonship` command and its pipeline task call the step function the same way: a `RunContext` and the
step's settings type, whole, then the step's own inputs (components/release/run_context.py). Each is run here with
the step function replaced by one that records its call; no S3, no Triton."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from components.model.model_config import ServingSettings
from components.release.promote import promote as promote_step
from components.release.promote.records import PromoteResult
from components.release.results import TuneResult, Verdict
from components.release.run_context import RunContext
from components.release.step_settings import PIPELINE_STEPS
from components.release.tune.settings import TuneSettings

MODEL, VERSION = "m", 3
REPLICAS, GATE = "prod-0:8000,prod-1:8000", "gate:8000"


def _recorded(calls: list[tuple[Any, ...]], returns: Any = None) -> Any:
    def step(context: RunContext, *args: Any, **inputs: Any) -> Any:
        inputs.pop("progress", None)  # the command's spinner
        calls.append((dataclasses.replace(context, s3=None, run_id=""), *args, inputs))  # S3's endpoint, the run id
        return returns

    return step


def _cli(*argv: str) -> None:
    from typer.testing import CliRunner

    from pipelines.cli import app

    shown = CliRunner().invoke(app, list(argv), env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output


@pytest.mark.parametrize("step", ["promote", "reject"])
def test_promote_and_reject_are_called_alike_by_their_command_and_their_task(tmp_path: Path, monkeypatch, step):
    from pipelines import kfp_components

    calls: list[tuple[Any, ...]] = []
    promoted = PromoteResult(MODEL, VERSION, 2, REPLICAS.split(","), promoted=True)
    monkeypatch.setattr(promote_step, step, _recorded(calls, promoted if step == "promote" else None))
    verdict = Verdict(MODEL, VERSION, "pass" if step == "promote" else "fail", ["a reason"])
    served = ServingSettings(max_batch_size=4)
    tuning = TuneResult(MODEL, VERSION, served, served, None, 1)
    (tmp_path / "verdict.json").write_text(verdict.to_json())
    (tmp_path / "tuning.json").write_text(tuning.to_json())
    common = ("-r", "s3://b", "--verdict", str(tmp_path / "verdict.json"), "--gate", GATE)
    task = {"repository": "s3://b", "model_name": MODEL, "version": VERSION, "gate": GATE, "s3_endpoint": "http://s3"}
    if step == "promote":
        _cli("promote", *common, "--replicas", REPLICAS, "--tuning", str(tmp_path / "tuning.json"))
        reports = {name: SimpleNamespace(path=str(tmp_path / f"{name}.out")) for name in ("report", "report_html")}
        kfp_components.promote_op.python_func(
            **task,
            replicas=REPLICAS,
            verdict_json=verdict.to_json(),
            tuning_json=tuning.to_json(),
            run_id="run",
            settings=PIPELINE_STEPS.settings({})["promote"],
            **reports,
        )
    else:
        _cli("reject", *common)
        kfp_components.reject_op.python_func(**task, verdict_json=verdict.to_json(), run_id="run")
    by_hand, by_the_pipeline = calls
    assert by_hand == by_the_pipeline
    assert by_hand[0] == RunContext("s3://b", MODEL, VERSION, by_hand[0].gate) and by_hand[0].gate_url == GATE


def _task_outputs(tmp_path: Path, *names: str) -> dict[str, SimpleNamespace]:
    """KFP's output artifacts, as a task's function sees them: an object with a `.path` (and, for Metrics, log_metric)."""
    return {
        name: SimpleNamespace(path=str(tmp_path / f"{name}.out"), log_metric=lambda *_: None, metadata={})
        for name in names
    }


def _pages(*names: str) -> Any:
    """A report writer that writes only the pages a command or task reads back."""

    def write(_result: Any, out_dir: Path) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        for name in names:
            (out_dir / name).write_text(name)

    return write


def _gate_writing_its_pages(calls: list[tuple[Any, ...]], returns: Any) -> Any:
    recorded = _recorded(calls, returns)

    def gate(context: RunContext, settings: Any, staged: Any, out_dir: Path | None = None, **inputs: Any) -> Any:
        _pages("report.md", "report.html")(returns, out_dir)
        return recorded(context, settings, staged, **inputs)

    return gate


@pytest.mark.parametrize("step", ["stage", "tune", "quality", "gate"])
def test_the_measuring_steps_are_called_alike_by_their_command_and_their_task(tmp_path: Path, monkeypatch, step):
    """Stage, tune, quality and the gate: the same context (the gate server the release staged on) and the same
    settings, whole, from the command's defaults and from the pipeline's."""
    from components.release import stage as stage_module
    from components.release.gate import gate as gate_module
    from components.release.quality import quality as quality_module
    from components.release.results import GateResult, QualityResult, StageResult
    from components.release.tune import tune as tune_module
    from pipelines import kfp_components

    staged = StageResult(MODEL, VERSION, f"{MODEL}__candidate", GATE, accuracy_passed=True)
    served = ServingSettings(max_batch_size=4)
    tuning = TuneResult(MODEL, VERSION, served, served, None, 1)
    judged = QualityResult(MODEL, VERSION, 2, "pass", [])
    (tmp_path / "staged.json").write_text(staged.to_json())
    (tmp_path / "tuning.json").write_text(tuning.to_json())
    (tmp_path / "quality.json").write_text(judged.to_json())
    (tmp_path / "eval.npz").write_bytes(b"")
    spec = '{"metrics": [{"metric": "hit_rate", "k": 10, "output": "topk", "label": "item"}]}'
    settings = PIPELINE_STEPS.settings({"eval_data": str(tmp_path / "eval.npz"), "quality_spec": spec})
    calls: list[tuple[Any, ...]] = []
    where = ("-r", "s3://b", "--model", MODEL, "--version", str(VERSION), "--gate", GATE)
    task: dict[str, Any] = {
        "repository": "s3://b",
        "model_name": MODEL,
        "version": VERSION,
        "gate": GATE,
        "s3_endpoint": "http://s3",
        "run_id": "run",
        "settings": settings["load" if step == "stage" else step],
    }
    if step == "stage":
        monkeypatch.setattr(stage_module, "stage", _recorded(calls, staged))
        _cli("stage", *where)
        kfp_components.stage_op.python_func(**task)
    elif step == "tune":
        monkeypatch.setattr(tune_module, "tune", _recorded(calls, tuning))
        task["settings"] = TuneSettings().to_dict()  # the pipeline's tunes at the gate's load; the command's default
        _cli("tune", *where, "--out", str(tmp_path / "tuned.json"))
        kfp_components.tune_op.python_func(**task, stage_result=staged.to_json(), **_task_outputs(tmp_path, "report"))
    elif step == "quality":
        monkeypatch.setattr(quality_module, "quality", _recorded(calls, judged))
        monkeypatch.setattr("components.release.quality.report.write", _pages("quality.md", "quality.html"))
        _cli(
            "quality", *where, "--out", str(tmp_path), "--eval-data", str(tmp_path / "eval.npz"), "--quality-spec", spec
        )
        outputs = _task_outputs(tmp_path, "metrics", "report", "report_html")
        kfp_components.quality_op.python_func(**task, stage_result=staged.to_json(), **outputs)
    else:
        verdict = GateResult(MODEL, VERSION, "pass", [])
        monkeypatch.setattr(gate_module, "gate", _gate_writing_its_pages(calls, verdict))
        inputs = ("--stage-result", str(tmp_path / "staged.json"), "--tuning", str(tmp_path / "tuning.json"))
        _cli("gate", *where, "--out", str(tmp_path / "by_hand"), *inputs, "--quality", str(tmp_path / "quality.json"))
        kfp_components.gate_op.python_func(
            **task,
            stage_result=staged.to_json(),
            tuning_json=tuning.to_json(),
            quality_json=judged.to_json(),
            **_task_outputs(tmp_path, "metrics", "report", "report_html"),
        )
    by_hand, by_the_pipeline = calls
    assert by_hand == by_the_pipeline
    context = by_hand[0]
    assert (context.repository, context.model, context.version, context.gate_url) == ("s3://b", MODEL, VERSION, GATE)
