"""The settings of every step but the gate's (components/settings.py) and the canary's (canary_settings.py): a
settings type per step with named defaults, validated where it is built, whose fields are the step's `tritonship`
options and the pipeline's parameters (components/settings_model.py says how); and which settings each command
and each pipeline task takes.

reject has nothing to set: its input (the verdict) is all it takes."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

from pydantic import Field, model_validator

from components.release.canary_settings import CanarySettings
from components.release.quality_spec import QualitySettings
from components.repository.maintenance_settings import LeaseReleaseSettings, RepoGcSettings
from components.settings import (
    COMPILE_IMAGE,
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
    PIPELINE_DIFFERENCES,
    RELAXED_STABILITY_PCT,
    SERVING_TORCH,
    TOOLS_IMAGE,
    ExportMethod,
    GateSettings,
    LoadSettings,
    Precision,
    Target,
)
from components.settings_model import (
    Counts,
    Off,
    Option,
    SettingsError,
    StepSettings,
    flattened,
    refuse,
    setting,
    step_settings,
)

COUNTS = "whole numbers of 1 or more, comma-separated (like 1,2,4)"
# [registry[:port]/]path[:tag][@digest], as an image is named in a pod spec
IMAGE = r"^([a-z0-9][a-z0-9.-]*(:\d+)?/)?[a-z0-9][a-z0-9._/-]*(:\w[\w.-]{0,127})?(@sha256:[0-9a-f]{64})?$"


@step_settings("export")
class ExportSettings(StepSettings):
    golden_samples: Annotated[
        int,
        setting(
            "golden input samples generated (and kept for the accuracy checks)",
            flags=("--golden-samples", "--samples"),
            ge=1,
        ),
    ] = DEFAULT_GOLDEN_SAMPLES
    method: Annotated[
        ExportMethod,
        setting("auto (torch.export, then TorchScript), export, script or trace", pipeline="export_method"),
    ] = DEFAULT_EXPORT_METHOD
    # The two ways a pipeline run gets the user's package into the export task (docs/guide.md, "Your model's code").
    model_image: Annotated[
        str,
        setting(
            "the export task's image: one with the model's package (tritonship images build --model-package)",
            cli=False,
            expect="an image such as registry.example.com/ml/recs-model:1.0",
            pattern=IMAGE,
        ),
    ] = TOOLS_IMAGE
    model_packages: Annotated[
        str,
        setting(
            "pip requirement specifiers or wheel URIs (a path, https:// or s3://), separated by spaces, installed "
            "before the model is imported: for trials; an image with the package suits scheduled runs",
        ),
    ] = ""


@step_settings("publish")
class PublishSettings(StepSettings):
    """publish's: the serving image's torch, which a torch_aoti package must have been compiled with."""

    serving_torch: Annotated[
        str,
        setting(
            "the serving image's torch; a torch_aoti package compiled with another is refused",
            envvar="TRITONSHIP_SERVING_TORCH",
            expect="a torch version such as 2.14.0",
            pattern=r"^\d+\.\d+(\.\d+)?([+.\w-]*)$",
        ),
    ] = SERVING_TORCH


def _tolerance(what: str) -> Any:
    # the parity tolerances follow the precision unless given (components/model/parity.py)
    return setting(f"{what} (default: by precision)", pipeline=None, ge=0)


@step_settings("compile")
class CompileSettings(StepSettings):
    target: Annotated[
        Target, setting("torchscript, tensorrt or aoti (AOTInductor, Triton r26.03+)", pipeline="compile_target")
    ] = DEFAULT_TARGET
    # components/model/compile.py and aoti.py refuse the rest: TorchScript serves no bf16, and TorchScript and
    # AOTInductor compile fp16 and bf16 on CUDA only (tensorrt always compiles on a GPU)
    precision: Annotated[
        Precision, setting("fp32, fp16 or bf16; fp16 and bf16 on a CUDA --device, bf16 with tensorrt or aoti")
    ] = DEFAULT_PRECISION
    device: Annotated[
        str,
        setting(
            "where to compile and check parity: cpu, cuda or cuda:N",
            pipeline="compile_device",
            expect="cpu, cuda or cuda:N",
            pattern=r"^(cpu|cuda(:\d+)?)$",
        ),
    ] = DEFAULT_COMPILE_DEVICE
    opt_batch: Annotated[int, setting("the batch size TensorRT optimises for", pipeline="tensorrt_opt_batch", ge=1)] = (
        DEFAULT_TENSORRT_OPT_BATCH
    )
    workspace_gb: Annotated[float, setting("TensorRT's workspace, GiB", pipeline="tensorrt_workspace_gb", gt=0)] = (
        DEFAULT_TENSORRT_WORKSPACE_GB
    )
    compile_image: Annotated[
        str,
        setting(
            "the compile task's image; one with the model's package only where the model calls operators the package "
            "registers (tritonship images build --model-package PATH --on compile)",
            cli=False,
            expect="an image such as registry.example.com/ml/recs-compile:1.0",
            pattern=IMAGE,
        ),
    ] = COMPILE_IMAGE
    atol: Annotated[float | None, _tolerance("absolute tolerance of the parity check")] = None
    rtol: Annotated[float | None, _tolerance("relative tolerance of the parity check")] = None
    int_mismatch: Annotated[float | None, _tolerance("share of integer output elements that may differ")] = None

    @model_validator(mode="after")
    def _compiles(self) -> CompileSettings:
        if self.precision == "bf16" and self.target == "torchscript":
            refuse("{precision} bf16 needs {target} tensorrt or aoti (TorchScript serves fp32 or fp16)")
        refuse(
            f"{{precision}} {self.precision} with {{target}} {self.target} compiles on CUDA: give {{device}} cuda"
            if self.precision != "fp32" and self.target != "tensorrt" and not self.device.startswith("cuda")
            else ""
        )
        return self

    def step_arguments(self) -> dict[str, Any]:
        """compile_model's keyword arguments."""
        from components.model.parity import Tolerance

        tolerance = Tolerance.for_precision(self.precision, self.atol, self.rtol, self.int_mismatch)
        names = ("target", "precision", "device", "opt_batch", "workspace_gb")
        return {**{n: getattr(self, n) for n in names}, "tolerance": tolerance}


