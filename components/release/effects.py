"""The gate's statistics: effects with intervals, judged against the limits (docs/design.md section 4).

What is compared
    A **round** is one perf_analyzer run per model (three windows, about 3.5 s). In the duet design
    (the default) both runs start at the same moment against the same gate server, and only the span
    both measured counts: the candidate's and the stable's requests of a round saw the same seconds of
    the machine. In the alternating design a round's runs follow each other. Every request's latency
    comes from perf_analyzer's profile export.

The statistic: per round, then a mean over rounds
    - Each round gives one paired figure: the candidate's p99 over the stable's p99 of that round (its
      ~45th slowest of ~4,500 requests each), and the same for throughput; absolute limits use the
      candidate's own round figures. A round's p99 moves with whatever else the machine does, while
      the duet ratio of the same round moves far less: pairing inside the round is what removes the
      machine's noise (benchmarks/README.md, gate quality, has the figures).
    - The rounds are combined as the mean of the **log ratios**, each round first held within
      `OUTLIER_MADS` median absolute deviations of the rounds' median. Logs make ratios symmetric (x2
      and x0.5 are equally far from 1). The bound is there for the bursts of a busy machine: a burst of
      other work that lands on one perf_analyzer or one backend process makes that round's ratio an
      outlier (one A/A round on record came out +29%), which would otherwise widen the interval for good.

The interval: an anytime-valid confidence sequence
    The gate looks after every round and stops at the first decisive one. A fixed-sample interval is
    built for one look: replayed on recorded A/A rounds (benchmarks/sequential_replay.py), the previous
    design's 90% Yuen intervals, looked at every round, passed a candidate exactly at its limit in up to a
    third of the decisions, where one look allows 5%. The interval here is the anytime-valid t confidence
    sequence of Lindon, Ham, Tingley and Bojinov ("Anytime-valid linear models and regression adjusted
    causal inference", 2024; savvi's `LinearRegression`, whose authors' canary analysis at Netflix uses
    the same tests): Gaussian rounds of unknown variance, and its coverage holds at every round at once,
    so stopping at the first decisive look keeps its error rates. A difference of two periods (the
    canary's before and after its switch) is the coefficient of the period in the same regression.

The decision (sequential)
    Each effect is `within` its limit when the whole interval is on the good side, `beyond` when the
    whole interval is past it, else it `straddles`. After every round from `min_rounds` on: fail as
    soon as one effect is beyond; pass when every effect is within; otherwise measure another round
    until the time budget is spent, and only then call it inconclusive. The 90% two-sided sequence
    (5% on each side) bounds the chance that any look falsely fails an equal candidate, or passes one at
    its limit; benchmarks/sequential_replay.py and benchmarks/gate_quality.py measure both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from savvi.linear_regression import LinearRegression
from scipy import stats

from components.serving import perf
from components.settings import DEFAULT_CONFIDENCE, Limits

WARM_UP_REQUESTS = 50  # sent to each freshly loaded model before its rounds: its first requests are slow
OUTLIER_MADS = 2.5  # a round further from the median than this counts as this far (benchmarks/sequential_replay.py)

Status = Literal["within", "beyond", "straddles"]


def round_requests(
    candidate: perf.Requests, stable: perf.Requests | None, duet: bool
) -> tuple[np.ndarray, np.ndarray | None, float, float]:
    """One round's latencies (ms) of both models and the seconds each measured. In a duet only the span
    both runs measured counts, so both sides of the round saw the same seconds of the machine."""
    sides = [candidate] if stable is None else [candidate, stable]
    if duet:
        common = (max(s.span_ns[0] for s in sides), min(s.span_ns[1] for s in sides))
        spans = [common] * len(sides)
    else:
        spans = [s.span_ns for s in sides]
    cut = [
        (side.latency_us[(side.start_ns >= start) & (side.start_ns <= end)] / 1000, max(end - start, 0) / 1e9)
        for side, (start, end) in zip(sides, spans, strict=True)
    ]
    c_ms, c_s = cut[0]
    s_ms, s_s = cut[1] if stable is not None else (None, 0.0)
    return c_ms, s_ms, c_s, s_s


@dataclass
class RoundFigures:
    """One round of one model, as verdict.json lists them."""

    throughput: float | None
    p50_ms: float | None
    p99_ms: float | None


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

    def per_round(self) -> list[RoundFigures]:
        """Each round's own figures, for the report."""
        return [
            RoundFigures(
                lat.size / sec if sec > 0 else None,
                float(np.percentile(lat, 50)) if lat.size else None,
                float(np.percentile(lat, 99)) if lat.size else None,
            )
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

    Relative effects are fractions (0.041 = +4.1%); absolute ones are in their unit (ms, 1/s, or "" for a quality
    metric's own unit)."""

    name: str
    estimate: float
    low: float
    high: float
    limit: float
    higher_is_worse: bool
    unit: Literal["%", "ms", "/s", ""]

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
            spec = {"ms": ".2f", "/s": ",.0f"}.get(self.unit, ".4f")
            bound = "≤" if self.higher_is_worse else "≥"
            unit = f" {self.unit}" if self.unit else ""
            text = (
                f"{self.name} {self.estimate:{spec}}{unit} [{self.low:{spec}}, {self.high:{spec}}] "
                f"(limit {bound} {self.limit:g}{unit})"
            )
        return f"{text}: {self.status}"

    def to_dict(self) -> dict[str, object]:
        return {**self.__dict__, "status": self.status, "text": self.describe()}


def _held(values: np.ndarray) -> np.ndarray:
    """`values` held within OUTLIER_MADS median absolute deviations of their median (normal-scaled)."""
    spread = stats.median_abs_deviation(values, scale="normal")
    if not spread > 0:
        return values
    middle = np.median(values)
    return np.clip(values, middle - OUTLIER_MADS * spread, middle + OUTLIER_MADS * spread)


def _sequence(y: np.ndarray, design: np.ndarray, confidence: float) -> tuple[float, float]:
    """The anytime-valid interval of the last coefficient of the regression of `y` on `design`."""
    model = LinearRegression(alpha=1 - confidence, p=design.shape[1])
    for row in np.column_stack([y, design]):
        model.update(row)
    if model.nu() <= 0:
        return float("-inf"), float("inf")
    with np.errstate(divide="ignore", invalid="ignore"):
        low, high = model.calculate_conf_int()[-1]
    return (float(low), float(high)) if np.isfinite(low) and np.isfinite(high) else (float("-inf"), float("inf"))


def sequential_interval(
    values: np.ndarray, confidence: float = DEFAULT_CONFIDENCE, robust: bool = True
) -> tuple[float, float, float]:
    """The mean of `values` (each held within OUTLIER_MADS of the median when `robust`) and its anytime-valid
    interval: valid at every look, so a decision may stop at the first decisive one."""
    x = np.asarray(values, dtype=np.float64)
    x = _held(x) if robust else x
    mean = float(x.mean())
    if np.ptp(x) == 0 and x.size > 2:  # nothing varies (no failures anywhere, say): exact
        return mean, mean, mean
    low, high = _sequence(x, np.ones((x.size, 1)), confidence)
    return mean, low, high


def sequential_difference(
    values: np.ndarray, reference: np.ndarray, confidence: float = DEFAULT_CONFIDENCE, robust: bool = True
) -> tuple[float, float, float]:
    """The mean of `values` less that of the independent `reference` sample (each held within OUTLIER_MADS of its
    own median when `robust`), and the difference's anytime-valid interval: the period's coefficient in the
    regression of both samples on (1, is-`values`)."""
    after, before = (np.asarray(v, dtype=np.float64) for v in (values, reference))
    after, before = (_held(after), _held(before)) if robust else (after, before)
    mean = float(after.mean() - before.mean())
    if np.ptp(after) == 0 and np.ptp(before) == 0 and min(after.size, before.size) > 1:
        return mean, mean, mean
    design = np.column_stack([np.ones(after.size + before.size), np.r_[np.ones(after.size), np.zeros(before.size)]])
    low, high = _sequence(np.r_[after, before], design, confidence)
    return mean, low, high


def _log(values: list[float | None]) -> np.ndarray:
    """Logs of per-round figures; a round with nothing measured counts as extreme (1000x), not as absent."""
    return np.log([min(max(v, 1e-3), 1e3) if v is not None and np.isfinite(v) else 1e3 for v in values])


def _ratios(candidate: list[float | None], stable: list[float | None]) -> list[float | None]:
    return [
        c / s if c is not None and s else None if c is None else 1e3 for c, s in zip(candidate, stable, strict=True)
    ]


def effects(
    candidate: Rounds, stable: Rounds | None, limits: Limits, confidence: float = DEFAULT_CONFIDENCE
) -> list[Effect]:
    """One Effect per limit that applies. `stable` (paired round by round) is needed for relative limits."""
    if len(candidate) == 0 or not candidate.requests:
        return []
    c_rounds = candidate.per_round()
    c_p99 = [r.p99_ms for r in c_rounds]
    c_tp = [r.throughput for r in c_rounds]
    out: list[Effect] = []

    def add(name: str, logs: np.ndarray, limit: float, higher_is_worse: bool, unit: str, relative: bool) -> None:
        mean, low, high = (np.exp(v) for v in sequential_interval(logs, confidence))
        shift = 1.0 if relative else 0.0
        out.append(Effect(name, mean - shift, low - shift, high - shift, limit, higher_is_worse, unit))  # type: ignore[arg-type]

    if limits.max_p99_ms is not None:
        add("candidate p99", _log(c_p99), limits.max_p99_ms, True, "ms", False)
    if limits.min_throughput is not None:
        # a stalled round (no request answered) is throughput ~0, not "too fast": flip the extreme for it
        add(
            "candidate throughput",
            np.log([max(v or 0.0, 1e-3) for v in c_tp]),
            limits.min_throughput,
            False,
            "/s",
            False,
        )
    if stable is None or (limits.max_p99_increase is None and limits.max_throughput_drop is None):
        return out
    if len(stable) != len(candidate) or not stable.requests:
        raise ValueError("the stable measurement must have one round for each of the candidate's")
    s_rounds = stable.per_round()
    if limits.max_p99_increase is not None:
        add("p99", _log(_ratios(c_p99, [r.p99_ms for r in s_rounds])), limits.max_p99_increase, True, "%", True)
    if limits.max_throughput_drop is not None:
        tp = [(c or 0.0) / s if s else 1e3 for c, s in zip(c_tp, [r.throughput for r in s_rounds], strict=True)]
        add("throughput", np.log(np.clip(tp, 1e-3, 1e3)), -limits.max_throughput_drop, False, "%", True)
    return out


def judge(found: list[Effect]) -> Literal["pass", "fail", "undecided"]:
    """fail if any effect is beyond its limit, pass if all are within, else undecided (measure more)."""
    if any(e.status == "beyond" for e in found):
        return "fail"
    if found and all(e.status == "within" for e in found):
        return "pass"
    return "undecided"
