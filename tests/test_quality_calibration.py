"""The quality calibration on the real stack: published versions of a traced MLP served one after another by
Triton's PyTorch backend on the gate, judged by mean absolute error on labelled rows; the quality step then takes
the recorded limit for a metric without one of its own."""

from __future__ import annotations

import dataclasses
from itertools import combinations
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from components.release.publish import publish
from components.release.quality.calibration import calibrate_quality
from components.release.quality.metrics import QualityError
from components.release.quality.quality import quality
from components.release.quality.report import markdown_lines
from components.release.quality.spec import QualitySettings, QualitySpec
from components.release.run_context import RunContext
from components.release.stage import stage
from components.repository import ModelRepository
from components.settings import DEFAULT_QUALITY_MAX_DROP_PCT
from pipelines.cli import app
from tests.models import MLP, mlp_folder
from tests.release_helpers import install_stable, repository, unique

MAE = {"metric": "mae", "output": "y", "label": "target"}
NO_LIMITS = QualitySpec.model_validate({"metrics": [MAE]})
OWN_LIMIT = QualitySpec.model_validate({"metrics": [MAE | {"max_drop_pct": 1}]})


def _eval_file(tmp_path: Path, rows: int = 2000) -> Path:
    """Labels are MLP(1)'s answers plus noise: every seed's MLP misses them by a similar, not equal, amount."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(rows, 16)).astype(np.float32)
    with torch.inference_mode():
        target = MLP(seed=1).eval()(torch.from_numpy(x)).numpy() + rng.normal(scale=1.0, size=(rows, 4))
    np.savez(tmp_path / "eval.npz", x=x, target=target.astype(np.float32))
    return tmp_path / "eval.npz"


def _published(stack, tmp_path: Path, name: str, seed: int) -> int:
    (tmp_path / f"seed{seed}").mkdir()
    return publish(
        RunContext(repository(stack), "", s3=stack.s3), folder=mlp_folder(tmp_path / f"seed{seed}", name, seed=seed)
    ).version


@pytest.mark.slow
def test_calibration_records_each_retrains_metric_and_the_quality_step_takes_its_limit(tmp_path, stack):
    name, data = unique("qcal"), _eval_file(tmp_path)
    (tmp_path / "stable").mkdir()
    stable = install_stable(stack, mlp_folder(tmp_path / "stable", name, seed=2))
    retrains = [_published(stack, tmp_path, name, seed) for seed in (3, 4, 5, 6)]

    on_gate = RunContext(repository(stack), name, gate=stack.gate.replica, s3=stack.s3)
    no_limits = QualitySettings(eval_data=str(data), quality_spec=NO_LIMITS.to_json())
    with pytest.raises(QualityError, match="at least 3 retrains"):
        calibrate_quality(on_gate, no_limits, retrains[:2])
    assert ModelRepository(repository(stack), stack.s3).quality_calibration(name) is None  # nothing half-written

    found = calibrate_quality(on_gate, no_limits, retrains)
    variation = found.metrics["mae"]
    recorded = ModelRepository(repository(stack), stack.s3).quality_calibration(name)
    assert recorded["metrics"]["mae"]["values"] == variation.values and recorded["versions"] == retrains
    assert len(set(variation.values)) == 4 and variation.sd_pct > 0  # four different models, four values
    # every pair of the calibration's own retrains is within the limit it recommends
    largest = max(abs(a / b - 1) for a, b in combinations(variation.values, 2)) * 100
    assert variation.max_drop_pct > largest

    # each value is what the quality step itself measures for that version as the candidate
    candidate = retrains[0]
    assert stage(dataclasses.replace(on_gate, version=candidate)).accuracy_passed
    as_candidate = dataclasses.replace(on_gate, version=candidate)
    judged = quality(as_candidate, no_limits)
    whole = next(m for m in judged.metrics if m["slice"] == "")
    assert whole["candidate"] == pytest.approx(variation.values[0], rel=1e-5) and judged.stable_version == stable
    limit = max(DEFAULT_QUALITY_MAX_DROP_PCT, variation.max_drop_pct)
    assert [e["limit"] for e in judged.effects] == [pytest.approx(limit / 100)]  # mae: lower is better, a rise
    assert judged.calibration is not None and "retrains of the model differ" in "\n".join(markdown_lines(judged))
    own = quality(as_candidate, QualitySettings(eval_data=str(data), quality_spec=OWN_LIMIT.to_json()))
    assert [e["limit"] for e in own.effects] == [pytest.approx(0.01)] and own.calibration is None


@pytest.mark.slow
def test_calibrate_quality_from_the_cli(tmp_path, stack):
    name, data = unique("qcalcli"), _eval_file(tmp_path, rows=500)
    (tmp_path / "stable").mkdir()
    install_stable(stack, mlp_folder(tmp_path / "stable", name, seed=2))
    retrains = [_published(stack, tmp_path, name, seed) for seed in (3, 4, 5)]
    command = ["calibrate", "quality", "-r", repository(stack), "-m", name, "--gate", stack.gate.http_url]
    command += ["--eval-data", str(data), "--quality-spec", NO_LIMITS.to_json()]
    env = {**stack.s3.env(), "COLUMNS": "200"}
    refused = CliRunner().invoke(app, [*command, "--versions", "3,x"], env=env)
    assert refused.exit_code == 2 and "--versions takes version numbers" in refused.output
    shown = CliRunner().invoke(app, [*command, "--versions", ",".join(map(str, retrains))], env=env)
    assert shown.exit_code == 0, shown.output
    assert f"{name}: 3 retrains" in shown.output and "mae: values" in shown.output
    assert "recorded in s3://" in shown.output
    assert ModelRepository(repository(stack), stack.s3).quality_calibration(name)["versions"] == retrains
