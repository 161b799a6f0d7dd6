"""Export step: a user's PyTorch model, checked against its I/O signature, saved with golden samples.

The model comes as `package.module:factory` (+ optional state_dict checkpoint, local or s3://), a
TorchScript file, or a saved ExportedProgram (.pt2). It is run on inputs generated from the
signature to check names, dtypes and shapes, then exported with `torch.export` (dynamic batch) or,
when that fails, as TorchScript (script, then trace), with the reason logged.

    <out>/exported.pt2 | <out>/model.ts     the exported model
    <out>/model.ts                           beside exported.pt2: the eager module traced, for TorchScript
    <out>/signature.yaml                     the checked signature
    <out>/golden.npz                         golden inputs and eager fp32 reference outputs
    <out>/checks.npz                         inputs and eager outputs at the shapes compile checks
    <out>/export.json                        how it was exported (method, fallback reason, versions)

Why the eager module is traced beside torch.export: the TorchScript that Triton's PyTorch backend serves
cannot come from the exported program. `torch.jit.trace` of `ExportedProgram.module()` bakes the
example's sizes into shape-reading ops (`expand(B, -1)`, `view(B, ...)`, transformers' position ids),
so it fails at any other batch size; scripting fails on most real models (transformers among them);
tracing the eager module records `size()` calls as graph ops and stays batch-dynamic. The export step
is the only step that holds the eager module, so it traces it here; compile checks the result at
batch 1, an odd size, max_batch_size and two lengths of every dynamic dimension.
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from components import log
from components.model import trace_retarget
from components.model.model_folder import load_checks, load_golden, save_checks, save_golden
from components.model.model_source import IMAGE_ENV, ExportError, first_line, load_model, load_saved
from components.model.settings import ExportSettings
from components.model.signature import POINTS, Signature, SignatureError, check_tensor, dtype_name
from components.s3 import S3Settings
from components.settings import ExportMethod as Method

LOG = log.get("export")
EXPORTED_PROGRAM_FILE = "exported.pt2"
TORCHSCRIPT_FILE = "model.ts"
EXPORT_INFO_FILE = "export.json"
SIGNATURE_FILE = "signature.yaml"
GOLDEN_FILE = "golden.npz"
CHECKS_FILE = "checks.npz"
# dynamic dimensions other than the batch: the golden samples' size, and two more sizes compile checks


@dataclass(frozen=True)
class ExportResult:
    out_dir: Path
    method: str
    artifact: str
    fallback_reason: str | None
    golden_samples: int


# -------------------------------------------------------------------------------------- loading
# ------------------------------------------------------------------------------ signature check
def run_model(model: nn.Module, signature: Signature, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run the model on named numpy inputs (in signature order) and name its outputs by the signature."""
    args = [torch.from_numpy(np.ascontiguousarray(inputs[s.name])) for s in signature.inputs]
    with torch.inference_mode():
        try:
            result = model(*args)
        except Exception as exc:
            called = ", ".join(
                f"{s.name}: {s.dtype}{list(a.shape)}" for s, a in zip(signature.inputs, args, strict=True)
            )
            raise SignatureError(
                f"the model failed when called with the signature's inputs ({called}): {first_line(exc)}; "
                "check those inputs' dtypes and shapes in the signature."
            ) from None
    tensors = _as_tuple(result)
    if len(tensors) != len(signature.outputs):
        raise SignatureError(
            f"the model returns {len(tensors)} output(s), the signature names {len(signature.outputs)}: "
            f"{[s.name for s in signature.outputs]}."
        )
    outputs = {}
    for spec, tensor in zip(signature.outputs, tensors, strict=True):
        if not isinstance(tensor, torch.Tensor):
            raise SignatureError(f"output '{spec.name}' is a {type(tensor).__name__}, not a tensor.")
        check_tensor(spec, tuple(tensor.shape), dtype_name(tensor.dtype), "output")
        outputs[spec.name] = tensor.detach().cpu().numpy()
    return outputs


