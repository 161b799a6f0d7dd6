"""The settings of every step but the gate (components/settings.py holds the gate's): a type per step with
named defaults, validated where it is built, and its flat table: the `tritonship` options and the pipeline's
parameters take their names, defaults and help from the table (tests/test_settings.py checks all three).

reject has nothing to set: its input (the verdict) is all it takes."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, get_args

from components.release.canary_settings import CANARY_PARAMETERS, CanarySettings
from components.release.quality_spec import QUALITY_PARAMETERS, QualitySettings
from components.repository.maintenance_settings import (
    LEASE_RELEASE_PARAMETERS,
    REPO_GC_PARAMETERS,
    LeaseReleaseSettings,
    RepoGcSettings,
)
from components.settings import (
    DEFAULT_COMPILE_DEVICE,
    DEFAULT_CONCURRENCY,
    DEFAULT_EXPORT_METHOD,
    DEFAULT_GOLDEN_SAMPLES,
    DEFAULT_INSTANCE_COUNTS,
    DEFAULT_INTRA_OP_THREAD_COUNTS,
    DEFAULT_LOAD_TIMEOUT_S,
    DEFAULT_PERF_TIMEOUT_S,
    DEFAULT_PRECISION,
    DEFAULT_TARGET,
    DEFAULT_TENSORRT_OPT_BATCH,
    DEFAULT_TENSORRT_WORKSPACE_GB,
    DEFAULT_TUNE_BUDGET,
    DEFAULT_TUNE_MIN_GAIN_PCT,
    DEFAULT_TUNE_P99_SLACK_PCT,
    DEFAULT_WINDOW_MS,
    GATE_PARAMETERS,
    RELAXED_STABILITY_PCT,
    SERVING_TORCH,
    TARGETS,
    ExportMethod,
    FlatSettings,
    GateSettings,
    LoadSettings,
    Parameter,
    Precision,
    Target,
    refuse_invalid,
    typed_flat,
)

EXPORT_METHODS: tuple[str, ...] = get_args(ExportMethod)
PRECISIONS: tuple[str, ...] = get_args(Precision)


EXPORT_PARAMETERS = {
    "golden_samples": Parameter(
        DEFAULT_GOLDEN_SAMPLES, "golden input samples generated (and kept for the accuracy checks)"
    ),
    "method": Parameter(
        DEFAULT_EXPORT_METHOD,
        "auto (torch.export, then TorchScript), export, script or trace",
        pipeline="export_method",
    ),
}


@dataclass(frozen=True)
class ExportSettings(FlatSettings):
    PARAMETERS: ClassVar = EXPORT_PARAMETERS
    WHAT: ClassVar = "export"
    golden_samples: int = DEFAULT_GOLDEN_SAMPLES
    method: ExportMethod = DEFAULT_EXPORT_METHOD

    def __post_init__(self) -> None:
        refuse_invalid(
            "export",
            [
                f"golden_samples must be at least 1, not {self.golden_samples}" if self.golden_samples < 1 else "",
                f"method must be one of {', '.join(EXPORT_METHODS)}, not {self.method!r}"
                if self.method not in EXPORT_METHODS
                else "",
            ],
        )


PUBLISH_PARAMETERS = {
    "serving_torch": Parameter(
        SERVING_TORCH, "the serving image's torch; a torch_aoti package compiled with another is refused"
    ),
}


@dataclass(frozen=True)
class PublishSettings(FlatSettings):
    """publish's: the serving image's torch, which a torch_aoti package must have been compiled with."""

    PARAMETERS: ClassVar = PUBLISH_PARAMETERS
    WHAT: ClassVar = "publish"
    serving_torch: str = SERVING_TORCH

    def __post_init__(self) -> None:
        valid = re.fullmatch(r"\d+\.\d+(\.\d+)?([+.\w-]*)", self.serving_torch or "")
        refuse_invalid(
            "publish",
            [f"serving_torch must be a torch version such as 2.14.0, not {self.serving_torch!r}" if not valid else ""],
        )


COMPILE_PARAMETERS = {
    "target": Parameter(
        DEFAULT_TARGET, "torchscript, tensorrt or aoti (AOTInductor, Triton r26.03+)", pipeline="compile_target"
    ),
    "precision": Parameter(DEFAULT_PRECISION, "fp32, fp16 or bf16 (bf16 with tensorrt or aoti on CUDA)"),
    "device": Parameter(
        DEFAULT_COMPILE_DEVICE, "where to compile and check parity: cpu, cuda or cuda:N", "compile_device"
    ),
    "opt_batch": Parameter(DEFAULT_TENSORRT_OPT_BATCH, "the batch size TensorRT optimises for", "tensorrt_opt_batch"),
    "workspace_gb": Parameter(DEFAULT_TENSORRT_WORKSPACE_GB, "TensorRT's workspace, GiB", "tensorrt_workspace_gb"),
    # the parity tolerances follow the precision unless given (components/model/parity.py)
    "atol": Parameter(None, "absolute tolerance of the parity check (default: by precision)", pipeline=None),
    "rtol": Parameter(None, "relative tolerance of the parity check (default: by precision)", pipeline=None),
    "int_mismatch": Parameter(None, "share of integer output elements that may differ (default: by precision)", None),
}


@dataclass(frozen=True)
class CompileSettings(FlatSettings):
    PARAMETERS: ClassVar = COMPILE_PARAMETERS
    WHAT: ClassVar = "compile"
    target: Target = DEFAULT_TARGET
    precision: Precision = DEFAULT_PRECISION
    device: str = DEFAULT_COMPILE_DEVICE
    opt_batch: int = DEFAULT_TENSORRT_OPT_BATCH
    workspace_gb: float = DEFAULT_TENSORRT_WORKSPACE_GB
    atol: float | None = None
    rtol: float | None = None
    int_mismatch: float | None = None

    def __post_init__(self) -> None:
        bad_tolerance = [n for n in ("atol", "rtol", "int_mismatch") if (getattr(self, n) or 0) < 0]
        refuse_invalid(
            "compile",
            [
                f"target must be one of {', '.join(TARGETS)}, not {self.target!r}"
                if self.target not in TARGETS
                else "",
                f"precision must be one of {', '.join(PRECISIONS)}, not {self.precision!r}"
                if self.precision not in PRECISIONS
                else "",
                "precision bf16 needs target tensorrt (TorchScript serves fp32 or fp16)"
                if self.precision == "bf16" and self.target != "tensorrt"
                else "",
                f"device must be cpu, cuda or cuda:N, not {self.device!r}"
                if not re.fullmatch(r"cpu|cuda(:\d+)?", self.device)
                else "",
                f"opt_batch must be at least 1, not {self.opt_batch}" if self.opt_batch < 1 else "",
                f"workspace_gb must be positive, not {self.workspace_gb}" if self.workspace_gb <= 0 else "",
                f"{', '.join(bad_tolerance)} must not be negative" if bad_tolerance else "",
            ],
        )

    def step_arguments(self) -> dict[str, Any]:
        """compile_model's keyword arguments."""
        from components.model.parity import Tolerance

        tolerance = Tolerance.for_precision(self.precision, self.atol, self.rtol, self.int_mismatch)
        names = ("target", "precision", "device", "opt_batch", "workspace_gb")
        return {**{n: getattr(self, n) for n in names}, "tolerance": tolerance}


