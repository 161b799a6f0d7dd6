"""The canary's decisions (components/release/promote/canary.py) from rounds recorded on the real stack, with no replica,
no metrics endpoint and no real waiting: a Canary takes its rounds from a replay of
benchmarks/results/canary_quality.json and its time from a clock that moves only when slept on.

The recorded rounds are 60 canaries measured by benchmarks/canary_quality.py (40 equal candidates that passed,
20 slower ones that failed), under the settings in the file's summary: rounds of 3 s, 8 counted rounds before a
decision, at most 60 s. Each test below changes one thing in those rounds or settings and checks the decision."""

from __future__ import annotations

import itertools
import json
import re
import time
from collections.abc import Iterator
from copy import deepcopy
from dataclasses import replace
from pathlib import Path

import pytest

from components.release.promote.canary import Canary, CanaryFault, RoundSource, Watch, decide, why_reverted
from components.release.promote.records import CanaryResult, CanaryRound
from components.release.promote.settings import SUMMARY_WINDOW_S, CanarySettings
from components.serving.replicas import Replica
from tests.clocks import StepClock

RECORDED = json.loads((Path(__file__).parents[1] / "benchmarks" / "results" / "canary_quality.json").read_text())
RECORDED_SETTINGS = CanarySettings(**RECORDED["summary"]["settings"])  # round_s 3, min_rounds 8, max_bake_s 60
RECORDED_AA = next(d for d in RECORDED["decisions"] if d["kind"] == "aa")  # an equal candidate: passed
RECORDED_SLOW = next(d for d in RECORDED["decisions"] if d["kind"] == "slow")  # a slower candidate: failed
WATCH = Watch("sequence", 2, 1, {})
CANARY, BASELINE = [Replica("prod-0", "127.0.0.1:1")], [Replica("prod-1", "127.0.0.1:2")]
# rounds as long as Triton's summary window, so the p99 takes part (the production default)
MINUTE_ROUNDS = replace(RECORDED_SETTINGS, round_s=SUMMARY_WINDOW_S, max_bake_s=15 * SUMMARY_WINDOW_S)


def as_read(figures: dict) -> CanaryRound:
    """A recorded round as the live source gives it: the canary itself marks the first round after the switch."""
    read = CanaryRound.from_dict(figures)
    return replace(read, counted=True, note="") if read.note.startswith("warm-up") else read


def replay(
    before: list[dict], after: list[dict], clock: StepClock, round_s: float, drawn: list[CanaryRound]
) -> RoundSource:
    """The recorded rounds before the switch (both sides on stable), then those after it, one every `round_s` of
    `clock`; from the start again when the canary asks for more rounds than were recorded (the live source never
    ends). Every round handed out is appended to `drawn`."""

    def source(watch: Watch) -> Iterator[CanaryRound]:
        for figures in itertools.cycle(before if watch.candidate == watch.stable else after):
            clock.sleep(round_s)
            drawn.append(as_read(figures))
            yield drawn[-1]

    return source


def replay_bake(
    before: list[dict], after: list[dict], settings: CanarySettings = RECORDED_SETTINGS
) -> tuple[CanaryResult, bool, StepClock]:
    """A canary on recorded rounds: its result, whether it let promote switch, and the clock it ran on."""
    clock = StepClock()
    result, switched = measured(settings, clock, replay(before, after, clock, settings.round_s, []))
    return result, switched, clock


def measured(settings: CanarySettings, clock: StepClock, source: RoundSource) -> tuple[CanaryResult, bool]:
    """A Canary as promote runs it: the rounds before the switch, then, when they let promote switch the canary
    replicas, the rounds after it. Its result, and whether it switched."""
    canary = Canary(WATCH, CANARY, BASELINE, settings, clock=clock, rounds=source)
    switched = canary.before_switch()
    return (canary.after_switch() if switched else canary.result), switched


def changed(rounds: list[dict], sides: tuple[str, ...], **values: float | None) -> list[dict]:
    """The rounds with the given figures set on the given sides."""
    out = deepcopy(rounds)
    for figures in out:
        for side in sides:
            figures[side].update(values)
    return out


def scaled(rounds: list[dict], side: str, name: str, factor: float) -> list[dict]:
    """The rounds with one side's figure multiplied by `factor`."""
    out = deepcopy(rounds)
    for figures in out:
        figures[side][name] *= factor
    return out


def starved(rounds: list[dict], settings: CanarySettings = RECORDED_SETTINGS) -> list[dict]:
    """The rounds with too few live requests on the canary side, marked as the live source marks them."""
    out = changed(rounds, ("canary",), requests=settings.min_requests - 1)
    note = f"fewer than {settings.min_requests} live requests on the canary side"
    for figures in out:
        figures["counted"], figures["note"] = False, note
    return out


def effect(result: CanaryResult, name: str) -> dict:
    return next(e for e in result.effects if e["name"] == name)