def reference_outputs(
    model: nn.Module, signature: Signature, inputs: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """The model's outputs for many samples, run in batches no larger than the signature allows."""
    if not signature.batch:
        return run_model(model, signature, inputs)
    total, step = len(next(iter(inputs.values()))), signature.max_batch_size
    parts = [
        run_model(model, signature, {k: v[i : i + step] for k, v in inputs.items()}) for i in range(0, total, step)
    ]
    return {s.name: np.concatenate([p[s.name] for p in parts]) for s in signature.outputs}


def check_forward_parameters(model: nn.Module, signature: Signature) -> None:
    """Triton binds inputs by position: the signature must list forward()'s parameters, in order."""
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return  # no Python signature to compare with (some scripted modules)
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p.name for p in positional if p.default is p.empty]
    names = [s.name for s in signature.inputs]
    if len(names) < len(required) or len(names) > len(positional):
        missing = [n for n in required if n not in names]
        detail = f"; missing: {', '.join(missing)}" if missing else ""
        raise SignatureError(
            f"the model's forward() takes ({', '.join(p.name for p in positional)}), the signature's inputs are "
            f"({', '.join(names)}){detail}."
        )
    forward_names = [p.name for p in positional[: len(names)]]
    if sorted(forward_names) == sorted(names) and forward_names != names:
        raise SignatureError(
            f"the signature lists the inputs as ({', '.join(names)}) but forward() takes them as "
            f"({', '.join(forward_names)}); Triton passes inputs by position, so use forward()'s order."
        )


def check_signature(model: nn.Module, signature: Signature) -> None:
    """Run the model at two batch sizes; raise naming the tensor that disagrees with the signature."""
    check_forward_parameters(model, signature)
    for batch in (1, 3) if signature.batch else (1,):
        outputs = run_model(model, signature, signature.example_inputs(batch, seed=batch))
        if signature.batch:
            for spec in signature.outputs:
                if outputs[spec.name].shape[0] != batch:
                    raise SignatureError(
                        f"output '{spec.name}': dimension 0 is {outputs[spec.name].shape[0]} for a batch of "
                        f"{batch}; with batch: true every output must keep the batch dimension."
                    )


def _as_tuple(result: Any) -> tuple[Any, ...]:
    if isinstance(result, torch.Tensor):
        return (result,)
    if isinstance(result, list | tuple):
        return tuple(result)
    if isinstance(result, Mapping):
        return tuple(result.values())
    return (result,)


# ------------------------------------------------------------------------------------ exporting
def check_shapes(signature: Signature) -> dict[str, dict[str, np.ndarray]]:
    """Inputs at the shapes compile must get right: batch 1, an odd batch and max_batch_size, each with every
    dynamic dimension besides the batch at its range's min, opt and max (a size fixed in by tracing shows at
    either end)."""
    if signature.batch:
        largest = signature.max_batch_size
        batches = sorted({1, min(3, largest) if largest % 2 == 0 or largest < 3 else max(1, largest - 2), largest})
    else:
        batches = [1]
    points = POINTS if signature.has_dynamic_dims else ("opt",)
    sets = {}
    for point in points:
        for b in batches:
            label = f"batch {b}" if signature.batch else "unbatched"
            if signature.has_dynamic_dims:
                label += f", {signature.dynamic_lengths(point)} ({point})"
            sets[label] = signature.example_inputs(b, seed=100 + b + 1000 * POINTS.index(point), dynamic_size=point)
    return sets


