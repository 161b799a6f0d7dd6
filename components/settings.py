"""Every step's named defaults, the flat parameter tables a person sets, and the gate's settings.

A step's table (GATE_PARAMETERS here, the others in components/release/step_settings.py) is the flat form of its
settings type: the `tritonship` options and the KFP pipeline's parameters take their names, defaults and
help from it, and tests/test_settings.py checks that the three agree. A limit or rate of 0 is off, in
every form (None is off too, from Python)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Literal, get_args

Design = Literal["duet", "alternating"]
DESIGNS: tuple[Design, ...] = ("duet", "alternating")
# The export and compile steps' choices (the CLI lists and checks them from these).
ExportMethod = Literal["auto", "export", "script", "trace"]  # auto: torch.export, then TorchScript
Target = Literal["torchscript", "tensorrt", "aoti"]
Precision = Literal["fp32", "fp16", "bf16"]
TARGETS: tuple[str, ...] = get_args(Target)

DEFAULT_CONCURRENCY = 1
DEFAULT_WINDOW_MS = 1000
DEFAULT_DESIGN: Design = "duet"
# the gate's and the canary's statistics (components/release/gate_stats.py): fewer rounds leave the interval's own error
# too large to stop on (and nothing to trim); intervals are two-sided at this confidence
DEFAULT_MIN_ROUNDS = 5
DEFAULT_CONFIDENCE = 0.90
DEFAULT_BUDGET_S = 120.0
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
class Parameter:
    """One setting as a person sets it: a `tritonship` option of the step's command and a pipeline parameter."""

    default: Any
    help: str
    pipeline: str | None = ""  # its name among the pipeline's parameters: "" the same name, None not one
    cli: bool = True  # an option of the step's `tritonship` command

    def pipeline_name(self, name: str) -> str | None:
        return name if self.pipeline == "" else self.pipeline

    def pipeline_default(self, name: str) -> Any:
        return PIPELINE_DIFFERENCES.get(self.pipeline_name(name) or "", self.default)


def refuse_invalid(what: str, problems: list[str]) -> None:
    """A settings type's validation: one ValueError naming every problem found (the empty strings are none)."""
    if any(problems):
        raise ValueError(f"invalid {what} settings: " + "; ".join(p for p in problems if p))


def typed_flat(table: dict[str, Parameter], flat: dict[str, Any], what: str) -> dict[str, Any]:
    """A flat form's values by the table (as KFP hands them over, text or floats for whole numbers become the
    default's type); missing names take their default; an unknown name or a value of the wrong type is refused."""
    unknown = sorted(set(flat) - set(table))
    if unknown:
        raise ValueError(f"invalid {what} settings: no parameter named {', '.join(unknown)}")
    values = {}
    for name, parameter in table.items():
        value, kind = flat.get(name, parameter.default), type(parameter.default)
        try:
            if value is None or parameter.default is None:
                values[name] = value
            elif kind is bool:
                values[name] = value if isinstance(value, bool) else str(value).lower() in ("1", "true", "yes")
            else:
                values[name] = int(float(value)) if kind is int else kind(value)
        except ValueError:
            raise ValueError(f"invalid {what} settings: {name} must be a {kind.__name__}, not {value!r}") from None
    return values


class FlatSettings:
    """from_flat for a settings type whose fields are its table's names."""

    PARAMETERS: ClassVar[dict[str, Parameter]]
    WHAT: ClassVar[str]

    @classmethod
    def from_flat(cls, **flat: Any) -> Any:
        return cls(**typed_flat(cls.PARAMETERS, flat, cls.WHAT))


GATE_PARAMETERS: dict[str, Parameter] = {
    "concurrency": Parameter(DEFAULT_CONCURRENCY, "perf_analyzer concurrency, per model"),
    "request_rate": Parameter(0.0, "a fixed request rate per model instead of concurrency; 0 is off"),
    "window_ms": Parameter(DEFAULT_WINDOW_MS, "length of one measured window, ms"),
    "design": Parameter(DEFAULT_DESIGN, "duet (candidate and stable measured at once) or alternating"),
    "min_rounds": Parameter(DEFAULT_MIN_ROUNDS, "rounds measured before any decision"),
    "budget_s": Parameter(
        DEFAULT_BUDGET_S,
        "seconds of the whole decision, loading included, after which an undecided gate is inconclusive",
    ),
    "max_p99_ms": Parameter(0.0, "absolute limit on the candidate's p99 latency, ms; 0 is off"),
    "min_throughput": Parameter(0.0, "absolute limit on the candidate's inferences/s; 0 is off"),
    "max_p99_regression_pct": Parameter(
        DEFAULT_MAX_REGRESSION_PCT, "p99 growth allowed against stable, percent; 0 is off"
    ),
    "max_throughput_regression_pct": Parameter(
        DEFAULT_MAX_REGRESSION_PCT, "throughput loss allowed against stable, percent; 0 is off"
    ),
}


