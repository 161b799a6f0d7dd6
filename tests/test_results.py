"""One serialisation for every step's result (components/release/results.py): what is written reads back equal, and
a file that is not the result it claims to be is refused with what is wrong."""

from __future__ import annotations

import pytest

from components.model.model_config import ServingSettings
from components.model.parity import OutputParity
from components.release.results import PromoteResult, ReplicaOutcome, StageResult, Trial, TuneResult, Verdict


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
    )
    for result in (stage, tune, verdict, promotion):
        assert type(result).from_json(result.to_json()) == result
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