LOAD_PARAMETERS = {
    "load_timeout_s": Parameter(DEFAULT_LOAD_TIMEOUT_S, "seconds one model load may take on a server before it fails")
}


@dataclass(frozen=True)
class ModelLoadSettings(FlatSettings):
    """stage's and promote's: how long a server may take to load the candidate."""

    PARAMETERS: ClassVar = LOAD_PARAMETERS
    WHAT: ClassVar = "load"
    load_timeout_s: float = DEFAULT_LOAD_TIMEOUT_S

    def __post_init__(self) -> None:
        refuse_invalid(
            "load", [f"load_timeout_s must be positive, not {self.load_timeout_s}" if self.load_timeout_s <= 0 else ""]
        )


PROMOTE_PARAMETERS = {**LOAD_PARAMETERS, **CANARY_PARAMETERS}


@dataclass(frozen=True)
class PromoteSettings:
    """promote's: the load time limit and the canary (components/release/canary_settings.py)."""

    load_timeout_s: float = DEFAULT_LOAD_TIMEOUT_S
    canary: CanarySettings = field(default_factory=CanarySettings)

    @classmethod
    def from_flat(cls, **flat: Any) -> PromoteSettings:
        load = {n: flat.pop(n) for n in list(flat) if n in LOAD_PARAMETERS}
        return cls(ModelLoadSettings.from_flat(**load).load_timeout_s, CanarySettings.from_flat(**flat))


