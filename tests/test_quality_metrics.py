"""The quality metrics and their intervals, on arrays whose answers are known, and the spec's checks."""

from __future__ import annotations

import numpy as np
import pytest

from components.model.signature import Signature
from components.release.quality import metrics as quality_metrics
from components.release.quality.metrics import QualityError
from components.release.quality.quality import decide
from components.release.quality.spec import QualitySpec, QualitySpecError
from components.release.results import QualityResult

SIGNATURE = Signature.from_dict(
    {
        "batch": True,
        "max_batch_size": 8,
        "inputs": [{"name": "x", "dtype": "int64", "shape": [-1, 4], "range": [0, 50]}],
        "outputs": [
            {"name": "top", "dtype": "int64", "shape": [-1, 5], "range": [1, 50]},
            {"name": "probs", "dtype": "fp32", "shape": [-1, 3]},
            {"name": "score", "dtype": "fp32", "shape": [-1, 1]},
        ],
    }
)
OUTPUTS = {s.name: s for s in SIGNATURE.outputs}


def _metric(**fields):
    spec = QualitySpec.model_validate({"metrics": [fields]})
    spec.check_against(SIGNATURE)
    return quality_metrics.build(spec.metrics[0], OUTPUTS)


def test_ranking_metrics_score_the_labels_rank_within_the_cut_off():
    top = np.array([[7, 3, 9, 1, 2], [4, 5, 6, 8, 3], [1, 2, 3, 4, 5]])
    labels = {"item": np.array([3, 8, 40])}  # ranks 2, 4, absent
    rows = lambda name, k=None: _metric(metric=name, k=k, output="top", label="item").rows({"top": top}, labels)  # noqa: E731
    assert rows("hit_rate").tolist() == [1, 1, 0]
    assert rows("hit_rate", k=3).tolist() == [1, 0, 0]
    assert rows("mrr").tolist() == pytest.approx([1 / 2, 1 / 4, 0])
    assert rows("ndcg").tolist() == pytest.approx([1 / np.log2(3), 1 / np.log2(5), 0])


def test_classification_and_regression_rows():
    probs = np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]], np.float32)
    labels = {"y": np.array([0, 1])}
    assert _metric(metric="accuracy", output="probs", label="y").rows({"probs": probs}, labels).tolist() == [1, 0]
    loss = _metric(metric="log_loss", output="probs", label="y").rows({"probs": probs}, labels)
    assert loss == pytest.approx([-np.log(0.7), -np.log(0.1)], rel=1e-5)
    score = np.array([[1.0], [3.0]], np.float32)
    target = {"t": np.array([2.0, 1.0])}
    assert _metric(metric="mae", output="score", label="t").rows({"score": score}, target).tolist() == [1, 2]
    rmse = _metric(metric="rmse", output="score", label="t")
    estimate = rmse.estimate(rmse.rows({"score": score}, target), None)
    assert estimate.candidate == pytest.approx(np.sqrt(2.5))


def test_auc_matches_the_pairwise_definition_and_delong_narrows_for_paired_versions():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 400)
    c = labels + rng.normal(0, 1.0, 400)
    s = c + rng.normal(0, 0.1, 400)  # nearly the same model
    auc = _metric(metric="auc", output="score", label="y")
    rows_c = auc.rows({"score": c[:, None].astype(np.float32)}, {"y": labels})
    rows_s = auc.rows({"score": s[:, None].astype(np.float32)}, {"y": labels})
    estimate = auc.estimate(rows_c, rows_s)
    pos, neg = c[labels == 1], c[labels == 0]
    pairwise = ((pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])).mean()
    assert estimate.candidate == pytest.approx(pairwise, rel=1e-5)
    _, se_difference = estimate.difference()
    assert 0 < se_difference < estimate.own()[1] / 3  # pairing: the difference is far surer than either AUC


def test_paired_intervals_cover_a_known_difference_about_as_often_as_they_claim():
    """Rows where the candidate is right 2 points less often than stable: the 90% interval of the difference
    covers -0.02 in about 90 of 100 simulated sets, and the decision fails a 1-point limit when it is clear."""
    metric = _metric(metric="hit_rate", output="top", label="item", max_drop=0.01)
    covered = 0
    for seed in range(100):
        rng = np.random.default_rng(seed)
        stable = (rng.random(20_000) < 0.6).astype(float)
        flip = rng.random(20_000) < 0.1
        candidate = np.where(flip, (rng.random(20_000) < 0.4).astype(float), stable)  # 0.6 - 0.1 * 0.2 = 0.58
        result = QualityResult("m", 2, 1, "inconclusive", [], confidence=0.9)
        decide(result, [metric], [[candidate], [stable]], None, 0.9)
        low, high = result.metrics[0]["difference_interval"]
        covered += low <= -0.02 <= high
    assert 82 <= covered <= 97, covered


