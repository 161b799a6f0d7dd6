"""Promote's canary: the first replicas switched are measured against the others on live traffic.

Promote switches replicas one at a time, so the first `replicas` switched get their share of the clients'
requests (k of N pods behind a Service) while the rest still serve the stable version to the same clients in
the same seconds: a baseline with no traffic split, mesh or ingress (docs/design.md section 3).

A **round** is `round_s` seconds between two readings of every replica's metrics endpoint
(components/serving/live_metrics.py). Per side (canary, stable) it gives the live requests served, the failed ones,
the mean latency (Triton's summed request duration over the successes) and a p99: the round's own from
latency histograms where the servers export them alike on both sides (Triton 26.01 and later), else the
summaries' last minute. A round counts when each side served at least `min_requests`.

**Before the switch**, `min_rounds` counted rounds compare the canary replicas with the others while both
serve the stable version. Replicas differ by themselves: another node, another core, what else runs there (on
a 2-core machine one replica served 15% slower than the other for minutes, benchmarks/README.md). Without this
reference an equal candidate on the slower replica would look like a regression. Too few live requests here
is inconclusive before anything is switched. **After the switch** the first round never counts (a freshly
loaded TorchScript specialises itself for each input shape it meets first).

The effects, over the counted rounds, with the gate's statistics (components/release/effects.py):
- mean latency, canary over stable: the change in the mean of the per-round log ratios (each held near its
  period's median) from before the switch to after it, with its anytime-valid interval (both periods' noise
  widens it), so looking after every round keeps the error rates;
- p99 likewise; from summaries only when rounds last their window (60 s) or more, since a shorter round's
  reading covers the rounds before it too and overlapping rounds would make the interval too narrow;
- failed requests, the canary's share minus the stable's: its change from before the switch, plain means
  with the same interval, no round held in (a round of failures is never an outlier);
- absolute limits on the canary's own mean latency and p99, like the gate's.
After every round from `min_rounds` counted ones: fail as soon as one effect lies beyond its limit, pass
when all lie within, else another round until `max_bake_s`; then inconclusive, which the settings turn into
a revert (the default) or a promotion.

A canary replica whose metrics do not answer, that no longer serves the candidate, or whose counters went
back (it restarted) fails the canary at once with that reason; a stable replica's reset only loses the round.
The canary measures and decides; promote switches its replicas between `Canary.before_switch` and
`Canary.after_switch`, and `decide` says whether the promotion goes on. A `Canary` waits through a `Clock` and takes
its rounds from a `RoundSource` (by default `_rounds`, reading the metrics every `round_s`):
tests/test_canary_decisions.py replays recorded rounds on a clock moved by sleeps.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace

import numpy as np

from components import log
from components.clock import Clock, SystemClock
from components.errors import TritonshipError
from components.release import effects as effect_stats
from components.release.promote.cancel import raise_pending
from components.release.promote.records import CanaryResult, CanaryRound, Side
from components.release.promote.settings import CanarySettings
from components.serving.live_metrics import Counts, MetricsUnavailable, Scrape, scrape
from components.serving.replicas import Replica

LOG = log.get("canary")
Progress = Callable[[str], None]
NO_LATENCY_MS = 1e6


class CanaryFault(TritonshipError):
    """The canary cannot be measured: a replica or its metrics endpoint failed."""


@dataclass
class Watch:
    """Which model versions each side serves: the entry model and, for an ensemble, its members."""

    model: str
    candidate: int
    stable: int
    members: dict[str, tuple[int, int | None]]  # member -> (its version on the canary, on the stable replicas)

    def versions(self, canary: bool) -> list[tuple[str, int | None]]:
        """(name, version) to read on one side; an ensemble's own version is None (every version summed): Triton
        2.51 keeps counting a reloaded ensemble's requests under the version it was first loaded as. Its
        members' versions say which release a replica serves."""
        own = [(self.model, None if self.members else self.candidate if canary else self.stable)]
        return own + [(name, new if canary else old) for name, (new, old) in self.members.items()]

    def unswitched(self) -> Watch:
        """Both sides on the stable version: what the replicas serve before the switch."""
        return Watch(self.model, self.stable, self.stable, {n: (old, old) for n, (_, old) in self.members.items()})