def export_model(model: nn.Module, signature: Signature, out_dir: Path, method: Method) -> tuple[str, str, str | None]:
    """Save the model; returns (method used, file name, reason torch.export was not used). After a
    torch.export, the eager module is also traced to model.ts for the TorchScript targets (see above)."""
    example = tuple(torch.from_numpy(a) for a in signature.example_inputs(2).values())
    reason = None
    if isinstance(model, torch.jit.ScriptModule):
        model.save(str(out_dir / TORCHSCRIPT_FILE))
        return "torchscript-file", TORCHSCRIPT_FILE, "the model was given as TorchScript"
    if method in ("auto", "export"):
        try:
            program = torch.export.export(model, example, dynamic_shapes=dynamic_shapes(signature))
            torch.export.save(program, str(out_dir / EXPORTED_PROGRAM_FILE))
            try:
                _trace(model, example, out_dir / TORCHSCRIPT_FILE)
            except Exception as exc:  # the TorchScript targets then trace the exported program (parity checks it)
                log.event(LOG, "tracing the eager module failed", reason=first_line(exc))
            return "torch.export", EXPORTED_PROGRAM_FILE, None
        except Exception as exc:
            if method == "export":
                raise ExportError(f"torch.export failed: {first_line(exc)}.") from None
            reason = f"torch.export failed: {first_line(exc)}"
            log.event(LOG, "torch.export failed, falling back to TorchScript", reason=reason)
    if method in ("auto", "script"):
        try:
            torch.jit.script(model).save(str(out_dir / TORCHSCRIPT_FILE))
            return "torch.jit.script", TORCHSCRIPT_FILE, reason
        except Exception as exc:
            if method == "script":
                raise ExportError(f"torch.jit.script failed: {first_line(exc)}.") from None
            reason = f"{reason}; torch.jit.script failed: {first_line(exc)}" if reason else first_line(exc)
            log.event(LOG, "torch.jit.script failed, falling back to tracing", reason=first_line(exc))
    try:
        _trace(model, example, out_dir / TORCHSCRIPT_FILE)
    except Exception as exc:
        raise ExportError(
            f"the model could not be exported by any method; tracing failed: {first_line(exc)}."
        ) from None
    return "torch.jit.trace", TORCHSCRIPT_FILE, reason


