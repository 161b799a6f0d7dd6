"""Tune's settings: what the search tries and within which limits; the pipeline tunes at the gate's load."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Annotated

from pydantic import Field

from components.settings import (
    DEFAULT_CONCURRENCY,
    DEFAULT_INSTANCE_COUNTS,
    DEFAULT_INTRA_OP_THREAD_COUNTS,
    DEFAULT_PERF_TIMEOUT_S,
    DEFAULT_TUNE_BUDGET,
    DEFAULT_TUNE_MIN_GAIN_PCT,
    DEFAULT_TUNE_P99_SLACK_PCT,
    RELAXED_STABILITY_PCT,
    GateSettings,
    LoadSettings,
)
from components.settings_model import Counts, Off, StepSettings, flattened, setting, step_settings

COUNTS = "whole numbers of 1 or more, comma-separated (like 1,2,4)"


@step_settings("tune")
class TuneSettings(StepSettings):
    # perf_analyzer's stability check relaxed, as the gate's: a busy machine's noise must not lose a trial
    load: LoadSettings = flattened(
        lambda: LoadSettings(concurrency=DEFAULT_CONCURRENCY, stability_pct=RELAXED_STABILITY_PCT)
    )
    # the pipeline tunes at the gate's load and within its p99 limit (within); by hand they are set here
    max_p99_ms: Annotated[Off, setting("p99 limit, ms; 0: the default settings' p99 plus the slack", pipeline=None)] = (
        None
    )
    p99_slack_pct: Annotated[
        float,
        setting(
            "how much p99 may grow over the default settings' when no limit is given",
            pipeline="tune_p99_slack_pct",
            ge=0,
        ),
    ] = DEFAULT_TUNE_P99_SLACK_PCT
    budget: Annotated[
        int, setting("settings measured at most (two confirmation runs come on top)", pipeline="tune_budget", ge=1)
    ] = DEFAULT_TUNE_BUDGET
    min_gain_pct: Annotated[
        float,
        setting("the smallest throughput gain that moves the search, %", pipeline="tune_min_gain_pct", ge=0),
    ] = DEFAULT_TUNE_MIN_GAIN_PCT
    instance_counts: Annotated[
        Counts,
        setting(
            "instance counts tried, comma-separated, for the model and for an ensemble's pre/post steps",
            pipeline="tune_instance_counts",
            expect=COUNTS,
        ),
    ] = DEFAULT_INSTANCE_COUNTS
    intra_op_thread_counts: Annotated[
        Counts,
        setting(
            "the PyTorch backend's intra-op thread counts tried, comma-separated (CPU models)",
            option="intra_op_threads",
            pipeline="tune_intra_op_threads",
            expect=COUNTS,
        ),
    ] = DEFAULT_INTRA_OP_THREAD_COUNTS
    queue_delays_us: tuple[Annotated[int, Field(ge=0)], ...] = (0, 500, 2000, 8000)
    # the TorchScript profiling executor on and off; a CPU model keeps its own (tune)
    optimized_executions: tuple[bool, ...] = (True, False)
    perf_timeout_s: Annotated[float, Field(gt=0)] = DEFAULT_PERF_TIMEOUT_S
    # the pipeline's switch; `tritonship tune` always searches
    enabled: Annotated[
        bool,
        setting(
            "search the candidate's serving settings on the gate before the gate measures it",
            pipeline="tune",
            cli=False,
        ),
    ] = True

    def within(self, steps: Mapping[str, StepSettings]) -> TuneSettings:
        """Tuned as the pipeline tunes, in a run with a gate step: at the gate's load, within its p99 limit."""
        gate = steps.get("gate")
        if not isinstance(gate, GateSettings):
            return self
        return dataclasses.replace(self, load=gate.load, max_p99_ms=gate.thresholds.max_p99_ms)
