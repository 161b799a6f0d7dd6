"""One serialisation for every step's result (components/release/results.py): what is written reads back equal, and
a file that is not the result it claims to be is refused with what is wrong. The reports made of the results: each
figure said once, and the pipeline's the CLI's."""

from __future__ import annotations

import html
import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from components.model.model_config import ServingSettings
from components.model.parity import OutputParity
from components.release.effects import Effect
from components.release.gate import report as gate_report
from components.release.promote.records import (
    CanaryResult,
    CanaryRound,
    Outcome,
    Phase,
    PromoteResult,
    PromotionRecord,
    ReplicaOutcome,
    Side,
)
from components.release.results import GateResult, QualityResult, StageResult, Trial, TuneResult, Verdict


def test_every_result_reads_back_equal_to_what_was_written():
    stage = StageResult("m", 3, "m__candidate", "gate:8000", True, [OutputParity("y", True, 1e-6, 1e-5, 0.0, "golden")])
    default, tuned = ServingSettings(max_batch_size=16), ServingSettings(max_batch_size=16, instance_count=2)
    tune = TuneResult(
        "m", 3, default, tuned, 4.0, 8, [Trial(default, 100.0, 2.0), Trial(tuned, 150.0, 2.5, server={"samples": 3})]
    )
    verdict = Verdict("m", 3, "fail", ["p99 +31% [+20, +42] (limit +10%): beyond"], stable_version=2, rounds=5)
    promotion = PromoteResult(
        "m",
        3,
        2,
        ["a:8000", "b:8000"],
        False,
        problems=["b did not answer"],
        after_revert=[ReplicaOutcome("a:8000", [2], True), ReplicaOutcome("b:8000", None, False)],
        canary=CanaryResult(
            "m",
            3,
            2,
            "fail",
            ["failed requests +5.0% [+4.0, +6.0] (limit +1%): beyond"],
            rounds=[CanaryRound(False, "warm-up", Side(40, 2, 2.5, 9.0, "summary"), Side(40, 0, 2.4, None))],
        ),
    )
    record = PromotionRecord("m", 3, Phase.CANARY, 2, "run", ["a:8000", "b:8000"])
    for result in (stage, tune, verdict, promotion, record):
        assert type(result).from_json(result.to_json()) == result
    assert promotion.outcome is Outcome.PARTIAL  # neither promoted nor every replica back on v2
    assert '"gain_pct": 50.0' in tune.to_json()  # derived figures are written for readers, ignored when read


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not JSON"),
        ('{"model": "m", "version": 3, "verdict": "maybe", "reasons": []}', "Verdict.verdict is 'maybe'"),
        ('{"model": "m", "version": "three", "verdict": "pass", "reasons": []}', "Verdict.version is 'three'"),
        ('{"model": "m", "version": 3}', "Verdict has no verdict, reasons"),
        ("[1, 2]", "Verdict is not an object"),
    ],
)
def test_a_file_that_is_not_a_verdict_is_refused_with_what_is_wrong(text, message):
    with pytest.raises(ValueError, match=message):
        Verdict.from_json(text)


def test_the_promotion_record_reads_what_earlier_releases_wrote_and_writes_the_same_keys():
    # root/promotions/<model>.json as promote wrote it before the record was typed (the repository adds "updated")
    earlier = {
        "model": "m",
        "phase": "roll",
        "previous_version": 2,
        "replicas": ["a:8000", "b:8000"],
        "run_id": "run",
        "updated": "2026-12-06T20:00:00.000000Z",
        "version": 3,
    }
    record = PromotionRecord.from_dict(earlier)
    assert record == PromotionRecord("m", 3, Phase.ROLL, 2, "run", ["a:8000", "b:8000"])
    assert json.loads(record.to_json()) == {k: v for k, v in earlier.items() if k != "updated"}
    with pytest.raises(ValueError, match="PromotionRecord.phase is 'bake', not one of 'copy', 'canary', 'roll'"):
        PromotionRecord.from_dict({**earlier, "phase": "bake"})