def _counts_text(counts: tuple[int, ...]) -> str:
    return ",".join(map(str, counts))


TUNE_PARAMETERS = {
    "enabled": Parameter(
        True, "search the candidate's serving settings on the gate before the gate measures it", "tune", cli=False
    ),
    "budget": Parameter(
        DEFAULT_TUNE_BUDGET, "settings measured at most (two confirmation runs come on top)", "tune_budget"
    ),
    # the pipeline tunes at the gate's load and within its p99 limit; by hand they are set here
    "concurrency": Parameter(DEFAULT_CONCURRENCY, "perf_analyzer concurrency (use the gate's)", pipeline=None),
    "request_rate": Parameter(
        0.0,
        "a fixed request rate instead of the concurrency, /s: the lowest p99 that keeps up wins; 0 is off",
        pipeline=None,
    ),
    "window_ms": Parameter(DEFAULT_WINDOW_MS, "perf_analyzer measurement window, ms", pipeline=None),
    "stability_pct": Parameter(
        RELAXED_STABILITY_PCT,
        "perf_analyzer stability threshold, %; the default takes any three windows",
        pipeline=None,
    ),
    "max_p99_ms": Parameter(0.0, "p99 limit, ms; 0: the default settings' p99 plus the slack", pipeline=None),
    "p99_slack_pct": Parameter(
        DEFAULT_TUNE_P99_SLACK_PCT,
        "how much p99 may grow over the default settings' when no limit is given",
        "tune_p99_slack_pct",
    ),
    "min_gain_pct": Parameter(
        DEFAULT_TUNE_MIN_GAIN_PCT, "the smallest throughput gain that moves the search, %", "tune_min_gain_pct"
    ),
    "instance_counts": Parameter(
        _counts_text(DEFAULT_INSTANCE_COUNTS),
        "instance counts tried, comma-separated, for the model and for an ensemble's pre/post steps",
        "tune_instance_counts",
    ),
    "intra_op_threads": Parameter(
        _counts_text(DEFAULT_INTRA_OP_THREAD_COUNTS),
        "the PyTorch backend's intra-op thread counts tried, comma-separated (CPU models)",
        "tune_intra_op_threads",
    ),
}


def _counts(text: str, name: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(part) for part in str(text).split(","))
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise ValueError(
            f"invalid tune settings: {name} must be whole numbers of 1 or more, comma-separated (like 1,2,4), not {text!r}"
        )
    return counts


