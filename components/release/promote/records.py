"""What a promotion records, typed, with the results' one serialisation (components/release/results.py): its
phases, its outcome, the in-progress record in S3 that reconcile and the pipeline's exit handler read, the
canary's result and the promotion's."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from components.release.results import Result
from components.repository import ModelRepository
from components.serving.live_metrics import Counts, Histogram


class Phase(StrEnum):
    """A promotion's phases, in order (components/release/promote/promote.py says what each does)."""

    COPY = "copy"
    CANARY = "canary"
    ROLL = "roll"
    FINISH = "finish"


class Outcome(StrEnum):
    """How a promotion ended."""

    PROMOTED = "promoted"  # every replica serves the new version
    REVERTED = "reverted"  # every replica serves the previous version again
    PARTIAL = "partial"  # a revert that could not bring every replica back: reconcile must finish it


@dataclass
class PromotionRecord(Result):
    """root/promotions/<model>.json, rewritten before each phase (components/repository/promotions.py), which
    `reconcile` and the pipeline's exit handler settle when the run died before its end."""

    model: str
    version: int
    phase: Phase
    previous_version: int | None = None
    run_id: str = ""
    replicas: list[str] = field(default_factory=list)

    def write(self, repo: ModelRepository) -> None:
        repo.write_promotion(self.model, self.to_dict())

    @classmethod
    def read(cls, repo: ModelRepository, model: str) -> PromotionRecord | None:
        """The model's promotion in progress (or killed before it ended), or None."""
        found = repo.promotion(model)
        return None if found is None else cls.from_dict(found)


@dataclass
class ReplicaOutcome:
    """One replica after a failed promotion, as it answered when asked: never what we meant it to serve."""

    url: str
    serving: list[int] | None  # ready versions of the model; None when the replica did not answer
    reverted: bool  # it serves the previous version and not the candidate (nothing at all before a first release)

    def describe(self) -> str:
        if self.serving is None:
            return f"{self.url} did not answer"
        return f"{self.url} serves " + ("+".join(f"v{v}" for v in self.serving) or "nothing")


@dataclass
class Side:
    """One side's live requests in one round of the canary (pooled over its replicas)."""

    requests: int
    failures: int
    mean_ms: float | None  # over the successes
    p99_ms: float | None  # of this round from histograms, else the summary's last minute, request-weighted
    p99_from: str | None = None  # "histogram" (this round's alone) or "summary"

    @property
    def failure_share(self) -> float:
        return self.failures / self.requests if self.requests else 0.0

    @classmethod
    def pooled(cls, deltas: list[Counts], histograms: bool = True) -> Side:
        success = sum(d.success for d in deltas)
        pooled = Histogram.pooled([d.histogram for d in deltas if d.histogram]) if histograms else None
        p99, source = (pooled.quantile_ms(0.99) if pooled and all(d.histogram for d in deltas) else None), "histogram"
        if p99 is None:
            weighted = [(d.p99_us, d.success) for d in deltas if d.p99_us is not None and d.success > 0]
            whole = weighted and len(weighted) == len(deltas)
            p99, source = (
                (sum(p * w for p, w in weighted) / sum(w for _, w in weighted) / 1000 if whole else None),
                "summary",
            )
        return cls(
            int(sum(d.requests for d in deltas)),
            int(sum(d.failure for d in deltas)),
            sum(d.duration_us for d in deltas) / success / 1000 if success else None,
            p99,
            source if p99 is not None else None,
        )


@dataclass(frozen=True)
class CanaryRound(Result):
    """One round of the canary (components/release/promote/canary.py): each side's figures, and for an ensemble each
    member's mean latency per side (`canary_mean_ms`, `baseline_mean_ms`); `counted` says whether it takes part,
    `note` why not."""

    counted: bool
    note: str
    canary: Side
    baseline: Side
    members: dict[str, dict[str, float | None]] = field(default_factory=dict)


CanaryDecision = Literal["pass", "fail", "inconclusive", "skipped"]


@dataclass
class CanaryResult(Result):
    """The canary's decision and its evidence: each limit's effect and every round's figures per side."""

    model: str
    version: int
    stable_version: int | None
    decision: CanaryDecision
    reasons: list[str]
    canary_replicas: list[str] = field(default_factory=list)
    baseline_replicas: list[str] = field(default_factory=list)
    effects: list[dict[str, Any]] = field(default_factory=list)
    calibration: list[CanaryRound] = field(default_factory=list)  # rounds before the switch, all on stable
    rounds: list[CanaryRound] = field(default_factory=list)  # rounds after it
    counted_rounds: int = 0
    seconds: float = 0.0
    stopped: str = ""
    outcome: str = ""  # what promote did with the decision: promoted, or reverted
    settings: dict[str, Any] = field(default_factory=dict)


@dataclass
class PromoteResult(Result):
    model: str
    version: int
    previous_version: int | None
    replicas: list[str]
    promoted: bool
    reverted: bool = False  # every replica is back on the previous version (after a failed promotion)
    problems: list[str] = field(default_factory=list)  # why it reverted, and what went wrong on the way
    load_seconds: list[float] = field(default_factory=list)  # per replica, Triton's own load time
    after_revert: list[ReplicaOutcome] = field(default_factory=list)  # what each replica serves after a revert
    canary: CanaryResult | None = None  # the live-traffic phase, when promote ran one

    @property
    def outcome(self) -> Outcome:
        if self.promoted:
            return Outcome.PROMOTED
        return Outcome.REVERTED if self.reverted else Outcome.PARTIAL

    @property
    def stable(self) -> str:
        """The version a revert goes back to, as a person reads it."""
        return f"v{self.previous_version}" if self.previous_version else "no version"


class Stop(StrEnum):
    """What made a promotion revert, or left it unrecorded."""

    CANARY = "canary"  # its decision: a revert that is an outcome, not an error
    FAILURE = "failure"
    SIGNAL = "signal"


@dataclass(frozen=True)
class Ending:
    """How a promotion ended: its result (`result.outcome`), what stopped it (None: nothing) and what to tell."""

    result: PromoteResult
    stopped_by: Stop | None = None
    said: str = ""