def test_a_verdict_reads_what_earlier_gates_wrote_and_writes_the_same_keys_and_values():
    # verdict.json as the gate wrote it before its lists were typed (fields in their order of then)
    effect = Effect("p99", 0.04, -0.01, 0.09, 0.1, True, "%")
    point = {"concurrency": 4.0, "throughput": 100.0, "p50_us": 1.0, "p90_us": 2.0, "p95_us": 3.0, "p99_us": 4.0}
    run = {"model": "m__candidate", "version": "3", "exit_code": 0, "ok": True, "reason": "", "seconds": 3.2}
    earlier = {
        "model": "m",
        "version": 3,
        "verdict": "pass",
        "reasons": ["ok"],
        "stable_version": 2,
        "effects": [effect.to_dict()],
        "rounds": 1,
        "stopped": "decided",
        "attempts": [
            {
                "round": 1,
                "attempt": 1,
                **run,
                "requests": 5,
                "points": [{**point, "server_queue_us": 5.0, "server_compute_us": 6.0}],
                "stderr_tail": "",
            }
        ],
        "measurement_seconds": 3.0,
        "stable_load_seconds": 0.0,
        "gate_wait_s": 0.0,
        "gate_url": "g:8000",
        "calibration": None,
        "settings": {"concurrency": 4},
        "tuning": None,
        "server": {},
        "candidate_summary": {"p99_ms": 2.0},
        "stable_summary": {"p99_ms": 2.0},
        "candidate_rounds": [{"throughput": 3.0, "p50_ms": 1.5, "p99_ms": 2.0}],
        "stable_rounds": [{"throughput": 3.0, "p50_ms": 1.5, "p99_ms": None}],
        "p99_regression_pct": 4.0,
        "throughput_regression_pct": None,
        "quality": None,
        "speed_verdict": None,
    }
    verdict = Verdict.from_dict(earlier)
    assert verdict.effect("p99") == effect and verdict.attempts[0].points[0].p99_us == 4.0
    assert verdict.candidate_rounds[0].p50_ms == 1.5 and verdict.p99_regression_pct == 4.0
    assert json.loads(verdict.to_json()) == earlier


# ------------------------------------------------------------------------------------------------- the reports
P99_WITHIN = Effect("p99", 0.04, -0.02, 0.098, 0.10, True, "%")
P99_BEYOND = Effect("p99", 0.31, 0.20, 0.42, 0.10, True, "%")
P99_STRADDLES = Effect("p99", 0.06, -0.01, 0.13, 0.10, True, "%")
THROUGHPUT = Effect("throughput", -0.01, -0.05, 0.03, 0.10, True, "%")
ACCURACY_BEYOND = Effect("accuracy", -0.03, -0.05, -0.02, -0.01, False, "")
ACCURACY_STRADDLES = Effect("accuracy", -0.01, -0.03, 0.004, -0.02, False, "")


def _quality(decision: str, effect: Effect, more_rows: int = 0) -> QualityResult:
    reason = effect.describe() + (f"; about {more_rows:,} more rows would decide" if more_rows else "")
    return QualityResult(
        "m",
        3,
        2,
        decision,
        [reason],
        "s3://b/eval.parquet",
        500,
        0.9,
        effects=[{**effect.to_dict(), "more_rows": more_rows}],
    )


def _gated(effects: list[Effect], reasons: list[str], verdict: str, quality: QualityResult | None = None) -> GateResult:
    result = GateResult("m", 3, verdict, reasons, 2, effects=effects, rounds=4, settings={"confidence": 0.9})
    for side in (result.candidate, result.stable):
        side.add(np.array([1.0, 1.5, 2.0]), 1.0)
    if quality is not None:  # as gate.gate folds it in
        result.quality, result.speed_verdict = quality, verdict
        if quality.decision != "pass":
            result.verdict = quality.decision if verdict == "pass" else verdict
            result.reasons = [f"quality: {r}" for r in quality.reasons] + reasons
    return result


