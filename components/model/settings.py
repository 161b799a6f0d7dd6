"""The model steps' settings, beside their steps: what export (components/model/export.py) and compile
(components/model/compile.py) take, whole. Their defaults are components/settings.py's named ones, bound here
only; components/release/step_settings.py lists them among the steps (components/settings_model.py says how a
settings type becomes the `tritonship` options and the pipeline's parameters)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import model_validator

from components.settings import (
    COMPILE_IMAGE,
    DEFAULT_COMPILE_DEVICE,
    DEFAULT_EXPORT_METHOD,
    DEFAULT_GOLDEN_SAMPLES,
    DEFAULT_PRECISION,
    DEFAULT_TARGET,
    DEFAULT_TENSORRT_OPT_BATCH,
    DEFAULT_TENSORRT_WORKSPACE_GB,
    TOOLS_IMAGE,
    ExportMethod,
    Precision,
    Target,
)
from components.settings_model import StepSettings, refuse, setting, step_settings

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
    # _compiles refuses the rest where the settings are built: TorchScript serves no bf16, and TorchScript and
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