@step_settings("load")
class ModelLoadSettings(StepSettings):
    """stage's and promote's: how long a server may take to load the candidate."""

    load_timeout_s: Annotated[float, setting("seconds one model load may take on a server before it fails", gt=0)] = (
        DEFAULT_LOAD_TIMEOUT_S
    )


@step_settings("promote")
class PromoteSettings(StepSettings):
    """promote's: the load time limit and the canary (components/release/canary_settings.py)."""

    load: ModelLoadSettings = flattened(ModelLoadSettings)
    canary: CanarySettings = flattened(CanarySettings)

    @property
    def load_timeout_s(self) -> float:
        return self.load.load_timeout_s


@step_settings("tune")
class TuneSettings(StepSettings):
    # perf_analyzer's stability check relaxed, as the gate's: a busy machine's noise must not lose a trial
    load: LoadSettings = flattened(
        lambda: LoadSettings(concurrency=DEFAULT_CONCURRENCY, stability_pct=RELAXED_STABILITY_PCT)
    )
    # the pipeline tunes at the gate's load and within its p99 limit (at_gate); by hand they are set here
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

    def at_gate(self, gate: GateSettings) -> TuneSettings:
        """Tuned as the pipeline tunes: at the gate's load, within its p99 limit."""
        return dataclasses.replace(self, load=gate.load, max_p99_ms=gate.thresholds.max_p99_ms)


# Every step's settings type by its `tritonship` command (reject has none: see the docstring).
COMMANDS: dict[tuple[str, ...], type[StepSettings]] = {
    ("export",): ExportSettings,
    ("compile",): CompileSettings,
    ("publish",): PublishSettings,
    ("stage",): ModelLoadSettings,
    ("tune",): TuneSettings,
    ("quality",): QualitySettings,
    ("gate",): GateSettings,
    ("calibrate", "gate"): GateSettings,  # measured as the gate measures
    ("calibrate", "quality"): QualitySettings,  # measured as the quality step measures
    ("promote",): PromoteSettings,
    ("repo", "gc"): RepoGcSettings,
    ("lease", "release"): LeaseReleaseSettings,
}
# The pipeline's tasks' settings: settings_op (pipelines/kfp_components.py) hands each task its own, by these names.
PIPELINE_STEPS: dict[str, type[StepSettings]] = {
    "export": ExportSettings,
    "compile": CompileSettings,
    "publish": PublishSettings,
    "load": ModelLoadSettings,  # stage's
    "tune": TuneSettings,
    "quality": QualitySettings,
    "gate": GateSettings,
    "promote": PromoteSettings,
}


def pipeline_parameters() -> dict[str, Option]:
    """Every step setting that is a pipeline parameter, by its pipeline name, with the pipeline's default
    (components/settings.py PIPELINE_DIFFERENCES). One parameter may feed several steps (load_timeout_s: stage's
    and promote's)."""
    found: dict[str, Option] = {}
    for kind in PIPELINE_STEPS.values():
        for option in kind.options().values():
            if option.pipeline is None:
                continue
            chosen = dataclasses.replace(option, default=PIPELINE_DIFFERENCES.get(option.pipeline, option.default))
            same = found.setdefault(option.pipeline, chosen)
            if (same.help, same.default, same.pipeline_kind) != (chosen.help, chosen.default, chosen.pipeline_kind):
                raise TypeError(f"the pipeline parameter {option.pipeline} is two different settings")
    return found


def pipeline_settings(given: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The pipeline's parameters (by pipeline name; a missing one takes the pipeline's default) as each task's
    settings in their flat form, by step; every step's are built, so checked: a wrong value fails before anything
    runs. Tune measures at the gate's load, within its p99 limit."""
    parameters = pipeline_parameters()
    unknown = sorted(set(given) - set(parameters))
    if unknown:
        raise SettingsError("pipeline", [f"no parameter named {', '.join(unknown)}"])
    values = {name: given.get(name, p.default) for name, p in parameters.items()}
    steps: dict[str, Any] = {
        step: kind.from_flat(**{o.name: values[o.pipeline] for o in kind.options().values() if o.pipeline})
        for step, kind in PIPELINE_STEPS.items()
    }
    steps["tune"] = steps["tune"].at_gate(steps["gate"])
    # what no parameter sets and is None (compile's tolerances) is left out: from_flat gives it back
    return {step: {n: v for n, v in chosen.to_flat().items() if v is not None} for step, chosen in steps.items()}