def test_a_straddling_limit_is_inconclusive_and_says_how_many_more_rows_would_decide():
    metric = _metric(metric="hit_rate", output="top", label="item", max_drop=0.02)
    rng = np.random.default_rng(1)
    stable = (rng.random(500) < 0.6).astype(float)
    candidate = np.where(rng.random(500) < 0.2, 1 - stable, stable)
    result = QualityResult("m", 2, 1, "inconclusive", [], confidence=0.9)
    decide(result, [metric], [[candidate], [stable]], None, 0.9)
    assert result.decision == "inconclusive"
    assert "more rows would decide" in result.reasons[0]
    assert result.effects[0]["more_rows"] > 0


def test_a_first_release_is_judged_on_its_floor_alone():
    metric = _metric(metric="hit_rate", output="top", label="item", floor=0.5, max_drop=0.01)
    result = QualityResult("m", 1, None, "inconclusive", [], confidence=0.9)
    decide(result, [metric], [[np.r_[np.ones(300), np.zeros(700)]]], None, 0.9)
    assert result.decision == "fail"
    assert [e["name"] for e in result.effects] == ["hit_rate"]
    no_floor = _metric(metric="hit_rate", output="top", label="item", max_drop=0.01)
    result = QualityResult("m", 1, None, "inconclusive", [], confidence=0.9)
    decide(result, [no_floor], [[np.ones(100)]], None, 0.9)
    assert result.decision == "inconclusive" and "floor" in result.reasons[0]


def test_per_slice_limits_judge_each_slice_and_slices_are_reported():
    metric = _metric(metric="hit_rate", output="top", label="item", max_drop=0.05, per_slice=True)
    stable = np.ones(2000)
    candidate = np.r_[np.ones(1000), np.where(np.arange(1000) % 5 == 0, 0.0, 1.0)]  # segment b loses 20 points
    slices = np.array(["a"] * 1000 + ["b"] * 1000)
    result = QualityResult("m", 2, 1, "inconclusive", [], confidence=0.9)
    decide(result, [metric], [[candidate], [stable]], slices, 0.9)
    assert result.decision == "fail"
    assert {m["slice"] for m in result.metrics} == {"", "a", "b"}
    assert any("[b]" in reason for reason in result.reasons)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"metrics": [{"metric": "hit_rate", "output": "nope", "label": "item"}]}, "does not have"),
        ({"metrics": [{"metric": "precision", "output": "top", "label": "item"}]}, "neither built in"),
        ({"metrics": [{"metric": "log_loss", "output": "probs", "label": "y", "floor": 0.1}]}, "ceiling"),
        ({"metrics": [{"metric": "m:f", "outputs": ["top"]}]}, "higher_is_better"),
        ({"metrics": []}, "metrics"),
    ],
)
def test_a_wrong_spec_is_one_sentence_naming_the_problem(spec, message):
    import json

    with pytest.raises(QualitySpecError, match=message):
        QualitySpec.from_text(json.dumps(spec)).check_against(SIGNATURE)


def test_labels_outside_the_outputs_range_and_a_raising_user_metric_are_refused():
    metric = _metric(metric="hit_rate", output="top", label="item")
    with pytest.raises(QualityError, match="outside"):
        quality_metrics.check_labels(metric.spec, OUTPUTS["top"], np.array([3, 99]), "item")
    with pytest.raises(QualityError, match="outside 0 to 2"):
        quality_metrics.check_labels(
            _metric(metric="accuracy", output="probs", label="y").spec, OUTPUTS["probs"], np.array([3]), "y"
        )
    user = _metric(metric="tests.test_quality_metrics:raising_metric", outputs=["top"], higher_is_better=True)
    with pytest.raises(QualityError, match="raised ZeroDivisionError"):
        user.rows({"top": np.zeros((2, 5), np.int64)}, {"x": np.zeros(2)})


def raising_metric(outputs, labels):
    return 1 / 0
