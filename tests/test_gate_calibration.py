"""The gate's calibration: the noise of an equal candidate measured on the embedded gate server and recorded in S3,
what it says the budget can decide, and the gate reading it before it measures."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from components.release.gate.calibration import CalibrationError, budget_for, budgets, calibrate, decidable
from components.release.gate.gate import gate
from components.release.results import GateCalibration
from components.release.run_context import RunContext
from components.release.stage import stage
from components.repository import ModelRepository
from components.serving.replicas import Replica
from components.settings import GateSettings
from pipelines.cli import app
from pipelines.kfp_components import calibrate_op
from pipelines.kubeflow import COMPILED
from tests.models import mlp_folder
from tests.release_helpers import install_stable, quick_gate_settings, repository, unique

NOISY = GateCalibration("m", 1, rounds=12, round_seconds=4.0, setup_seconds=8.0, p99_log_sd=0.4, throughput_log_sd=0.1)


def test_what_a_budget_decides_narrows_with_rounds_and_widens_with_noise():
    assert decidable(0.2, 10, 0.9) > decidable(0.2, 30, 0.9) > decidable(0.1, 30, 0.9) > 0
    assert decidable(0.2, 2, 0.9) == float("inf")
    assert NOISY.rounds_within(120) == 28  # (120 - 8) / 4
    needed = budget_for(NOISY, NOISY.p99_log_sd, 0.10, 0.9, 5)
    assert needed is not None and (needed - 8) % 4 == 0 and decidable(0.4, int((needed - 8) / 4), 0.9) < 0.10
    assert decidable(0.4, int((needed - 8) / 4) - 1, 0.9) >= 0.10  # the shortest such budget


def _staged_equal(stack, tmp_path) -> tuple[str, int]:
    name = unique("calib")
    (tmp_path / "v1").mkdir()
    (tmp_path / "v2").mkdir()
    install_stable(stack, mlp_folder(tmp_path / "v1", name))
    from components.release.publish import publish

    published = publish(RunContext(repository(stack), "", s3=stack.s3), folder=mlp_folder(tmp_path / "v2", name))
    assert stage(RunContext(repository(stack), name, published.version, stack.gate.replica, stack.s3)).accuracy_passed
    return name, published.version


def test_the_gate_says_up_front_when_its_calibration_puts_the_limits_out_of_reach(tmp_path, stack):
    name, version = _staged_equal(stack, tmp_path)
    repo = ModelRepository(repository(stack), stack.s3)
    repo.write_calibration(stack.gate.http_url, name, dataclasses.replace(NOISY, model=name).to_dict())
    context = RunContext(repository(stack), name, version, Replica("gate", stack.gate.http_url), stack.s3)
    verdict = gate(context, GateSettings())
    assert verdict.verdict == "inconclusive" and verdict.rounds == 0 and verdict.calibration.p99_log_sd == 0.4
    assert verdict.reasons[0].startswith("the p99 limit (10%) is beyond what the 120 s budget decides on this gate")
    assert "a budget of" in verdict.reasons[0] and len(verdict.reasons) == 2  # throughput's noise is within reach
    # allowed a longer budget, the gate takes what the calibration asks for and measures; at limits of 20% the
    # recorded noise still needs more than 120 s, which this quiet model's own noise does not (short rounds: quick)
    allowed = GateSettings.from_flat(
        max_calibrated_budget_s=3600,
        budget_s=120,
        window_ms=250,
        max_p99_regression_pct=20,
        max_throughput_regression_pct=20,
    )
    taken = gate(context, allowed)
    needed = budgets(taken.calibration, allowed)
    assert taken.rounds >= 5 and taken.settings["budget_s"] == float(np.ceil(max(needed.values())))


@pytest.mark.slow
def test_calibrate_measures_the_stable_version_against_itself_and_records_it(tmp_path, stack, monkeypatch):
    name = unique("calib")
    (tmp_path / "v1").mkdir()
    with pytest.raises(CalibrationError, match="has no promoted version"):
        calibrate(RunContext(repository(stack), name, gate=stack.gate.replica, s3=stack.s3), rounds=5)
    install_stable(stack, mlp_folder(tmp_path / "v1", name))
    shown = CliRunner().invoke(
        app,
        [
            *("calibrate", "gate", "-r", repository(stack), "-m", name, "--gate", stack.gate.http_url),
            *("--rounds", "5", "--window-ms", "250"),  # short rounds: the record is the subject, not the noise
        ],
        env={**stack.s3.env(), "COLUMNS": "200"},
    )
    assert shown.exit_code == 0, shown.output
    assert f"{name} v1 on {stack.gate.http_url}: 5 rounds" in shown.output
    assert "the p99 limit of 10% is decided" in shown.output and "recorded in s3://" in shown.output
    record = ModelRepository(repository(stack), stack.s3).calibration(stack.gate.http_url, name)
    assert record["rounds"] == 5 and record["p99_log_sd"] > 0 and record["throughput_log_sd"] > 0
    assert (
        set(record["decidable_pct"]) == {"p99", "throughput"} and record["round_seconds"] >= 0.75
    )  # 3 windows of 250 ms
    from components.serving.triton_admin import TritonAdmin

    # the pipeline's option: its calibrate task measures every gate server named, before the candidate is staged
    for key, value in stack.s3.env().items():  # a task reads its S3 credentials from the environment
        monkeypatch.setenv(key, value)
    settings, endpoint = quick_gate_settings(), stack.s3.endpoint_url
    assert calibrate_op.python_func(repository(stack), name, stack.gate.http_url, endpoint, "", settings) == "[]"
    on = {**settings, "calibrate_rounds": 5}
    found = json.loads(calibrate_op.python_func(repository(stack), name, stack.gate.http_url, endpoint, "run-1", on))
    assert [c["rounds"] for c in found] == [5] and found[0]["gate"] == stack.gate.http_url
    assert ModelRepository(repository(stack), stack.s3).calibration(stack.gate.http_url, name)["rounds"] == 5
    with TritonAdmin(stack.gate.http_url) as admin:  # nothing of the calibration stays on the gate
        assert not admin.is_ready(f"{name}__candidate") and not admin.is_ready(name)
    assert ModelRepository(repository(stack), stack.s3).lease(name) is None


def test_the_pipeline_calibrates_before_it_stages():
    spec = next(yaml.safe_load_all(COMPILED.read_text()))
    stage = next(
        c["dag"]["tasks"]["stage-op"]
        for c in spec["components"].values()
        if "stage-op" in c.get("dag", {}).get("tasks", {})
    )
    assert "calibrate-op" in stage["dependentTasks"]
