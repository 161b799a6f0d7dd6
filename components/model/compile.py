"""Compile step: an exported model to a Triton-ready, parity-checked model folder.

Targets:
- `tensorrt`: Torch-TensorRT 2.14 dynamo path (docs/design.md section 5), saved as TorchScript model.pt
  for Triton's PyTorch backend. Needs CUDA and torch_tensorrt (the compile image).
- `torchscript`: traced and frozen TorchScript on CPU or CUDA; fp16 on CUDA.
- `aoti`: an AOTInductor package, model.pt2, for the same backend's `torch_aoti` platform (r26.03 and later),
  on CPU or CUDA; fp16 and bf16 on CUDA (components/model/aoti.py).

The torchscript target starts from the eager module's trace that the export step made beside a
torch.export artifact (components/model/export.py says why), else from the exported model itself.
The compiled file is loaded back from disk and run on the golden inputs and at every shape the export
step recorded (batch 1, an odd batch, max_batch_size, two sizes of each dynamic dimension), which
catches sizes baked in by tracing; every output is compared with the eager fp32 reference. A mismatch
or a failed run stops the step, says which shape failed and why, and writes nothing.
"""

from __future__ import annotations

import os
import platform
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from components import log
from components.model import aoti, model_config, model_folder, trace_retarget
from components.model.compile_errors import CompileError, ParityError, root_cause
from components.model.export import ExportedModel, read_export
from components.model.model_config import validate_model_name
from components.model.parity import OutputParity, Tolerance, compare, parity_table
from components.model.settings import CompileSettings
from components.model.signature import FLOAT_DTYPES, POINTS, Signature
from components.settings import Precision

LOG = log.get("compile")
COMPILE_IMAGE_HINT = "run the compile step in the compile image (images/compile.Dockerfile, NGC pytorch:<YY.MM>-py3)"


# ---------------------------------------------------------------------------------- TensorRT
def tensorrt_compile_settings(
    signature: Signature,
    precision: Precision,
    opt_batch: int,
    workspace_bytes: int,
    device_index: int = 0,
) -> dict[str, Any]:
    """The keyword arguments for `torch_tensorrt.compile` (Torch-TensorRT 2.14, dynamo path).

    Kept apart from the call so that the settings are tested where TensorRT does not exist. On the
    dynamo path `enabled_precisions` is ignored: low precision comes from autocast.
    """
    # one optimisation profile: the batch from 1 over opt_batch to max_batch_size, every other dynamic
    # dimension over its declared range (min, opt, max)
    batches = {"min": 1, "opt": min(opt_batch, signature.max_batch_size), "max": signature.max_batch_size}
    import_free_inputs = [
        {
            **{f"{point}_shape": signature.shape_at(spec, batches[point], point) for point in POINTS},
            "dtype": spec.torch_dtype,
            "name": spec.name,
        }
        for spec in signature.inputs
    ]
    settings: dict[str, Any] = {
        "ir": "dynamo",
        "inputs_spec": import_free_inputs,
        "workspace_size": workspace_bytes,
        "device": f"cuda:{device_index}",
        "min_block_size": 1,
        "truncate_double": True,
        "require_full_compilation": False,
    }
    if precision in ("fp16", "bf16"):
        settings["enable_autocast"] = True
        settings["autocast_low_precision_type"] = torch.float16 if precision == "fp16" else torch.bfloat16
    return settings


def require_tensorrt() -> Any:
    """torch_tensorrt, or a plain error naming what is missing and where to run instead."""
    try:
        import torch_tensorrt
    except ImportError:
        raise CompileError(f"Torch-TensorRT (torch_tensorrt) is not installed here; {COMPILE_IMAGE_HINT}.") from None
    if not torch.cuda.is_available():
        raise CompileError(
            f"the tensorrt target needs a CUDA GPU and none is visible; {COMPILE_IMAGE_HINT} on a GPU node."
        )
    return torch_tensorrt


def compile_tensorrt(module: nn.Module, exported: ExportedModel, settings: dict[str, Any], path: Path) -> None:
    torch_tensorrt = require_tensorrt()
    kwargs = dict(settings)
    inputs = [
        torch_tensorrt.Input(**{k: v for k, v in spec.items() if k != "name"}) for spec in kwargs.pop("inputs_spec")
    ]
    device = kwargs["device"]
    compiled = torch_tensorrt.compile(module.to(device), arg_inputs=inputs, **kwargs)
    example = [torch.from_numpy(a[:1]).to(device) for a in exported.golden_inputs.values()]
    torch_tensorrt.save(compiled, str(path), output_format="torchscript", arg_inputs=example)


