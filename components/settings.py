"""Every step's named defaults, and the gate's settings.

Each default is named once here and read by the step, its settings type (the gate's below; export's and compile's
in components/model/settings.py; the others' beside each release room's step: publish.py, stage.py,
tune/settings.py, quality/spec.py, promote/settings.py; and components/repository/maintenance_settings.py) and so
by the `tritonship` options and the KFP pipeline's parameters, which are made from the settings types
(components/settings_model.py says how). A limit or rate of 0 is off, in every form (None is off too, from
Python)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args

from pydantic import Field

from components.settings_model import Off, StepSettings, flattened, setting, step_settings

Design = Literal["duet", "alternating"]
# The export and compile steps' choices (the CLI lists and checks them from these).
ExportMethod = Literal["auto", "export", "script", "trace"]  # auto: torch.export, then TorchScript
Target = Literal["torchscript", "tensorrt", "aoti"]
Precision = Literal["fp32", "fp16", "bf16"]
TARGETS: tuple[str, ...] = get_args(Target)

DEFAULT_CONCURRENCY = 1
DEFAULT_WINDOW_MS = 1000
DEFAULT_DESIGN: Design = "duet"
# the gate's and the canary's statistics (components/release/effects.py): fewer rounds leave the interval's own error
# too large to stop on (and nothing to trim); intervals are two-sided at this confidence
DEFAULT_MIN_ROUNDS = 5
DEFAULT_CONFIDENCE = 0.90
DEFAULT_BUDGET_S = 120.0
DEFAULT_CALIBRATION_ROUNDS = 12  # gate calibrate: A/A duet rounds measured for the gate server's noise
DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_PERF_TIMEOUT_S = 120.0  # gate, tune: one perf_analyzer run's limit before it counts as failed
DEFAULT_MAX_REGRESSION_PCT = 10.0
# perf_analyzer's stability check, relaxed: any three windows count as stable, so a run always reports.
RELAXED_STABILITY_PCT = 1000.0
DEFAULT_INSTANCE_COUNTS = (1, 2, 3)  # tune's instance counts (a 16-core GPU host gains from 4: benchmarks/README.md)
# The PyTorch backend's intra-op threads per model: one, so that instances and models do not oversubscribe
# the cores (the backend's own default takes them all, per model); tune tries the counts below.
DEFAULT_INTRA_OP_THREADS = 1
DEFAULT_INTRA_OP_THREAD_COUNTS = (1, 2)
# The other steps' defaults, each named once here and read by the step, the CLI and the pipeline
# (tests/test_settings.py compares them).
DEFAULT_GOLDEN_SAMPLES = 16  # export: golden samples generated when none are given
DEFAULT_TUNE_BUDGET = 16  # tune: settings measured at most (two confirmation runs come on top)
DEFAULT_TUNE_P99_SLACK_PCT = 10.0  # tune: how much p99 may grow over the default's when no limit is given
DEFAULT_TUNE_MIN_GAIN_PCT = 5.0  # tune: the smallest throughput gain that moves the search
DEFAULT_CLEANUP_GRACE_S = 3600.0  # repo gc: how old an unsealed version must be before it is removed
DEFAULT_LEASE_S = 3600.0  # stage, tune, gate, promote: how long a release lease lasts unless renewed
# one measurement at a time on a gate server (components/release/gate_turn.py): how long a step waits for it, how
# often it looks, and how long its lease lasts unless renewed (a dead run's is taken over after that)
DEFAULT_GATE_WAIT_S = 3600.0
DEFAULT_GATE_POLL_S = 2.0
DEFAULT_GATE_LEASE_S = 60.0
DEFAULT_LOAD_TIMEOUT_S = 300.0  # stage, promote: how long one model load may take on a server
DEFAULT_EXPORT_METHOD: ExportMethod = "auto"
# quality: a metric with no limit of its own may drop this much against stable (percent of stable's value);
# the evaluation data is read in chunks of this many rows, and each model gets this many requests in flight
DEFAULT_QUALITY_MAX_DROP_PCT = 2.0
DEFAULT_QUALITY_CHUNK_ROWS = 8192
DEFAULT_QUALITY_REQUESTS_IN_FLIGHT = 4
DEFAULT_TENSORRT_OPT_BATCH = 8  # compile: the batch size TensorRT optimises for
DEFAULT_TENSORRT_WORKSPACE_GB = 2.0
# Where it differs from the CLI on purpose: the pipeline compiles on a GPU node, with Torch-TensorRT in fp16
# (what production serves fastest); the CLI on the machine it runs on, TorchScript in fp32 (no GPU needed).
DEFAULT_TARGET: Target = "torchscript"
# The torch of the serving image (images/versions.yaml's `serving_torch`; tests/test_images.py compares them):
# publish refuses a torch_aoti package compiled with another.
SERVING_TORCH = "2.14.0"
# The images the pipeline's export and compile tasks run in unless model_image and compile_image name ones with the
# user's package: the project's (images/versions.yaml's `images`; tests/test_images.py compares them).
TOOLS_IMAGE = "ghcr.io/tritonship/tools:0.1.0"
COMPILE_IMAGE = "ghcr.io/tritonship/compile:0.1.0-26.10"
DEFAULT_PRECISION: Precision = "fp32"
DEFAULT_COMPILE_DEVICE = "cpu"
PIPELINE_TARGET: Target = "tensorrt"
PIPELINE_PRECISION: Precision = "fp16"
PIPELINE_COMPILE_DEVICE = "cuda"
PIPELINE_DIFFERENCES: dict[str, Any] = {
    "compile_target": PIPELINE_TARGET,
    "precision": PIPELINE_PRECISION,
    "compile_device": PIPELINE_COMPILE_DEVICE,
}


@dataclass(frozen=True)
class Limits:
    """The limits that apply to one decision; None is off. Relative ones are fractions (0.10 = 10%)."""

    max_p99_ms: float | None = None
    min_throughput: float | None = None
    max_p99_increase: float | None = None
    max_throughput_drop: float | None = None


@step_settings("perf_analyzer load")
class LoadSettings(StepSettings):
    """How perf_analyzer loads the server; `tritonship tune`'s load options are these (the gate takes three of
    them, GateSettings.load)."""

    concurrency: Annotated[
        int, setting("perf_analyzer concurrency, per model (tune at the gate's)", pipeline=None, ge=1)
    ] = 1
    # if set, a fixed request rate instead of concurrency
    request_rate: Annotated[
        Off,
        setting(
            "a fixed request rate per model instead of the concurrency, /s (tune: the lowest p99 that keeps up "
            "wins); 0 is off",
            pipeline=None,
        ),
    ] = None
    window_ms: Annotated[int, setting("perf_analyzer measurement window, ms", pipeline=None, ge=100)] = (
        DEFAULT_WINDOW_MS
    )
    stability_pct: Annotated[
        float,
        setting(
            f"perf_analyzer stability threshold, %; {RELAXED_STABILITY_PCT:g} takes any three windows",
            pipeline=None,
            gt=0,
        ),
    ] = 20.0
    max_trials: Annotated[int, Field(ge=1)] = 10
    percentile: int | None = None  # stabilise on this latency percentile; None: on average latency
    batch_size: Annotated[int, Field(ge=1)] = 1
    protocol: str = "http"
    # client threads at a fixed request rate (None: rate_threads); perf_analyzer's own default (4 synchronous
    # HTTP threads) cannot send more than about 1,000 requests/s whatever the rate asked (measured on the H200)
    max_threads: int | None = None
    # at a fixed request rate: perf_analyzer processes per model sharing the rate (None: perf.rate_clients, one
    # while synchronous threads can carry the rate) and asynchronous requests (None: perf.asynchronous, only over
    # gRPC above that rate); components/serving/perf.py says why
    clients: int | None = None
    async_requests: bool | None = None


@step_settings("gate")
class Thresholds(StepSettings):
    """The gate's limits; None (or 0) is off. Relative ones are percent against the stable version."""

    max_p99_ms: Annotated[Off, setting("absolute limit on the candidate's p99 latency, ms; 0 is off")] = None
    min_throughput: Annotated[Off, setting("absolute limit on the candidate's inferences/s; 0 is off")] = None
    max_p99_regression_pct: Annotated[Off, setting("p99 growth allowed against stable, percent; 0 is off")] = (
        DEFAULT_MAX_REGRESSION_PCT
    )
    max_throughput_regression_pct: Annotated[
        Off, setting("throughput loss allowed against stable, percent; 0 is off")
    ] = DEFAULT_MAX_REGRESSION_PCT

    @property
    def relative(self) -> bool:
        return self.max_p99_regression_pct is not None or self.max_throughput_regression_pct is not None

    @property
    def absolute(self) -> bool:
        return self.max_p99_ms is not None or self.min_throughput is not None

    def limits(self, with_stable: bool) -> Limits:
        pct = lambda v: None if v is None or not with_stable else v / 100  # noqa: E731
        return Limits(
            self.max_p99_ms,
            self.min_throughput,
            pct(self.max_p99_regression_pct),
            pct(self.max_throughput_regression_pct),
        )