# the replicas serving a watch's versions -> every round's figures, as `_round` gives them (never ending by itself)
RoundSource = Callable[[Watch], Iterator[CanaryRound]]


class Canary:
    """One canary, measured in two periods: `before_switch` compares the `canary` replicas with the `baseline` ones
    while all serve the stable version; promote then switches the canary replicas, and `after_switch` measures them
    until the canary decides. `rounds` gives the rounds' figures (by default from the replicas' metrics, a round
    every `round_s` of `clock`)."""

    def __init__(
        self,
        watch: Watch,
        canary: list[Replica],
        baseline: list[Replica],
        settings: CanarySettings,
        progress: Progress | None = None,
        clock: Clock | None = None,
        rounds: RoundSource | None = None,
    ) -> None:
        self.watch, self.settings, self.progress = watch, settings, progress
        self.clock = clock or SystemClock()
        self.source = rounds or functools.partial(
            _rounds, canary=canary, baseline=baseline, settings=settings, clock=self.clock
        )
        self.result = CanaryResult(
            watch.model,
            watch.candidate,
            watch.stable,
            "inconclusive",
            [],
            canary_replicas=[r.name for r in canary],
            baseline_replicas=[r.name for r in baseline],
            settings=asdict(settings),
        )
        self.started = self.clock.now()
        self.reference: list[tuple[Side, Side]] = []

    def before_switch(self) -> bool:
        """Whether the replicas could be compared (`min_rounds` counted rounds within `max_bake_s`), so that the
        canary replicas may be switched; if not, the canary has decided (inconclusive, or fail on a fault)."""
        self.reference = self._period(_calibrate, self.watch.unswitched()) or []
        if len(self.reference) < self.settings.min_rounds or self.result.decision != "inconclusive":
            self._decided()
            return False
        return True

    def after_switch(self) -> CanaryResult:
        """Rounds with the canary replicas on the candidate until the canary decides, or `max_bake_s` is spent."""
        self._period(functools.partial(_bake, reference=self.reference), self.watch)
        self._decided()
        return self.result

    def _period(self, measure: Callable[..., list[tuple[Side, Side]] | None], watch: Watch) -> list | None:
        """One period's rounds, measured by `_calibrate` or `_bake`; a fault fails the canary at once."""
        try:
            return measure(self.source(watch), self.settings, self.result, self.progress, self.clock)
        except CanaryFault as exc:
            self.result.decision, self.result.reasons = "fail", [str(exc)]
            self.result.stopped = "the canary could not be measured"
            return None

    def _decided(self) -> None:
        self.result.seconds = self.clock.now() - self.started
        decision = self.result.decision
        log.event(LOG, "canary decided", model=self.watch.model, version=self.watch.candidate, decision=decision)


def _rounds(
    watch: Watch, *, canary: list[Replica], baseline: list[Replica], settings: CanarySettings, clock: Clock
) -> Iterator[CanaryRound]:
    """Every `round_s` seconds, the round's figures per side; CanaryFault when the canary cannot be measured."""
    before = _read(canary + baseline)
    _check_canary(watch, canary, before, before)
    while True:
        clock.sleep(settings.round_s)
        raise_pending()
        after = _read(canary + baseline)
        _check_canary(watch, canary, before, after)
        yield _round(watch, canary, baseline, before, after, settings)
        before = after


def _calibrate(
    rounds: Iterator[CanaryRound],
    settings: CanarySettings,
    result: CanaryResult,
    progress: Progress | None,
    clock: Clock,
) -> list[tuple[Side, Side]]:
    """`min_rounds` counted rounds before the switch (within `max_bake_s`): how the canary replicas compare with
    the others when both serve the stable version. Replicas differ on their own (another node, another core)."""
    started, counted = clock.now(), []
    for figures in rounds:
        result.calibration.append(figures)
        if figures.counted:
            counted.append((figures.canary, figures.baseline))
        elapsed = clock.now() - started
        if progress:
            progress(f"canary before the switch, round {len(result.calibration)}: {len(counted)} counted")
        if len(counted) >= settings.min_rounds:
            return counted
        if elapsed + settings.round_s > settings.max_bake_s:
            result.reasons = [
                f"too few live requests before the switch: {len(counted)} of {len(result.calibration)} rounds had "
                f"{settings.min_requests} or more on each side, {settings.min_rounds} are needed"
            ]
            result.stopped = "nothing was switched: the replicas could not be compared"
            return counted
    raise AssertionError("unreachable")  # a RoundSource never ends by itself