@dataclass(frozen=True)
class TuneSettings:
    # perf_analyzer's stability check relaxed, as the gate's: a busy machine's noise must not lose a trial
    load: LoadSettings = field(
        default_factory=lambda: LoadSettings(concurrency=DEFAULT_CONCURRENCY, stability_pct=RELAXED_STABILITY_PCT)
    )
    max_p99_ms: float | None = None
    p99_slack_pct: float = DEFAULT_TUNE_P99_SLACK_PCT
    budget: int = DEFAULT_TUNE_BUDGET
    min_gain_pct: float = DEFAULT_TUNE_MIN_GAIN_PCT
    instance_counts: tuple[int, ...] = DEFAULT_INSTANCE_COUNTS
    intra_op_thread_counts: tuple[int, ...] = DEFAULT_INTRA_OP_THREAD_COUNTS
    queue_delays_us: tuple[int, ...] = (0, 500, 2000, 8000)
    # the TorchScript profiling executor on and off; a CPU model keeps its own (tune)
    optimized_executions: tuple[bool, ...] = (True, False)
    perf_timeout_s: float = DEFAULT_PERF_TIMEOUT_S
    enabled: bool = True  # the pipeline's switch; `tritonship tune` always searches

    def __post_init__(self) -> None:
        refuse_invalid(
            "tune",
            [
                f"budget must be at least 1, not {self.budget}" if self.budget < 1 else "",
                f"p99_slack_pct must not be negative, not {self.p99_slack_pct}" if self.p99_slack_pct < 0 else "",
                f"min_gain_pct must not be negative, not {self.min_gain_pct}" if self.min_gain_pct < 0 else "",
                f"max_p99_ms must be positive, not {self.max_p99_ms}" if (self.max_p99_ms or 1) <= 0 else "",
                f"concurrency must be at least 1, not {self.load.concurrency}" if self.load.concurrency < 1 else "",
                f"request_rate must not be negative, not {self.load.request_rate}"
                if (self.load.request_rate or 0) < 0
                else "",
            ],
        )

    @classmethod
    def from_flat(cls, load: LoadSettings | None = None, **flat: Any) -> TuneSettings:
        """From TUNE_PARAMETERS' flat form; `load` (the gate's, in the pipeline) replaces the load's names."""
        values = typed_flat(TUNE_PARAMETERS, flat, "tune")
        load = load or LoadSettings(
            concurrency=values["concurrency"],
            request_rate=values["request_rate"] or None,
            window_ms=values["window_ms"],
            stability_pct=values["stability_pct"],
        )
        return cls(
            load=load,
            max_p99_ms=values["max_p99_ms"] or None,
            p99_slack_pct=values["p99_slack_pct"],
            budget=values["budget"],
            min_gain_pct=values["min_gain_pct"],
            instance_counts=_counts(values["instance_counts"], "instance_counts"),
            intra_op_thread_counts=_counts(values["intra_op_threads"], "intra_op_threads"),
            enabled=values["enabled"],
        )


# Every step's table and settings type by its `tritonship` command (reject has none: see the docstring), and the
# pipeline's steps among them.
STEP_PARAMETERS: dict[tuple[str, ...], tuple[dict[str, Parameter], Any]] = {
    ("export",): (EXPORT_PARAMETERS, ExportSettings),
    ("compile",): (COMPILE_PARAMETERS, CompileSettings),
    ("publish",): (PUBLISH_PARAMETERS, PublishSettings),
    ("stage",): (LOAD_PARAMETERS, ModelLoadSettings),
    ("tune",): (TUNE_PARAMETERS, TuneSettings),
    ("quality",): (QUALITY_PARAMETERS, QualitySettings),
    ("gate",): (GATE_PARAMETERS, GateSettings),
    ("promote",): (PROMOTE_PARAMETERS, PromoteSettings),
    ("repo", "gc"): (REPO_GC_PARAMETERS, RepoGcSettings),
    ("lease", "release"): (LEASE_RELEASE_PARAMETERS, LeaseReleaseSettings),
}
PIPELINE_STEPS = {
    "export": STEP_PARAMETERS[("export",)],
    "compile": STEP_PARAMETERS[("compile",)],
    "publish": STEP_PARAMETERS[("publish",)],
    "load": STEP_PARAMETERS[("stage",)],  # stage's and promote's
    "tune": STEP_PARAMETERS[("tune",)],
    "quality": STEP_PARAMETERS[("quality",)],
    "gate": STEP_PARAMETERS[("gate",)],
    "canary": (CANARY_PARAMETERS, CanarySettings),
}


def pipeline_parameters() -> dict[str, Parameter]:
    """Every step setting that is a pipeline parameter, by its pipeline name."""
    return {
        p.pipeline_name(n): p for table, _ in PIPELINE_STEPS.values() for n, p in table.items() if p.pipeline_name(n)
    }


def pipeline_settings(flat: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The pipeline's parameters (by pipeline name; missing ones take the pipeline's default) as each step's
    flat settings (by the table's names), every step's checked: a wrong value fails before anything runs."""
    unknown = sorted(set(flat) - set(pipeline_parameters()))
    if unknown:
        raise ValueError(f"invalid pipeline settings: no parameter named {', '.join(unknown)}")
    steps = {}
    for step, (table, kind) in PIPELINE_STEPS.items():
        steps[step] = {
            n: flat.get(p.pipeline_name(n), p.pipeline_default(n)) for n, p in table.items() if p.pipeline_name(n)
        }
        kind.from_flat(**steps[step])
    return steps
