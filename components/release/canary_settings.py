"""The canary's settings (promote's live-traffic phase, components/release/canary.py): named defaults, the
flat table the `tritonship promote` options and the pipeline's parameters take, and the settings type,
validated where built.

The defaults are for production: rounds of 60 s, Triton's summary window (components/serving/live_metrics.py),
so a round's p99 covers that round alone and takes part in the decision; at least 5 rounds, at most 15 minutes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal, get_args

from components.settings import (
    DEFAULT_CONFIDENCE,
    DEFAULT_MAX_REGRESSION_PCT,
    DEFAULT_MIN_ROUNDS,
    Parameter,
    refuse_invalid,
    typed_flat,
)

OnInconclusive = Literal["revert", "promote"]
ON_INCONCLUSIVE: tuple[str, ...] = get_args(OnInconclusive)

SUMMARY_WINDOW_S = 60.0  # Triton's latency summaries cover the last minute (prometheus-cpp's default max_age)
DEFAULT_CANARY_REPLICAS = 1
DEFAULT_ROUND_S = SUMMARY_WINDOW_S
DEFAULT_MAX_BAKE_S = 900.0
DEFAULT_MIN_REQUESTS = 20  # per side and round: fewer live requests than this and the round does not count
DEFAULT_MAX_FAILURE_INCREASE_PCT = 0.1  # percentage points of requests that failed, over the stable replicas'
DEFAULT_ON_INCONCLUSIVE: OnInconclusive = "revert"

CANARY_PARAMETERS: dict[str, Parameter] = {
    "canary": Parameter(
        True, "switch the first replicas, compare them with the others on live traffic, go on only if they hold"
    ),
    "canary_replicas": Parameter(DEFAULT_CANARY_REPLICAS, "replicas switched first and measured as the canary"),
    "canary_round_s": Parameter(DEFAULT_ROUND_S, "seconds of one round of the canary's live metrics"),
    "canary_max_bake_s": Parameter(
        DEFAULT_MAX_BAKE_S, "seconds of live traffic after which an undecided canary is inconclusive"
    ),
    "canary_min_rounds": Parameter(DEFAULT_MIN_ROUNDS, "rounds with enough live requests before any decision"),
    "canary_min_requests": Parameter(
        DEFAULT_MIN_REQUESTS, "live requests the canary and the stable replicas each serve for a round to count"
    ),
    "canary_max_latency_regression_pct": Parameter(
        DEFAULT_MAX_REGRESSION_PCT, "mean latency growth allowed against the stable replicas, percent; 0 is off"
    ),
    "canary_max_p99_regression_pct": Parameter(
        DEFAULT_MAX_REGRESSION_PCT,
        "p99 growth allowed against the stable replicas, percent (rounds of 60 s or more); 0 is off",
    ),
    "canary_max_failure_increase_pct": Parameter(
        DEFAULT_MAX_FAILURE_INCREASE_PCT,
        "share of failed live requests allowed over the stable replicas', percentage points; 0 is off",
    ),
    "canary_max_latency_ms": Parameter(0.0, "absolute limit on the canary's mean latency, ms; 0 is off"),
    "canary_max_p99_ms": Parameter(0.0, "absolute limit on the canary's p99, ms (rounds of 60 s or more); 0 is off"),
    "canary_on_inconclusive": Parameter(
        DEFAULT_ON_INCONCLUSIVE, "what an undecided canary does at the longest bake: revert or promote"
    ),
}


@dataclass(frozen=True)
class CanarySettings:
    """A limit of None is off (0 in the flat form). Relative limits are percent against the stable replicas;
    the failure limit is percentage points of live requests."""

    PARAMETERS: ClassVar = CANARY_PARAMETERS
    enabled: bool = True
    replicas: int = DEFAULT_CANARY_REPLICAS
    round_s: float = DEFAULT_ROUND_S
    max_bake_s: float = DEFAULT_MAX_BAKE_S
    min_rounds: int = DEFAULT_MIN_ROUNDS
    min_requests: int = DEFAULT_MIN_REQUESTS
    max_latency_regression_pct: float | None = DEFAULT_MAX_REGRESSION_PCT
    max_p99_regression_pct: float | None = DEFAULT_MAX_REGRESSION_PCT
    max_failure_increase_pct: float | None = DEFAULT_MAX_FAILURE_INCREASE_PCT
    max_latency_ms: float | None = None
    max_p99_ms: float | None = None
    on_inconclusive: OnInconclusive = DEFAULT_ON_INCONCLUSIVE
    confidence: float = DEFAULT_CONFIDENCE

    def __post_init__(self) -> None:
        limits = ("max_latency_regression_pct", "max_p99_regression_pct", "max_failure_increase_pct")
        negative = [n for n in (*limits, "max_latency_ms", "max_p99_ms") if (getattr(self, n) or 0) < 0]
        refuse_invalid(
            "canary",
            [
                f"canary_replicas must be at least 1, not {self.replicas}" if self.replicas < 1 else "",
                f"canary_round_s must be at least 0.5, not {self.round_s}" if self.round_s < 0.5 else "",
                f"canary_min_rounds must be at least {DEFAULT_MIN_ROUNDS}, not {self.min_rounds}"
                if self.min_rounds < DEFAULT_MIN_ROUNDS
                else "",
                f"canary_max_bake_s ({self.max_bake_s:g}) must give a warm-up round and canary_min_rounds rounds of canary_round_s"
                if self.max_bake_s < (self.min_rounds + 1) * self.round_s
                else "",
                f"canary_min_requests must be at least 1, not {self.min_requests}" if self.min_requests < 1 else "",
                f"{', '.join(negative)} must not be negative" if negative else "",
                "every canary limit is off: give at least one"
                if not any(getattr(self, n) for n in (*limits, "max_latency_ms", "max_p99_ms"))
                else "",
                f"canary_on_inconclusive must be one of {', '.join(ON_INCONCLUSIVE)}, not {self.on_inconclusive!r}"
                if self.on_inconclusive not in ON_INCONCLUSIVE
                else "",
            ],
        )

    @classmethod
    def from_flat(cls, **flat: Any) -> CanarySettings:
        """From CANARY_PARAMETERS' flat form; a limit of 0 or None is off."""
        values = typed_flat(CANARY_PARAMETERS, flat, "canary")
        fields = {name.removeprefix("canary_"): value for name, value in values.items()}
        fields["enabled"] = fields.pop("canary")
        for name in [n for n in fields if n.startswith("max_") and n != "max_bake_s"]:
            fields[name] = fields[name] or None
        return cls(**fields)

    @property
    def p99_decides(self) -> bool:
        """A round's p99 comes from Triton's summary of the last minute: only rounds that long are apart."""
        return self.round_s >= SUMMARY_WINDOW_S