# -------------------------------------------------------------------------------- TorchScript
class GpuServing(nn.Module):
    """A CUDA model as the PyTorch backend serves it: in fp16 when `half` (the client's I/O dtypes kept) and
    its outputs handed back on the host. A client's answer goes to the host anyway; an ensemble's Python
    step would otherwise copy them from the GPU itself, on CUDA's legacy default stream, which waits for
    every kernel the model's instances have queued (benchmarks/README.md: the post step's milliseconds)."""

    def __init__(self, model: nn.Module, output_dtypes: list[torch.dtype], half: bool) -> None:
        super().__init__()
        if half and isinstance(model, torch.jit.ScriptModule):  # a trace keeps the fp32 it was traced in
            trace_retarget.point_at_dtype(model, torch.float32, torch.float16)
        self.model = model.half() if half else model
        self.output_dtypes = output_dtypes
        self.half = half

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        cast = [a.half() if self.half and a.is_floating_point() else a for a in args]
        result = self.model(*cast)
        outputs = (result,) if isinstance(result, torch.Tensor) else tuple(result)
        host = torch.device("cpu")
        return tuple(o.to(device=host, dtype=d) for o, d in zip(outputs, self.output_dtypes, strict=True))


def compile_torchscript(
    module: nn.Module, exported: ExportedModel, device: str, precision: Precision, path: Path
) -> None:
    signature = exported.signature
    example = tuple(torch.from_numpy(a[: min(2, len(a))]).to(device) for a in exported.golden_inputs.values())
    if not signature.batch:
        example = tuple(torch.from_numpy(a).to(device) for a in exported.golden_inputs.values())
    module = module.to(device)  # already in inference mode; exported graph modules refuse .eval()
    if device.startswith("cuda"):
        module = GpuServing(module, [s.torch_dtype for s in signature.outputs], half=precision == "fp16")
    with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
        warnings.simplefilter("ignore")  # tracer warnings about runtime asserts of exported graphs
        scripted = (
            module
            if isinstance(module, torch.jit.ScriptModule)
            else torch.jit.trace(module, example, check_trace=False)
        )
        # freeze folds parameters and conv-bn; optimize_for_inference is left out: its MKLDNN rewrite
        # saves files that torch.jit.load cannot read back.
        frozen = torch.jit.freeze(scripted.eval())
    frozen.save(str(path))


# ------------------------------------------------------------------------------------- parity
def check_parity(path: Path, exported: ExportedModel, device: str, tol: Tolerance) -> list[OutputParity]:
    """Load the compiled file back and compare its outputs with the eager fp32 reference."""
    signature = exported.signature
    if path.name == aoti.MODEL_FILE:
        compiled = aoti.load_aoti(path, signature, device)
    else:
        compiled = torch.jit.load(str(path), map_location=device).eval()
    # the shape checks first: a failure then names the smallest shape that fails
    checks = [(name, inputs, outputs) for name, (inputs, outputs) in exported.checks.items()]
    checks.append(("golden", exported.golden_inputs, exported.golden_outputs))
    if not exported.checks and signature.batch and len(next(iter(exported.golden_inputs.values()))) > 1:
        first = {k: v[:1] for k, v in exported.golden_inputs.items()}  # an export made before checks.npz
        checks.append(("batch 1", first, {k: v[:1] for k, v in exported.golden_outputs.items()}))
    results = []
    for check, inputs, reference in checks:
        got = _run_in_batches(compiled, signature, inputs, device, check)
        results += [compare(s.name, got[s.name], reference[s.name], tol, check) for s in signature.outputs]
    return results


def _run_in_batches(
    compiled: Callable[..., Any], signature: Signature, inputs: dict[str, np.ndarray], device: str, check: str
) -> dict[str, np.ndarray]:
    """Run as Triton would: requests of at most max_batch_size samples."""
    total = len(next(iter(inputs.values())))
    step = signature.max_batch_size if signature.batch else total
    parts: list[dict[str, np.ndarray]] = []
    for start in range(0, total, step):
        rows = slice(start, start + step) if signature.batch else slice(None)
        args = [torch.from_numpy(np.ascontiguousarray(inputs[s.name][rows])).to(device) for s in signature.inputs]
        try:
            with torch.inference_mode():
                result = compiled(*args)
        except Exception as exc:
            shapes = ", ".join(f"{s.name} {list(a.shape)}" for s, a in zip(signature.inputs, args, strict=True))
            raise ParityError(
                f"the compiled model failed at {check} ({shapes}): {root_cause(exc)}; {_fix_hint(signature)}"
            ) from None
        outputs = (result,) if isinstance(result, torch.Tensor) else tuple(result)
        parts.append(
            {
                spec.name: t.detach().float().cpu().numpy() if spec.dtype in FLOAT_DTYPES else t.detach().cpu().numpy()
                for spec, t in zip(signature.outputs, outputs, strict=True)
            }
        )
    return {s.name: np.concatenate([p[s.name] for p in parts]) for s in signature.outputs}


