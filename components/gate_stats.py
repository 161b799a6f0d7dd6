"""The gate's statistics: effects with intervals, judged against the limits (docs/design.md section 4).

What is compared
    A **round** is one perf_analyzer run per model (three windows, about 3 s). In the duet design (the
    default) both runs start at the same moment against the same gate server, and only the span both
    measured counts: the candidate's and the stable's requests of a round saw the same seconds of the
    machine. In the alternating design a round's runs follow each other. Every request's latency comes
    from perf_analyzer's profile export.

The statistics
    - latency: the p99 (and p50) over **all requests of all rounds pooled**. One second's p99 at
      concurrency 1 is the ~10th slowest of ~1,000 requests and moves ±20% from one second to the next
      on 2 cores; the pooled p99 of ten rounds comes from the ~400 slowest of ~40,000. It is also the
      figure a service-level objective is written in.
    - throughput: requests completed over the measured time, all rounds together.
    - relative effects: the candidate's figure over the stable's, minus 1.

The interval: a delete-one-round jackknife on the log, with Student's t
    - Rounds are the independent units. Requests of one round share its noise (on this machine a
      round's p99 moves between 2 and 4.6 ms); a bootstrap over requests or over the windows of a round
      treats them as independent and gives intervals far too narrow (tried: a synthetic +10% candidate
      came out "[+2.0, +9.6]").
    - The statistic is the pooled figure, a smooth function of whole rounds of thousands of requests,
      so deleting a round at a time (the cluster jackknife) estimates its standard error even though a
      percentile of single observations is not jackknife-smooth.
    - Logs make a ratio's interval symmetric (x2 and x0.5 are equally far from 1) and the t quantile
      with rounds-1 degrees of freedom widens the interval honestly when there are only a few rounds;
      a bootstrap from three to five units cannot.
    - Checked on recorded A/A duets of this machine (benchmarks/README.md): 90% intervals covered the
      truth in 91-98% of subsets of 3, 5 and 8 rounds.

The decision (sequential)
    Each effect is `within` its limit when the whole interval is on the good side, `beyond` when the
    whole interval is past it, else it `straddles`. After every round from `min_rounds` on: fail as
    soon as one effect is beyond; pass when every effect is within; otherwise measure another round
    until the time budget is spent, and only then call it inconclusive. Looking after every round
    lets a clear case stop early; the 90% two-sided interval (95% on each side) keeps the chance that
    a look falsely fails an equal candidate small, which benchmarks/gate_quality.py measures.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from scipy import stats

MIN_ROUNDS = 4  # below three degrees of freedom the jackknife's own error is too large to stop on
CONFIDENCE = 0.90

Status = Literal["within", "beyond", "straddles"]


@dataclass
class Rounds:
    """One model's measurement, round by round: every request's latency (ms) and the seconds measured."""

    latencies_ms: list[np.ndarray] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)

    def add(self, latencies_ms: np.ndarray, seconds: float) -> None:
        self.latencies_ms.append(np.asarray(latencies_ms, dtype=np.float64))
        self.seconds.append(float(seconds))

    def __len__(self) -> int:
        return len(self.seconds)

    def without(self, index: int) -> Rounds:
        keep = [i for i in range(len(self)) if i != index]
        return Rounds([self.latencies_ms[i] for i in keep], [self.seconds[i] for i in keep])

    @property
    def requests(self) -> int:
        return int(sum(w.size for w in self.latencies_ms))

    def percentile(self, q: float) -> float | None:
        if not self.requests:
            return None
        return float(np.percentile(np.concatenate(self.latencies_ms), q, method="inverted_cdf"))

    def p99(self) -> float | None:
        return self.percentile(99)

    def throughput(self) -> float | None:
        return self.requests / sum(self.seconds) if self.seconds and sum(self.seconds) > 0 else None

    def per_round(self) -> list[dict[str, float | None]]:
        """Each round's own figures, for the report."""
        return [
            {
                "throughput": lat.size / sec if sec > 0 else None,
                "p50_ms": float(np.percentile(lat, 50)) if lat.size else None,
                "p99_ms": float(np.percentile(lat, 99)) if lat.size else None,
            }
            for lat, sec in zip(self.latencies_ms, self.seconds, strict=True)
        ]

    def summary(self) -> dict[str, float | int | None]:
        return {
            "throughput": self.throughput(),
            "p50_ms": self.percentile(50),
            "p99_ms": self.p99(),
            "requests": self.requests,
            "rounds": len(self),
        }