@dataclass(frozen=True)
class Limits:
    """The limits that apply to one decision; None is off. Relative ones are fractions (0.10 = 10%)."""

    max_p99_ms: float | None = None
    min_throughput: float | None = None
    max_p99_increase: float | None = None
    max_throughput_drop: float | None = None


@dataclass(frozen=True)
class LoadSettings:
    """How perf_analyzer loads the server."""

    concurrency: int = 1
    request_rate: float | None = None  # if set, a fixed request rate instead of concurrency
    window_ms: int = DEFAULT_WINDOW_MS
    stability_pct: float = 20.0
    max_trials: int = 10
    percentile: int | None = None  # stabilise on this latency percentile; None: on average latency
    batch_size: int = 1
    protocol: str = "http"
    # client threads at a fixed request rate (None: rate_threads); perf_analyzer's own default (4 synchronous
    # HTTP threads) cannot send more than about 1,000 requests/s whatever the rate asked (measured on the H200)
    max_threads: int | None = None


@dataclass(frozen=True)
class Thresholds:
    """Limits; None is off. Relative ones are percent against the stable version."""

    max_p99_ms: float | None = None  # absolute: candidate p99 latency at the gate load
    min_throughput: float | None = None  # absolute: candidate inferences/s at the gate load
    max_p99_regression_pct: float | None = DEFAULT_MAX_REGRESSION_PCT
    max_throughput_regression_pct: float | None = DEFAULT_MAX_REGRESSION_PCT

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if value is not None and value <= 0:
                raise ValueError(f"the gate limit {name} must be positive (0 or none switches it off), not {value}")

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


@dataclass(frozen=True)
class GateSettings:
    concurrency: int = DEFAULT_CONCURRENCY
    request_rate: float | None = None  # a fixed request rate per model instead of concurrency
    window_ms: int = DEFAULT_WINDOW_MS
    thresholds: Thresholds = field(default_factory=Thresholds)
    design: Design = DEFAULT_DESIGN
    min_rounds: int = DEFAULT_MIN_ROUNDS
    budget_s: float = DEFAULT_BUDGET_S  # the whole decision's seconds after which an undecided gate is inconclusive
    max_attempts: int = DEFAULT_MAX_ATTEMPTS  # perf_analyzer runs per round before the round counts as lost
    confidence: float = DEFAULT_CONFIDENCE
    perf_timeout_s: float = DEFAULT_PERF_TIMEOUT_S

    def __post_init__(self) -> None:
        refuse_invalid(
            "gate",
            [
                f"concurrency must be at least 1, not {self.concurrency}" if self.concurrency < 1 else "",
                f"window_ms must be at least 100, not {self.window_ms}" if self.window_ms < 100 else "",
                f"design must be one of {', '.join(DESIGNS)}, not {self.design!r}"
                if self.design not in DESIGNS
                else "",
                f"min_rounds must be at least {DEFAULT_MIN_ROUNDS}, not {self.min_rounds}"
                if self.min_rounds < DEFAULT_MIN_ROUNDS
                else "",
                f"budget_s must be positive, not {self.budget_s}" if self.budget_s <= 0 else "",
                f"max_attempts must be at least 1, not {self.max_attempts}" if self.max_attempts < 1 else "",
                f"confidence must be between 0.5 and 1, not {self.confidence}"
                if not 0.5 <= self.confidence < 1
                else "",
            ],
        )

    @classmethod
    def from_flat(cls, **flat: Any) -> GateSettings:
        """From GATE_PARAMETERS' flat form (CLI options, KFP parameters; values may come as text or floats
        from KFP): missing names take their default, a limit or rate of 0 or None is off."""
        values = typed_flat(GATE_PARAMETERS, flat, "gate")
        off = lambda v: v if v else None  # noqa: E731
        thresholds = Thresholds(
            *(
                off(values.pop(n))
                for n in ("max_p99_ms", "min_throughput", "max_p99_regression_pct", "max_throughput_regression_pct")
            )
        )
        return cls(thresholds=thresholds, request_rate=off(values.pop("request_rate")), **values)

    def to_flat(self) -> dict[str, Any]:
        """The inverse of from_flat (0 for what is off)."""
        flat = {name: getattr(self, name, None) for name in GATE_PARAMETERS}
        flat.update(asdict(self.thresholds))
        return {name: (0.0 if value is None else value) for name, value in flat.items()}

    @property
    def load(self) -> LoadSettings:
        return LoadSettings(
            concurrency=self.concurrency,
            request_rate=self.request_rate,
            window_ms=self.window_ms,
            stability_pct=RELAXED_STABILITY_PCT,
        )