def test_every_recorded_decision_is_reached_again_from_its_rounds_with_the_anytime_valid_intervals():
    # recorded with the previous fixed-sample intervals: 40 equal candidates passed, 20 slower ones failed
    for recorded in RECORDED["decisions"]:
        result, switched, _ = replay_bake(recorded["calibration"], recorded["rounds"])
        assert switched and result.decision == recorded["decision"] == {"aa": "pass", "slow": "fail"}[recorded["kind"]]
        assert len(result.rounds) <= len(recorded["rounds"]) and result.reasons == [e["text"] for e in result.effects]
    assert [d["decision"] for d in RECORDED["decisions"]].count("pass") == 40


def test_a_recorded_equal_candidate_passes_and_is_promoted():
    result, switched, _ = replay_bake(RECORDED_AA["calibration"], RECORDED_AA["rounds"])
    assert switched and result.decision == "pass"
    assert result.stopped == "decided after 8 counted rounds" and result.counted_rounds == 8
    assert {e["name"]: e["status"] for e in result.effects} == {"mean latency": "within", "failed requests": "within"}
    assert decide(result, RECORDED_SETTINGS) and result.outcome == "promoted"


def test_a_recorded_slower_candidate_fails_on_mean_latency_and_is_reverted():
    result, switched, _ = replay_bake(RECORDED_SLOW["calibration"], RECORDED_SLOW["rounds"])
    assert switched and result.decision == "fail"
    latency = effect(result, "mean latency")
    assert latency["status"] == "beyond" and latency["low"] > RECORDED_SETTINGS.max_latency_regression_pct / 100
    assert effect(result, "failed requests")["status"] == "within"
    assert not decide(result, RECORDED_SETTINGS) and result.outcome == "reverted"
    assert re.match(
        r"the canary of sequence v2 failed on live traffic: mean latency \+\d+\.\d% .*: beyond", why_reverted(result)
    )


def test_a_regressed_p99_fails_with_rounds_as_long_as_the_summary_window():
    # the candidate's p99 twice the recorded one, its mean latency as recorded
    after = scaled(RECORDED_AA["rounds"], "canary", "p99_ms", 2.0)
    result, _, _ = replay_bake(RECORDED_AA["calibration"], after, MINUTE_ROUNDS)
    assert result.decision == "fail"
    assert effect(result, "p99")["status"] == "beyond" and effect(result, "mean latency")["status"] == "within"
    unchanged, _, _ = replay_bake(RECORDED_AA["calibration"], RECORDED_AA["rounds"], MINUTE_ROUNDS)
    assert unchanged.decision == "pass" and effect(unchanged, "p99")["status"] == "within"


def test_a_regressed_p99_is_not_judged_with_rounds_shorter_than_the_summary_window():
    after = scaled(RECORDED_AA["rounds"], "canary", "p99_ms", 2.0)
    short = replace(RECORDED_SETTINGS, round_s=1.0, max_p99_ms=0.1)  # nor the absolute p99 limit, far below
    result, _, _ = replay_bake(RECORDED_AA["calibration"], after, short)
    assert result.decision == "pass"
    assert {e["name"] for e in result.effects} == {"mean latency", "failed requests"}


@pytest.mark.parametrize(
    ("limit", "name", "figure"),
    [("max_latency_ms", "canary mean latency", "mean_ms"), ("max_p99_ms", "canary p99", "p99_ms")],
)
@pytest.mark.parametrize(("factor", "decision", "status"), [(0.5, "fail", "beyond"), (2.0, "pass", "within")])
def test_an_absolute_limit_fails_below_the_canarys_own_figures_and_passes_above(
    limit, name, figure, factor, decision, status
):
    values = [r["canary"][figure] for r in RECORDED_AA["rounds"]]
    bound = factor * (min(values) if factor < 1 else max(values))
    settings = replace(MINUTE_ROUNDS, **{limit: bound})
    result, _, _ = replay_bake(RECORDED_AA["calibration"], RECORDED_AA["rounds"], settings)
    assert result.decision == decision and effect(result, name)["status"] == status


def test_failures_added_on_the_canary_side_fail():
    after = changed(RECORDED_AA["rounds"], ("canary",), failures=10)  # about 1.2% of its live requests
    result, _, _ = replay_bake(RECORDED_AA["calibration"], after)
    assert result.decision == "fail"
    failed = effect(result, "failed requests")
    assert failed["status"] == "beyond" and failed["estimate"] == pytest.approx(0.0117, abs=0.0005)
    assert effect(result, "mean latency")["status"] == "within"  # over the successes: as recorded


@pytest.mark.parametrize("sides", [("canary", "baseline"), ("canary",)], ids=["both sides", "the canary replica"])
def test_the_same_failures_before_and_after_the_switch_pass(sides):
    before = changed(RECORDED_AA["calibration"], sides, failures=10)
    after = changed(RECORDED_AA["rounds"], sides, failures=10)
    result, _, _ = replay_bake(before, after)
    assert result.decision == "pass" and effect(result, "failed requests")["status"] == "within"