def _trace(model: nn.Module, example: tuple[torch.Tensor, ...], path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.trace(model, example, check_trace=False).save(str(path))


def dynamic_shapes(signature: Signature) -> tuple[dict[int, Any], ...]:
    """The batch is dynamic up to max_batch_size; a named dimension is one torch.export Dim over its declared
    range, shared by every input that names it; a bare -1 is left to torch.export to work out (Dim.AUTO:
    dynamic, and equal where the model makes them equal, such as ids and their mask)."""
    batch = torch.export.Dim("batch", min=1, max=signature.max_batch_size) if signature.batch else None
    named = {n: torch.export.Dim(n, min=r.min, max=r.max) for n, r in signature.dims.items()}
    shapes = []
    for spec in signature.inputs:
        names = spec.dim_names or (None,) * len(spec.shape)
        dims: dict[int, Any] = {
            i: named[name] if name else torch.export.Dim.AUTO
            for i, (d, name) in enumerate(zip(spec.shape, names, strict=True))
            if d == -1
        }
        if batch is not None:
            dims[0] = batch
        shapes.append(dims)
    return tuple(shapes)


def golden_inputs(signature: Signature, samples: int, supplied: Path | None) -> dict[str, np.ndarray]:
    """The user's samples (an .npz keyed by input name), checked, or valid random ones."""
    if supplied is None:
        return signature.example_inputs(samples if signature.batch else 1, seed=1234)  # dynamic dims at their opt
    try:
        with np.load(supplied, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError) as exc:
        raise ExportError(f"the golden samples {supplied} are not a readable .npz: {first_line(exc)}.") from None
    signature.check_arrays(arrays, signature.inputs, f"golden samples {supplied.name}")
    return arrays


def export(
    model_source: str,
    signature_path: Path,
    out_dir: Path,
    settings: ExportSettings | None = None,
    checkpoint: str | None = None,
    golden: Path | None = None,
    s3: S3Settings | None = None,
) -> ExportResult:
    """The export step: `settings` say how many golden samples to make (unless `golden` gives them) and by which
    method. Writes `out_dir` only once everything is checked. The settings' model_packages are installed by the
    caller, before (model_packages.py)."""
    settings = settings or ExportSettings()
    signature = Signature.load(signature_path)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ExportError(f"{out_dir} already exists and is not empty; choose a new output folder.")
    model = load_model(model_source, checkpoint, s3)
    check_signature(model, signature)
    inputs = golden_inputs(signature, settings.golden_samples, golden)
    reference = reference_outputs(_fp32(model), signature, inputs)
    staging = Path(tempfile.mkdtemp(prefix=".export-", dir=out_dir.parent if out_dir.parent.exists() else None))
    try:
        used, artifact, reason = export_model(model, signature, staging, settings.method)
        signature.save(staging / SIGNATURE_FILE)
        save_golden(staging / GOLDEN_FILE, inputs, reference)
        checks = {
            name: (x, reference_outputs(_fp32(model), signature, x)) for name, x in check_shapes(signature).items()
        }
        save_checks(staging / CHECKS_FILE, checks)
        result = ExportResult(out_dir, used, artifact, reason, len(next(iter(inputs.values()))))
        info = {**asdict(result), "out_dir": str(out_dir), "source": model_source, "torch": torch.__version__}
        info["image"] = os.environ.get(IMAGE_ENV)  # where the model's code was: compile's build.json says its own
        info["checkpoint"] = checkpoint
        info["torchscript"] = TORCHSCRIPT_FILE if (staging / TORCHSCRIPT_FILE).is_file() else None
        (staging / EXPORT_INFO_FILE).write_text(json.dumps(info, indent=2))
        if out_dir.exists():
            out_dir.rmdir()
        staging.rename(out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log.event(LOG, "exported", method=used, artifact=artifact, samples=result.golden_samples, out=out_dir)
    return result


def _fp32(model: nn.Module) -> nn.Module:
    """The reference runs in fp32 whatever the model's own precision."""
    if isinstance(model, torch.jit.ScriptModule):
        return model
    return model.float()


# ------------------------------------------------------------------------------- reading exports
@dataclass(frozen=True)
class ExportedModel:
    path: Path
    signature: Signature
    golden_inputs: dict[str, np.ndarray]
    golden_outputs: dict[str, np.ndarray]
    info: dict[str, Any]
    checks: dict[str, tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]

    @property
    def artifact(self) -> Path:
        return self.path / self.info["artifact"]

    @property
    def source(self) -> str | None:
        """The model as export was given it (a factory registers its package's operators where it is here)."""
        return self.info.get("source")

    def module(self, device: str = "cpu", prefer_torchscript: bool = False) -> nn.Module:
        """The exported model on `device`; with `prefer_torchscript`, the eager module's trace if export made one."""
        traced = self.path / (self.info.get("torchscript") or "")
        if prefer_torchscript and traced.is_file():
            module = load_saved(traced, lambda: torch.jit.load(str(traced), map_location=device), self.source)
            module = module.eval()
            if torch.device(device).type != "cpu":
                trace_retarget.point_at_device(module, device)
            return module
        if self.artifact.name == EXPORTED_PROGRAM_FILE:
            program = load_saved(self.artifact, lambda: torch.export.load(str(self.artifact)), self.source)
            if device != "cpu":
                # Moving the module alone leaves devices that export baked into ops (e.g. .to(dtype)) on the CPU.
                from torch.export.passes import move_to_device_pass

                # an index of its own: ops baked with "cuda" beside weights on "cuda:0" fail AOTInductor's checks
                place = torch.device(device)
                if place.type == "cuda" and place.index is None:
                    place = torch.device("cuda", torch.cuda.current_device())
                program = move_to_device_pass(program, place)
            return program.module()
        load = lambda: torch.jit.load(str(self.artifact), map_location=device)  # noqa: E731
        return load_saved(self.artifact, load, self.source).eval()


def read_export(path: Path) -> ExportedModel:
    path = Path(path)
    if not path.is_dir():
        what = "does not exist" if not path.exists() else "is a file, not a folder"
        raise ExportError(f"{path} {what}; pass the output folder of `tritonship export`.")
    for required in (EXPORT_INFO_FILE, SIGNATURE_FILE, GOLDEN_FILE):
        if not (path / required).is_file():
            raise ExportError(f"{path} has no {required}; pass the output folder of `tritonship export`.")
    info = json.loads((path / EXPORT_INFO_FILE).read_text())
    if not (path / info.get("artifact", "")).is_file():
        raise ExportError(f"{path} has no {info.get('artifact')}; re-run `tritonship export`.")
    inputs, outputs = load_golden(path / GOLDEN_FILE)
    checks = load_checks(path / CHECKS_FILE) if (path / CHECKS_FILE).is_file() else {}
    return ExportedModel(path, Signature.load(path / SIGNATURE_FILE), inputs, outputs, info, checks)
