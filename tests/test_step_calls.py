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
from components.release.step_settings import pipeline_settings

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
            settings=pipeline_settings({})["promote"],
            **reports,
        )
    else:
        _cli("reject", *common)
        kfp_components.reject_op.python_func(**task, verdict_json=verdict.to_json(), run_id="run")
    by_hand, by_the_pipeline = calls
    assert by_hand == by_the_pipeline
    assert by_hand[0] == RunContext("s3://b", MODEL, VERSION, by_hand[0].gate) and by_hand[0].gate_url == GATE
