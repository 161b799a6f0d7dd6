"""The gate's statistics: effects with intervals, judged against the limits (docs/design.md section 4).

What is compared
    A **round** is one perf_analyzer run per model (three windows, about 3.5 s). In the duet design
    (the default) both runs start at the same moment against the same gate server, and only the span
    both measured counts: the candidate's and the stable's requests of a round saw the same seconds of
    the machine. In the alternating design a round's runs follow each other. Every request's latency
    comes from perf_analyzer's profile export.

The statistic: per round, then a trimmed mean over rounds
    - Each round gives one paired figure: the candidate's p99 over the stable's p99 of that round (its
      ~45th slowest of ~4,500 requests each), and the same for throughput; absolute limits use the
      candidate's own round figures. A round's p99 moves with whatever else the machine does, while
      the duet ratio of the same round moves far less: pairing inside the round is what removes the
      machine's noise (benchmarks/README.md, gate quality, has the figures).
    - The rounds are combined as the **20% trimmed mean of the log ratios**. Logs make ratios
      symmetric (x2 and x0.5 are equally far from 1). Trimming is there for the bursts of a busy
      machine: a burst of other work that lands on one perf_analyzer or one backend process makes
      that round's ratio an outlier (one A/A round on record came out +29%). Pooling every request
      (the previous design) lets such a round decide the pooled p99; a plain mean lets it widen the
      interval for good; a trimmed mean sets it aside and loses little when there is none (about 95%
      of the mean's efficiency for normal data).

The interval: Yuen's t-interval for the trimmed mean
    Standard error from the winsorized variance, Student's t with (rounds - 2 x trimmed - 1) degrees of
    freedom, 90% two-sided. Rounds are the independent units (requests of one round share its noise),
    and t with few degrees of freedom widens the interval honestly when there are few rounds. How
    often the intervals of recorded A/A duets covered the truth, by the number of rounds, is in
    benchmarks/README.md.

The decision (sequential)
    Each effect is `within` its limit when the whole interval is on the good side, `beyond` when the
    whole interval is past it, else it `straddles`. After every round from `min_rounds` on: fail as
    soon as one effect is beyond; pass when every effect is within; otherwise measure another round
    until the time budget is spent, and only then call it inconclusive. Looking after every round lets
    a clear case stop early; the 90% two-sided interval (95% on each side) keeps the chance that a
    look falsely fails an equal candidate small, which benchmarks/gate_quality.py measures.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from scipy import stats

from components.settings import DEFAULT_CONFIDENCE, Limits

TRIM = 0.2  # share of rounds set aside at each end

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


def trimmed_interval(
    values: np.ndarray, confidence: float = DEFAULT_CONFIDENCE, trim: float = TRIM
) -> tuple[float, float, float]:
    """The trimmed mean of `values` (20% at each end by default) and Yuen's t-interval around it; with `trim`
    0, the mean and Student's t-interval."""
    x = np.sort(np.asarray(values, dtype=np.float64))
    n = x.size
    g = int(trim * n)
    kept = n - 2 * g
    mean = float(x[g : n - g].mean())
    if kept < 2:
        return mean, float("-inf"), float("inf")
    winsorized = np.clip(x, x[g], x[n - g - 1])
    se = np.sqrt((n - 1) * winsorized.var(ddof=1) / (kept * (kept - 1)))
    half = float(stats.t.ppf(0.5 + confidence / 2, kept - 1) * se)
    return mean, mean - half, mean + half


def trimmed_difference(
    values: np.ndarray, reference: np.ndarray, confidence: float = DEFAULT_CONFIDENCE, trim: float = TRIM
) -> tuple[float, float, float]:
    """The trimmed mean of `values` less that of an independent `reference` sample, and Yuen's two-sample
    interval around it (Welch's, with `trim` 0): both samples' errors widen it, with Welch's degrees of freedom."""
    mean = float(stats.trim_mean(values, trim) - stats.trim_mean(reference, trim))
    if min(len(x) - 2 * int(trim * len(x)) for x in (values, reference)) < 2:
        return mean, float("-inf"), float("inf")
    if np.ptp(values) == 0 and np.ptp(reference) == 0:  # nothing varies (no failures anywhere, say): exact
        return mean, mean, mean
    low, high = stats.ttest_ind(values, reference, equal_var=False, trim=trim).confidence_interval(confidence)
    if np.isnan(low):  # what varied was trimmed away on both sides
        return mean, mean, mean
    return mean, float(low), float(high)


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
    c_p99 = [r["p99_ms"] for r in c_rounds]
    c_tp = [r["throughput"] for r in c_rounds]
    out: list[Effect] = []

    def add(name: str, logs: np.ndarray, limit: float, higher_is_worse: bool, unit: str, relative: bool) -> None:
        mean, low, high = (np.exp(v) for v in trimmed_interval(logs, confidence))
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
        add("p99", _log(_ratios(c_p99, [r["p99_ms"] for r in s_rounds])), limits.max_p99_increase, True, "%", True)
    if limits.max_throughput_drop is not None:
        tp = [(c or 0.0) / s if s else 1e3 for c, s in zip(c_tp, [r["throughput"] for r in s_rounds], strict=True)]
        add("throughput", np.log(np.clip(tp, 1e-3, 1e3)), -limits.max_throughput_drop, False, "%", True)
    return out


def judge(found: list[Effect]) -> Literal["pass", "fail", "undecided"]:
    """fail if any effect is beyond its limit, pass if all are within, else undecided (measure more)."""
    if any(e.status == "beyond" for e in found):
        return "fail"
    if found and all(e.status == "within" for e in found):
        return "pass"
    return "undecided"
