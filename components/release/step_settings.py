"""The model steps' settings, and the one list of steps: which settings type each command and each pipeline task
takes (the gate's is components/settings.py's; publish's, stage's, tune's, quality's and promote's are beside their
steps). A settings type per step has named defaults, is
validated where it is built, and its fields are the step's `tritonship` options and the pipeline's parameters
(components/settings_model.py says how).

reject has nothing to set: its input (the verdict) is all it takes."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import model_validator

from components.release.promote.settings import PromoteSettings
from components.release.publish import PublishSettings
from components.release.quality.spec import QualitySettings
from components.release.stage import ModelLoadSettings
from components.release.tune.settings import TuneSettings
from components.repository.maintenance_settings import LeaseReleaseSettings, RepoGcSettings
from components.settings import (
    COMPILE_IMAGE,
    DEFAULT_COMPILE_DEVICE,
    DEFAULT_EXPORT_METHOD,
    DEFAULT_GOLDEN_SAMPLES,
    DEFAULT_PRECISION,
    DEFAULT_TARGET,
    DEFAULT_TENSORRT_OPT_BATCH,
    DEFAULT_TENSORRT_WORKSPACE_GB,
    PIPELINE_DIFFERENCES,
    TOOLS_IMAGE,
    ExportMethod,
    GateSettings,
    Precision,
    Target,
)
from components.settings_model import (
    Steps,
    StepSettings,
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
# The pipeline's tasks' settings, made from the pipeline's parameters (PIPELINE_STEPS.parameters(), with the pipeline's
# defaults: components/settings.py PIPELINE_DIFFERENCES); settings_op (pipelines/kfp_components.py) hands each task
# its own, by these names.
PIPELINE_STEPS = Steps(
    {
        "export": ExportSettings,
        "compile": CompileSettings,
        "publish": PublishSettings,
        "load": ModelLoadSettings,  # stage's
        "tune": TuneSettings,  # at the gate's load, within its p99 limit (TuneSettings.within)
        "quality": QualitySettings,
        "gate": GateSettings,
        "promote": PromoteSettings,
    },
    defaults=PIPELINE_DIFFERENCES,
)