@step_settings("gate")
class GateSettings(StepSettings):
    # perf_analyzer's load with its stability check relaxed; of its options the gate takes three, in its own words
    load: LoadSettings = flattened(
        lambda: LoadSettings(concurrency=DEFAULT_CONCURRENCY, stability_pct=RELAXED_STABILITY_PCT),
        options={
            "concurrency": setting("perf_analyzer concurrency, per model"),
            "request_rate": setting("a fixed request rate per model instead of concurrency; 0 is off"),
            "window_ms": setting("length of one measured window, ms"),
        },
    )
    thresholds: Thresholds = flattened(Thresholds)
    design: Annotated[Design, setting("duet (candidate and stable measured at once) or alternating")] = DEFAULT_DESIGN
    min_rounds: Annotated[int, setting("rounds measured before any decision", ge=DEFAULT_MIN_ROUNDS)] = (
        DEFAULT_MIN_ROUNDS
    )
    budget_s: Annotated[
        float,
        setting("seconds of the whole decision, loading included, after which an undecided gate is inconclusive", gt=0),
    ] = DEFAULT_BUDGET_S
    max_calibrated_budget_s: Annotated[
        Off,
        setting(
            "where this gate server's calibration (tritonship calibrate gate) says the limits need a longer budget, take "
            "it, up to this many seconds; 0 is off: such limits are inconclusive up front"
        ),
    ] = None
    calibrate_rounds: Annotated[
        int,
        setting(
            "the pipeline, before staging: measure this many A/A rounds of the stable version on each gate server and "
            "record them, as `tritonship calibrate gate` does, so the gate reads a current calibration; 0 is off",
            cli=False,
            ge=0,
        ),
    ] = 0
    # the code's own: perf_analyzer runs per round before the round counts as lost, the intervals' confidence and
    # one perf_analyzer run's time limit
    max_attempts: Annotated[int, Field(ge=1)] = DEFAULT_MAX_ATTEMPTS
    confidence: Annotated[float, Field(ge=0.5, lt=1)] = DEFAULT_CONFIDENCE
    perf_timeout_s: Annotated[float, Field(gt=0)] = DEFAULT_PERF_TIMEOUT_S