GATE_RESULTS = {
    "pass": _gated([P99_WITHIN, THROUGHPUT], [P99_WITHIN.describe(), THROUGHPUT.describe()], "pass"),
    "fail": _gated([P99_BEYOND, THROUGHPUT], [P99_BEYOND.describe()], "fail"),
    "inconclusive": _gated(
        [P99_STRADDLES, THROUGHPUT],
        [f"still undecided when the 60 s budget was spent: {P99_STRADDLES.describe()} (the rounds disagree)"],
        "inconclusive",
    ),
    "quality fails": _gated(
        [P99_WITHIN, THROUGHPUT],
        [P99_WITHIN.describe(), THROUGHPUT.describe()],
        "pass",
        _quality("fail", ACCURACY_BEYOND),
    ),
    "quality undecided": _gated(
        [P99_WITHIN, THROUGHPUT],
        [P99_WITHIN.describe(), THROUGHPUT.describe()],
        "pass",
        _quality("inconclusive", ACCURACY_STRADDLES, more_rows=1200),
    ),
}


@pytest.mark.parametrize("case", GATE_RESULTS)
def test_the_gate_report_says_each_limits_figure_once_beside_its_plot(case, tmp_path):
    result = GATE_RESULTS[case]
    gate_report.write(result, tmp_path)
    page, text = (tmp_path / "report.html").read_text(), (tmp_path / "report.md").read_text()
    figures = [e.describe() for e in result.effects]
    figures += [e["text"] for e in result.quality.effects] if result.quality else []
    for figure in figures:
        assert page.count(html.escape(figure)) == 1, (figure, page.split("<img")[0])
        assert text.count(figure) == 1, (figure, text)
    assert page.count("more rows would decide") == text.count("more rows would decide") == ("undecided" in case)
    assert 'src="data:image/png;base64,' in page  # each limit's interval, plotted


def test_the_pipelines_canary_report_is_the_clis_with_its_plot(tmp_path, monkeypatch):
    from components.release.promote import canary_report, promote
    from components.release.step_settings import PIPELINE_STEPS
    from pipelines.kfp_components import promote_op

    beyond = Effect("mean latency", 0.25, 0.12, 0.38, 0.10, True, "%")
    side = Side(400, 0, 2.5, None)
    canary = CanaryResult(
        "m",
        3,
        2,
        "fail",
        [beyond.describe()],
        ["prod-0"],
        ["prod-1"],
        effects=[beyond.to_dict()],
        calibration=[CanaryRound(True, "", side, side)],
        rounds=[CanaryRound(True, "", replace(side, mean_ms=3.1), side)],
        counted_rounds=1,
        outcome="reverted",
        settings={"round_s": 30.0, "min_requests": 20},
    )
    rejected = PromoteResult("m", 3, 2, ["a:8000", "b:8000"], False, reverted=True, canary=canary)

    def reverting_canary(*_args, **_kwargs):
        return rejected  # the canary's revert is an outcome, not an error

    monkeypatch.setattr(promote, "promote", reverting_canary)
    report, report_html = (SimpleNamespace(path=str(tmp_path / name)) for name in ("report.md", "report.html"))
    default = ServingSettings(max_batch_size=16)
    promoted = promote_op.python_func(
        repository="s3://b",
        model_name="m",
        version=3,
        replicas="a:8000,b:8000",
        gate="gate:8000",
        verdict_json=Verdict("m", 3, "pass", []).to_json(),
        tuning_json=TuneResult("m", 3, default, default, None, 1).to_json(),
        s3_endpoint="http://s3:9000",
        run_id="run",
        settings=PIPELINE_STEPS.settings({})["promote"],
        report=report,
        report_html=report_html,
    )
    assert promoted.promoted is False and PromoteResult.from_json(promoted.promote_json).outcome is Outcome.REVERTED
    canary_report.write(canary, tmp_path / "cli")  # `tritonship promote --out`
    page = Path(report_html.path).read_text()
    assert page == (tmp_path / "cli" / "report.html").read_text()
    assert Path(report.path).read_text() == (tmp_path / "cli" / "report.md").read_text()
    assert '<img alt="the interval of each limit against the limit" src="data:image/png;base64,' in page