def _bake(
    rounds: Iterator[CanaryRound],
    settings: CanarySettings,
    result: CanaryResult,
    progress: Progress | None,
    clock: Clock,
    reference: list[tuple[Side, Side]],
) -> None:
    started, counted = clock.now(), []
    for figures in rounds:
        if not result.rounds:  # a freshly loaded version meets each new input shape for the first time
            figures = replace(figures, counted=False, note="warm-up: the first round after the switch is not counted")
        result.rounds.append(figures)
        if figures.counted:
            counted.append((figures.canary, figures.baseline))
        result.counted_rounds = len(counted)
        elapsed = clock.now() - started
        if progress:
            progress(f"canary round {len(result.rounds)}: {len(counted)} counted, {elapsed:.0f} s")
        if len(counted) >= settings.min_rounds:
            found = effects(counted, reference, settings)
            result.effects = [e.to_dict() for e in found]
            decided = effect_stats.judge(found)
            if decided != "undecided":
                result.decision = decided
                result.reasons = [e.describe() for e in found]
                result.stopped = f"decided after {len(counted)} counted rounds"
                return
        if elapsed + settings.round_s > settings.max_bake_s:
            result.reasons = _undecided(result, len(counted), settings)
            result.stopped = f"the longest bake ({settings.max_bake_s:g} s) was spent"
            return


def decide(found: CanaryResult, settings: CanarySettings) -> bool:
    """Whether the promotion goes on: after a pass, or an inconclusive canary when the settings say promote."""
    goes_on = found.decision == "pass" or (found.decision == "inconclusive" and settings.on_inconclusive == "promote")
    found.outcome = "promoted" if goes_on else "reverted"
    return goes_on


def why_reverted(found: CanaryResult) -> str:
    """The canary's decision that reverts a promotion, in one sentence."""
    what = "failed on live traffic" if found.decision == "fail" else "was inconclusive"
    return f"the canary of {found.model} v{found.version} {what}: {'; '.join(found.reasons)}."


def _read(replicas: list[Replica]) -> dict[str, Scrape]:
    readings = {}
    for replica in replicas:
        if not replica.metrics_url:
            raise CanaryFault(
                f"no metrics endpoint is known for {replica.name}; give it as host:http-port:metrics-port"
            )
        try:
            readings[replica.name] = scrape(replica.metrics_url)
        except MetricsUnavailable as exc:
            raise CanaryFault(f"{replica.name}: {exc}") from None
    return readings


def _check_canary(watch: Watch, canary: list[Replica], before: dict[str, Scrape], after: dict[str, Scrape]) -> None:
    for replica in canary:
        for name, version in watch.versions(canary=True):
            then, now = before[replica.name].counts(name, version), after[replica.name].counts(name, version)
            if then is None or now is None:
                raise CanaryFault(
                    f"the canary {replica.name} no longer serves {name} v{version} (restarted or unloaded)"
                )
            if now.since(then) is None:
                raise CanaryFault(
                    f"the canary {replica.name} restarted during the bake: its counters for {name} started again"
                )