def _fix_hint(signature: Signature) -> str:
    hint = (
        "a size of the example was probably fixed into the TorchScript. Tracing records `x.size(0)` as an "
        "operation but not a Python number made from it (int(), len(), .tolist()): compute sizes with tensor "
        "operations, or export with `--method script`"
    )
    if not signature.has_dynamic_dims:
        hint += "; if a dimension besides the batch varies, mark it -1 in the signature"
    return hint + "."


# -------------------------------------------------------------------------------- fingerprint
def build_fingerprint(target: str, precision: str, device: str) -> dict[str, Any]:
    info: dict[str, Any] = {
        "target": target,
        "precision": precision,
        "device": device,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cuda": torch.version.cuda,
        "image": os.environ.get("TRITONSHIP_IMAGE"),
        "host": platform.node(),
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        index = torch.device(device).index or 0
        info["gpu"] = torch.cuda.get_device_name(index)
        info["compute_capability"] = ".".join(map(str, torch.cuda.get_device_capability(index)))
    for package in ("torch_tensorrt", "tensorrt"):
        try:
            info[package] = __import__(package).__version__
        except Exception:
            info[package] = None
    return info


# ----------------------------------------------------------------------------------- the step
@dataclass(frozen=True)
class CompileResult:
    out_dir: Path
    target: str
    precision: str
    device: str
    parity: list[OutputParity]
    seconds: float


def compile_model(export_dir: Path, out_dir: Path, name: str, settings: CompileSettings | None = None) -> CompileResult:
    """The compile step, as `settings` say: compile, check parity (within the settings' tolerances, the
    precision's where they give none), write the Triton model folder. Nothing is written on failure."""
    settings = settings or CompileSettings()
    target, precision, device = settings.target, settings.precision, settings.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise CompileError(
            f"--device {device} was asked for but no CUDA GPU is visible; use --device cpu or a GPU node."
        )
    if out_dir.exists() and any(out_dir.iterdir()):
        raise CompileError(f"{out_dir} already exists and is not empty; choose a new output folder.")
    validate_model_name(name)
    exported = read_export(export_dir)
    tol = Tolerance.for_precision(precision, settings.atol, settings.rtol, settings.int_mismatch)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tritonship-compile-") as tmp:
        platform = model_config.AOTI_PLATFORM if target == "aoti" else model_config.PYTORCH_PLATFORM
        compiled_path = Path(tmp) / model_config.MODEL_FILES[platform]
        if target == "tensorrt":
            require_tensorrt()
            device = device if device.startswith("cuda") else "cuda:0"
        if target == "aoti":
            aoti.compile_aoti(exported, device, precision, compiled_path)
        elif target == "tensorrt":
            module = exported.module(device)
            index = torch.device(device).index or 0
            workspace = int(settings.workspace_gb * 2**30)
            trt = tensorrt_compile_settings(exported.signature, precision, settings.opt_batch, workspace, index)
            compile_tensorrt(module, exported, trt, compiled_path)
        else:
            module = exported.module(device, prefer_torchscript=True)
            compile_torchscript(module, exported, device, precision, compiled_path)
        seconds = time.monotonic() - started
        parity = check_parity(compiled_path, exported, device, tol)
        for row in parity:
            log.event(
                LOG, "parity", output=row.name, check=row.check, max_abs_err=f"{row.max_abs_err:.3g}", ok=row.passed
            )
        if not all(r.passed for r in parity):
            raise ParityError(
                f"the compiled model does not match the eager model (atol {tol.atol:g}, rtol {tol.rtol:g}, integer "
                f"mismatch {tol.int_mismatch:.0%}); nothing was written:\n{parity_table(parity)}"
            )
        fingerprint = build_fingerprint(target, precision, device)
        fingerprint["compile_seconds"] = round(seconds, 3)
        fingerprint["export"] = {k: exported.info.get(k) for k in ("method", "fallback_reason", "source", "torch")}
        fingerprint["parity"] = [asdict(r) for r in parity]
        fingerprint["tolerance"] = asdict(tol)
        model_folder.write(
            out_dir,
            name,
            exported.signature,
            compiled_path,
            exported.golden_inputs,
            exported.golden_outputs,
            fingerprint,
            gpu=device.startswith("cuda"),
            platform=platform,
        )
    log.event(LOG, "compiled", target=target, precision=precision, device=device, seconds=f"{seconds:.1f}", out=out_dir)
    return CompileResult(out_dir, target, precision, device, parity, seconds)
