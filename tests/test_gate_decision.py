"""The gate's decision rule on synthetic latency samples: intervals against limits, sequentially.

The samples are drawn from known distributions (lognormal latencies, like a server's), so each test
knows the true effect; the perf_analyzer runs are synthetic PerfRun objects with those requests."""

from __future__ import annotations

import numpy as np
import pytest

from components.release.effects import Effect, Rounds, effects, judge, round_requests
from components.release.gate.gate import measure_sequentially
from components.release.results import GateResult
from components.serving import perf
from components.settings import GateSettings, Limits, Thresholds

WINDOW_NS = 1_000_000_000


def _requests(
    rng: np.random.Generator, start_ns: int, scale_ms: float, sigma: float, seconds: int = 3
) -> perf.Requests:
    """About 500 requests a second for `seconds`, latencies lognormal around `scale_ms`."""
    n = 500 * seconds
    starts = np.sort(rng.integers(start_ns, start_ns + seconds * WINDOW_NS, n))
    latencies_ms = scale_ms * rng.lognormal(0.0, sigma, n)
    return perf.Requests(starts, latencies_ms * 1000, (start_ns, start_ns + seconds * WINDOW_NS))


def _run(model: str, requests: perf.Requests, exit_code: int = 0) -> perf.PerfRun:
    point = perf.LoadPoint(1, 500, 0, 0, 0, 0, 0, 0)
    ok = exit_code == 0
    return perf.PerfRun(
        model, "1", exit_code, [point] if ok else [], requests=requests if ok else perf.Requests.empty()
    )


