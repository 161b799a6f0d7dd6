"""Promote's settings and the canary's (promote's live-traffic phase, components/release/promote/canary.py): named
defaults and the settings types, validated where built, whose fields are `tritonship promote`'s canary options and the pipeline's
(components/settings_model.py says how).

The defaults are for production: rounds of 60 s, Triton's summary window (components/serving/live_metrics.py),
so a round's p99 covers that round alone and takes part in the decision; at least 5 rounds, at most 15 minutes."""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from pydantic import Field, model_validator

from components.release.stage import ModelLoadSettings
from components.settings import DEFAULT_CONFIDENCE, DEFAULT_MAX_REGRESSION_PCT, DEFAULT_MIN_ROUNDS
from components.settings_model import Off, StepSettings, flattened, refuse, setting, step_settings

OnInconclusive = Literal["revert", "promote"]
ON_INCONCLUSIVE: tuple[str, ...] = get_args(OnInconclusive)

SUMMARY_WINDOW_S = 60.0  # Triton's latency summaries cover the last minute (prometheus-cpp's default max_age)
DEFAULT_CANARY_REPLICAS = 1
DEFAULT_ROUND_S = SUMMARY_WINDOW_S
DEFAULT_MAX_BAKE_S = 900.0
DEFAULT_MIN_REQUESTS = 20  # per side and round: fewer live requests than this and the round does not count
DEFAULT_MAX_FAILURE_INCREASE_PCT = 0.1  # percentage points of requests that failed, over the stable replicas'
DEFAULT_ON_INCONCLUSIVE: OnInconclusive = "revert"


@step_settings("canary")
class CanarySettings(StepSettings):
    """A limit of None (or 0) is off. Relative limits are percent against the stable replicas; the failure limit
    is percentage points of live requests."""

    enabled: Annotated[
        bool,
        setting(
            "switch the first replicas, compare them with the others on live traffic, go on only if they hold",
            option="canary",
        ),
    ] = True
    replicas: Annotated[
        int, setting("replicas switched first and measured as the canary", option="canary_replicas", ge=1)
    ] = DEFAULT_CANARY_REPLICAS
    round_s: Annotated[
        float, setting("seconds of one round of the canary's live metrics", option="canary_round_s", ge=0.5)
    ] = DEFAULT_ROUND_S
    max_bake_s: Annotated[
        float,
        setting("seconds of live traffic after which an undecided canary is inconclusive", option="canary_max_bake_s"),
    ] = DEFAULT_MAX_BAKE_S
    min_rounds: Annotated[
        int,
        setting(
            "rounds with enough live requests before any decision", option="canary_min_rounds", ge=DEFAULT_MIN_ROUNDS
        ),
    ] = DEFAULT_MIN_ROUNDS
    min_requests: Annotated[
        int,
        setting(
            "live requests the canary and the stable replicas each serve for a round to count",
            option="canary_min_requests",
            ge=1,
        ),
    ] = DEFAULT_MIN_REQUESTS
    max_latency_regression_pct: Annotated[
        Off,
        setting(
            "mean latency growth allowed against the stable replicas, percent; 0 is off",
            option="canary_max_latency_regression_pct",
        ),
    ] = DEFAULT_MAX_REGRESSION_PCT
    max_p99_regression_pct: Annotated[
        Off,
        setting(
            "p99 growth allowed against the stable replicas, percent (from summaries: rounds of 60 s or more); 0 is off",
            option="canary_max_p99_regression_pct",
        ),
    ] = DEFAULT_MAX_REGRESSION_PCT
    max_failure_increase_pct: Annotated[
        Off,
        setting(
            "share of failed live requests allowed over the stable replicas', percentage points; 0 is off",
            option="canary_max_failure_increase_pct",
        ),
    ] = DEFAULT_MAX_FAILURE_INCREASE_PCT
    max_latency_ms: Annotated[
        Off, setting("absolute limit on the canary's mean latency, ms; 0 is off", option="canary_max_latency_ms")
    ] = None
    max_p99_ms: Annotated[
        Off,
        setting(
            "absolute limit on the canary's p99, ms (from summaries: rounds of 60 s or more); 0 is off",
            option="canary_max_p99_ms",
        ),
    ] = None
    on_inconclusive: Annotated[
        OnInconclusive,
        setting(
            "what an undecided canary does at the longest bake: revert or promote", option="canary_on_inconclusive"
        ),
    ] = DEFAULT_ON_INCONCLUSIVE
    confidence: Annotated[float, Field(ge=0.5, lt=1)] = DEFAULT_CONFIDENCE  # the code's own

    @model_validator(mode="after")
    def _bakes_and_decides(self) -> CanarySettings:
        limits = ("max_latency_regression_pct", "max_p99_regression_pct", "max_failure_increase_pct")
        refuse(
            f"{{canary_max_bake_s}} ({self.max_bake_s:g}) must give a warm-up round and {{canary_min_rounds}} rounds "
            "of {canary_round_s}"
            if self.max_bake_s < (self.min_rounds + 1) * self.round_s
            else "",
            "every canary limit is off: give at least one"
            if not any(getattr(self, n) for n in (*limits, "max_latency_ms", "max_p99_ms"))
            else "",
        )
        return self

    @property
    def p99_decides(self) -> bool:
        """A round's p99 comes from Triton's summary of the last minute: only rounds that long are apart."""
        return self.round_s >= SUMMARY_WINDOW_S


@step_settings("promote")
class PromoteSettings(StepSettings):
    """promote's: the load time limit and the canary."""

    load: ModelLoadSettings = flattened(ModelLoadSettings)
    canary: CanarySettings = flattened(CanarySettings)

    @property
    def load_timeout_s(self) -> float:
        return self.load.load_timeout_s