def test_too_few_live_requests_before_the_switch_is_inconclusive_and_switches_nothing():
    result, switched, clock = replay_bake(starved(RECORDED_AA["calibration"]), RECORDED_AA["rounds"])
    assert not switched and result.decision == "inconclusive" and result.rounds == []
    assert result.reasons == [
        "too few live requests before the switch: 0 of 20 rounds had 20 or more on each side, 8 are needed"
    ]
    assert result.stopped == "nothing was switched: the replicas could not be compared"
    assert clock.seconds == 60.0  # 20 rounds of 3 s: the longest bake


def test_too_few_live_requests_after_the_switch_is_inconclusive():
    result, switched, _ = replay_bake(RECORDED_AA["calibration"], starved(RECORDED_AA["rounds"]))
    assert switched and result.decision == "inconclusive"
    assert result.counted_rounds == 0 and result.effects == [] and len(result.rounds) == 20
    assert result.reasons == ["too few live requests: 0 of 20 rounds had 20 or more on each side, 8 are needed"]


# after the switch the canary's mean latency is its own before the switch plus the limit itself (+10%)
AT_THE_LIMIT = scaled(RECORDED_AA["calibration"], "canary", "mean_ms", 1.10)


def test_an_effect_straddling_its_limit_until_the_longest_bake_is_inconclusive():
    result, switched, _ = replay_bake(RECORDED_AA["calibration"], AT_THE_LIMIT)
    assert switched and result.decision == "inconclusive"
    assert effect(result, "mean latency")["status"] == "straddles"
    assert len(result.reasons) == 1 and result.reasons[0].startswith("still undecided: mean latency +10")
    assert result.stopped == "the longest bake (60 s) was spent" and result.counted_rounds == 19


@pytest.mark.parametrize("policy", ["revert", "promote"])
def test_decide_turns_an_inconclusive_canary_into_what_on_inconclusive_says(policy):
    settings = replace(RECORDED_SETTINGS, on_inconclusive=policy)
    result, _, _ = replay_bake(RECORDED_AA["calibration"], AT_THE_LIMIT, settings)
    assert result.decision == "inconclusive"
    assert decide(result, settings) == (policy == "promote")
    assert result.outcome == {"revert": "reverted", "promote": "promoted"}[policy]
    assert "was inconclusive: still undecided: mean latency" in why_reverted(result)


def test_the_first_round_after_the_switch_is_never_counted():
    def failing_round(at: int) -> list[dict]:
        """The recorded rounds after the switch with every canary request of round `at` failed."""
        after = deepcopy(RECORDED_AA["rounds"])
        after[at]["canary"].update(failures=after[at]["canary"]["requests"], mean_ms=None)
        return after

    result, _, _ = replay_bake(RECORDED_AA["calibration"], failing_round(0))
    assert result.decision == "pass" and effect(result, "failed requests")["estimate"] == 0.0
    assert not result.rounds[0].counted and result.rounds[0].note.startswith("warm-up")
    assert result.counted_rounds == 8 and len(result.rounds) == 9
    # the same round second instead of first counts: the canary no longer passes, and is reverted
    second, _, _ = replay_bake(RECORDED_AA["calibration"], failing_round(1))
    failures = effect(second, "failed requests")
    assert second.decision != "pass" and failures["status"] != "within" and failures["estimate"] > 0.1
    assert not decide(second, RECORDED_SETTINGS)


def test_the_bake_ends_before_max_bake_s_would_be_exceeded_on_the_fake_clock(monkeypatch):
    def no_real_waiting(seconds: float) -> None:
        raise AssertionError(f"time.sleep({seconds}) during a replayed bake")

    monkeypatch.setattr(time, "sleep", no_real_waiting)
    settings = replace(RECORDED_SETTINGS, max_bake_s=50.0)
    clock, drawn = StepClock(), []
    source = replay(RECORDED_AA["calibration"], AT_THE_LIMIT, clock, settings.round_s, drawn)
    result, _ = measured(settings, clock, source)
    # before the switch: 8 rounds of 3 s; after it, 16 (48 s: a 17th would end at 51 s, beyond the 50)
    assert result.decision == "inconclusive" and result.stopped == "the longest bake (50 s) was spent"
    assert len(result.calibration) == 8 and len(result.rounds) == 16 and len(drawn) == 24
    assert clock.seconds == 72.0 and result.seconds == 72.0


def test_a_canary_that_cannot_be_measured_fails_at_once():
    clock = StepClock()
    recorded = replay(RECORDED_AA["calibration"], RECORDED_AA["rounds"], clock, RECORDED_SETTINGS.round_s, [])

    def source(watch: Watch) -> Iterator[dict]:
        rounds = recorded(watch)
        if watch.candidate != watch.stable:
            yield next(rounds)
            raise CanaryFault("the canary prod-0 no longer serves sequence v2 (restarted or unloaded)")
        yield from rounds

    result, _ = measured(RECORDED_SETTINGS, clock, source)
    assert result.decision == "fail" and result.stopped == "the canary could not be measured"
    assert result.reasons == ["the canary prod-0 no longer serves sequence v2 (restarted or unloaded)"]
    assert len(result.rounds) == 1 and clock.seconds == 27.0  # 8 rounds before the switch, 1 after