def _round(
    watch: Watch,
    canary: list[Replica],
    baseline: list[Replica],
    before: dict[str, Scrape],
    after: dict[str, Scrape],
    settings: CanarySettings,
) -> CanaryRound:
    """One round's figures per side (and per ensemble member); `counted` says whether it takes part."""
    model_deltas: dict[str, list[Counts]] = {}
    notes: list[str] = []
    members: dict[str, dict[str, float | None]] = {}
    for label, replicas, is_canary in (("canary", canary, True), ("baseline", baseline, False)):
        for name, version in watch.versions(is_canary):
            deltas = []
            for replica in replicas:
                then, now = before[replica.name].counts(name, version), after[replica.name].counts(name, version)
                delta = now.since(then) if then and now else None
                if delta is None:
                    notes.append(f"{replica.name} gave no comparable counts for {name} v{version} (restarted?)")
                else:
                    deltas.append(delta)
            if name == watch.model:
                model_deltas[label] = deltas
            else:
                members.setdefault(name, {})[f"{label}_mean_ms"] = Side.pooled(deltas).mean_ms
    # a p99 from histograms only where both sides bucket alike: the first release with buckets of its own is
    # compared through the summaries
    bounds = {d.histogram.bounds for deltas in model_deltas.values() for d in deltas if d.histogram}
    sides = {label: Side.pooled(deltas, histograms=len(bounds) == 1) for label, deltas in model_deltas.items()}
    few = [k for k, s in sides.items() if s.requests < settings.min_requests]
    if few:
        notes.append(f"fewer than {settings.min_requests} live requests on the {' and '.join(few)} side")
    return CanaryRound(not notes, "; ".join(notes), sides["canary"], sides["baseline"], members)


def effects(
    rounds: list[tuple[Side, Side]], reference: list[tuple[Side, Side]], settings: CanarySettings
) -> list[effect_stats.Effect]:
    """One Effect per limit that applies, over the counted rounds (canary, stable) after the switch. A relative
    effect is the canary's standing against the stable replicas after the switch less its standing before it
    (`reference`, both sides on stable): what the candidate changed, not what sets the replicas apart."""
    out: list[effect_stats.Effect] = []
    confidence = settings.confidence

    def ratio(name: str, after: list[tuple[float, float]], before: list[tuple[float, float]], limit: float) -> None:
        logs = [np.log([c / b for c, b in pairs]) for pairs in (after, before)]
        mean, low, high = (np.exp(v) - 1 for v in effect_stats.sequential_difference(*logs, confidence))
        out.append(effect_stats.Effect(name, mean, low, high, limit / 100, True, "%"))

    def absolute(name: str, values: list[float], limit: float) -> None:
        mean, low, high = (np.exp(v) for v in effect_stats.sequential_interval(np.log(values), confidence))
        out.append(effect_stats.Effect(name, mean, low, high, limit, True, "ms"))

    # a side whose every request failed has no latency: the canary's counts as extreme (failures decide it)
    latency = [[(c.mean_ms or NO_LATENCY_MS, b.mean_ms or NO_LATENCY_MS) for c, b in r] for r in (rounds, reference)]
    p99s = [[(c.p99_ms, b.p99_ms) for c, b in r] for r in (rounds, reference)]
    # a summary's p99 covers the last minute, so only rounds that long are apart; a histogram's covers its round
    per_round = all(s.p99_from == "histogram" for pairs in (rounds, reference) for pair in pairs for s in pair)
    with_p99 = (settings.p99_decides or per_round) and all(
        c is not None and b is not None for c, b in p99s[0] + p99s[1]
    )
    if settings.max_latency_ms:
        absolute("canary mean latency", [c for c, _ in latency[0]], settings.max_latency_ms)
    if settings.max_p99_ms and with_p99:
        absolute("canary p99", [c for c, _ in p99s[0]], settings.max_p99_ms)  # type: ignore[misc]
    if settings.max_latency_regression_pct:
        ratio("mean latency", *latency, settings.max_latency_regression_pct)
    if settings.max_p99_regression_pct and with_p99:
        ratio("p99", *p99s, settings.max_p99_regression_pct)  # type: ignore[arg-type]
    if settings.max_failure_increase_pct:  # percentage points: no logs, no round held in
        shares = [np.array([c.failure_share - b.failure_share for c, b in r]) for r in (rounds, reference)]
        mean, low, high = effect_stats.sequential_difference(*shares, confidence, robust=False)
        limit = settings.max_failure_increase_pct / 100
        out.append(effect_stats.Effect("failed requests", mean, low, high, limit, True, "%"))
    return out


def _undecided(result: CanaryResult, counted: int, settings: CanarySettings) -> list[str]:
    if counted < settings.min_rounds:
        return [
            f"too few live requests: {counted} of {len(result.rounds)} rounds had {settings.min_requests} or more on "
            f"each side, {settings.min_rounds} are needed"
        ]
    return ["still undecided: " + "; ".join(e["text"] for e in result.effects)]