class FakeRounds:
    """Rounds of a duet: candidate latencies `ratio` times the stable's, both scaled by a common
    per-round machine noise (what the duet cancels), plus their own sampling noise."""

    def __init__(self, ratio: float, sigma: float = 0.4, machine_noise: float = 0.3, exit_codes=(), seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.ratio, self.sigma, self.machine_noise = ratio, sigma, machine_noise
        self.exit_codes = list(exit_codes)  # the candidate's exit code per attempt, then 0
        self.calls = 0
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def __call__(self, round_index: int) -> list[perf.PerfRun]:
        self.calls += 1
        self.now += 4.0  # a round of three 1 s windows and perf_analyzer's start
        start = self.calls * 10 * WINDOW_NS
        busy = float(np.exp(self.rng.normal(0, self.machine_noise)))
        exit_code = self.exit_codes.pop(0) if self.exit_codes else 0
        return [
            _run("m__candidate", _requests(self.rng, start, self.ratio * busy, self.sigma), exit_code),
            _run("m", _requests(self.rng, start, busy, self.sigma)),
        ]


def _gate(
    rounds: FakeRounds, thresholds: Thresholds, budget_s: float = 90.0, started: float | None = None
) -> GateResult:
    result = GateResult("m", 2, "inconclusive", [], 1)
    settings = GateSettings(thresholds=thresholds, budget_s=budget_s)
    measure_sequentially(result, settings, rounds, with_stable=True, clock=rounds.clock, started=started)
    return result


def test_equal_candidate_passes_as_soon_as_the_interval_is_within_the_limit():
    rounds = FakeRounds(ratio=1.0)
    result = _gate(rounds, Thresholds())
    assert result.verdict == "pass", result.reasons
    assert result.rounds == rounds.calls < 15  # decided early
    p99 = result.effect("p99")
    assert p99.status == "within" and p99.low < 0 < p99.high < 0.10
    assert "p99 " in p99.describe() and "(limit +10%)" in p99.describe()


def test_a_wide_interval_wholly_within_a_loose_limit_passes():
    # much noisier samples: a wide interval, but the limit is looser still
    result = _gate(
        FakeRounds(ratio=1.0, sigma=1.2), Thresholds(max_p99_regression_pct=60, max_throughput_regression_pct=60)
    )
    p99 = result.effect("p99")
    assert result.verdict == "pass", result.reasons
    assert p99.high - p99.low > 0.10  # wide...
    assert p99.high < 0.60  # ...and wholly within


def test_a_candidate_wholly_beyond_the_limit_fails_with_its_interval_in_the_reason():
    result = _gate(FakeRounds(ratio=1.5), Thresholds())
    assert result.verdict == "fail"
    p99 = result.effect("p99")
    assert p99.status == "beyond" and p99.low > 0.10
    assert any(r.startswith("p99 +") and "(limit +10%): beyond" in r for r in result.reasons)


def test_a_candidate_at_the_limit_measures_until_the_budget_then_is_inconclusive():
    rounds = FakeRounds(ratio=1.10)  # exactly at the +10% limit: no amount of data settles it
    result = _gate(rounds, Thresholds(max_throughput_regression_pct=None), budget_s=60)
    assert result.verdict == "inconclusive"
    assert result.rounds > 3 and rounds.calls == result.rounds  # more rounds were added before giving up
    assert rounds.now <= 60
    assert "budget was spent" in result.stopped and "straddles" in result.reasons[0]


def test_the_budget_counts_the_whole_decision_loading_included():
    # loading the stable version and warming up took 20 s before the first round: 40 s are left for rounds
    rounds = FakeRounds(ratio=1.10)
    result = _gate(rounds, Thresholds(max_throughput_regression_pct=None), budget_s=60, started=-20.0)
    assert result.verdict == "inconclusive"
    assert rounds.now + 20 <= 60 and rounds.calls == 10  # ten 4 s rounds fill the 40 s left


def test_perf_analyzer_exit_2_on_one_round_is_measured_again_not_inconclusive():
    rounds = FakeRounds(ratio=1.0, exit_codes=[0, 2])  # round 2's first attempt did not stabilise
    result = _gate(rounds, Thresholds())
    assert result.verdict == "pass", result.reasons
    assert rounds.calls == result.rounds + 1
    attempts = [(a.round, a.attempt, a.exit_code) for a in result.attempts if a.model == "m__candidate"]
    assert attempts[:3] == [(1, 1, 0), (2, 1, 2), (2, 2, 0)]  # every attempt is in verdict.json


def test_a_round_that_never_stabilises_is_inconclusive_after_its_attempts():
    result = _gate(FakeRounds(ratio=1.0, exit_codes=[2, 2, 2]), Thresholds())
    assert result.verdict == "inconclusive" and "in 3 attempt(s)" in result.reasons[0]


@pytest.mark.parametrize(("code", "words"), [(3, "no valid requests"), (99, "unreachable"), (-9, "exited -9")])
def test_a_crash_no_requests_or_an_unreachable_server_fails(code, words):
    result = _gate(FakeRounds(ratio=1.0, exit_codes=[code]), Thresholds())
    assert result.verdict == "fail" and words in result.reasons[0]


def test_first_release_absolute_limits_get_intervals_too():
    rng = np.random.default_rng(1)
    measured = Rounds()
    for _ in range(5):
        measured.add(rng.lognormal(0, 0.3, 1500), 3.0)
    fast = effects(measured, None, Limits(max_p99_ms=10, min_throughput=100))
    assert [e.name for e in fast] == ["candidate p99", "candidate throughput"]
    assert judge(fast) == "pass" and all(e.low <= e.estimate <= e.high for e in fast)
    assert judge(effects(measured, None, Limits(max_p99_ms=0.5))) == "fail"
    assert judge(effects(measured, None, Limits(min_throughput=1000))) == "fail"


def test_effect_status_and_words():
    worse = Effect("p99", 0.041, -0.02, 0.098, 0.10, True, "%")
    assert worse.status == "within" and worse.describe() == "p99 +4.1% [-2.0, +9.8] (limit +10%): within"
    drop = Effect("throughput", -0.2, -0.25, -0.15, -0.10, False, "%")
    assert drop.status == "beyond" and "(limit -10%)" in drop.describe()
    assert Effect("throughput", -0.1, -0.15, -0.05, -0.10, False, "%").status == "straddles"


def test_a_duet_round_counts_only_the_seconds_both_runs_measured():
    rng = np.random.default_rng(0)
    a = _requests(rng, 0, 1.0, 0.1)
    b = _requests(rng, WINDOW_NS // 2, 1.0, 0.1)  # started half a second later
    c_ms, s_ms, c_s, s_s = round_requests(a, b, duet=True)
    assert c_s == s_s == 2.5
    assert abs(c_ms.size - 1250) < 100 and abs(s_ms.size - 1250) < 100
    assert round_requests(a, b, duet=False)[2:] == (3.0, 3.0)  # alternating: each run's own span