@dataclass
class Effect:
    """One limit's figure: its estimate, its interval and where the interval lies against the limit.

    Relative effects are fractions (0.041 = +4.1%); absolute ones are in their unit (ms, 1/s)."""

    name: str
    estimate: float
    low: float
    high: float
    limit: float
    higher_is_worse: bool
    unit: Literal["%", "ms", "/s"]

    @property
    def status(self) -> Status:
        worst, best = (self.high, self.low) if self.higher_is_worse else (-self.low, -self.high)
        limit = self.limit if self.higher_is_worse else -self.limit
        if worst <= limit:
            return "within"
        if best > limit:
            return "beyond"
        return "straddles"

    def describe(self) -> str:
        """For example "p99 +4.1% [-2.0, +9.8] (limit +10%): within"."""
        if self.unit == "%":
            fmt = lambda v: f"{v * 100:+.1f}"  # noqa: E731
            text = (
                f"{self.name} {fmt(self.estimate)}% [{fmt(self.low)}, {fmt(self.high)}] (limit {self.limit * 100:+g}%)"
            )
        else:
            spec = ".2f" if self.unit == "ms" else ",.0f"
            bound = "≤" if self.higher_is_worse else "≥"
            text = (
                f"{self.name} {self.estimate:{spec}} {self.unit} [{self.low:{spec}}, {self.high:{spec}}] "
                f"(limit {bound} {self.limit:g} {self.unit})"
            )
        return f"{text}: {self.status}"

    def to_dict(self) -> dict[str, object]:
        return {**self.__dict__, "status": self.status, "text": self.describe()}


@dataclass(frozen=True)
class Limits:
    """The limits that apply to one decision; None is off. Relative ones are fractions (0.10 = 10%)."""

    max_p99_ms: float | None = None
    min_throughput: float | None = None
    max_p99_increase: float | None = None
    max_throughput_drop: float | None = None


def jackknife_interval(
    statistic: Callable[[int | None], float], rounds: int, confidence: float = CONFIDENCE
) -> tuple[float, float, float]:
    """Estimate and t-interval of log(statistic), by deleting one round at a time; back on the
    statistic's own scale. `statistic(None)` uses every round, `statistic(i)` all but round i."""
    full = np.log(statistic(None))
    if rounds < 2:
        return float(np.exp(full)), 0.0, float("inf")
    leave_one_out = np.log([statistic(i) for i in range(rounds)])
    se = np.sqrt((rounds - 1) / rounds * np.sum((leave_one_out - leave_one_out.mean()) ** 2))
    half = stats.t.ppf(0.5 + confidence / 2, rounds - 1) * se
    return float(np.exp(full)), float(np.exp(full - half)), float(np.exp(full + half))


def _ratio(
    candidate: Rounds, stable: Rounds, figure: Callable[[Rounds], float | None]
) -> Callable[[int | None], float]:
    def statistic(drop: int | None) -> float:
        c, s = (candidate, stable) if drop is None else (candidate.without(drop), stable.without(drop))
        return max(figure(c) or 0.0, 1e-12) / max(figure(s) or 0.0, 1e-12)

    return statistic


def _own(candidate: Rounds, figure: Callable[[Rounds], float | None]) -> Callable[[int | None], float]:
    return lambda drop: max(figure(candidate if drop is None else candidate.without(drop)) or 0.0, 1e-12)


def effects(candidate: Rounds, stable: Rounds | None, limits: Limits, confidence: float = CONFIDENCE) -> list[Effect]:
    """One Effect per limit that applies. `stable` (paired round by round) is needed for relative limits."""
    n = len(candidate)
    if n == 0 or not candidate.requests:
        return []
    out: list[Effect] = []
    if limits.max_p99_ms is not None:
        out.append(Effect("candidate p99", *jackknife_interval(_own(candidate, Rounds.p99), n, confidence),
                          limits.max_p99_ms, True, "ms"))  # fmt: skip
    if limits.min_throughput is not None:
        out.append(Effect("candidate throughput", *jackknife_interval(_own(candidate, Rounds.throughput), n, confidence),
                          limits.min_throughput, False, "/s"))  # fmt: skip
    if stable is None or (limits.max_p99_increase is None and limits.max_throughput_drop is None):
        return out
    if len(stable) != n or not stable.requests:
        raise ValueError("the stable measurement must have one round for each of the candidate's")
    for name, figure, limit, worse_up in (
        ("p99", Rounds.p99, limits.max_p99_increase, True),
        ("throughput", Rounds.throughput, None if limits.max_throughput_drop is None else -limits.max_throughput_drop, False),
    ):  # fmt: skip
        if limit is not None:
            ratio, low, high = jackknife_interval(_ratio(candidate, stable, figure), n, confidence)
            out.append(Effect(name, ratio - 1, low - 1, high - 1, limit, worse_up, "%"))
    return out


def judge(found: list[Effect]) -> Literal["pass", "fail", "undecided"]:
    """fail if any effect is beyond its limit, pass if all are within, else undecided (measure more)."""
    if any(e.status == "beyond" for e in found):
        return "fail"
    if found and all(e.status == "within" for e in found):
        return "pass"
    return "undecided"
