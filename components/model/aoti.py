"""The `aoti` compile target: an AOTInductor PT2 package (model.pt2) that Triton's PyTorch backend serves with
`platform: "torch_aoti"` (r26.03 and later; the embedded stack's build of r26.05, docs/design.md section 5).

The exported program is exported once more behind a thin wrapper whose forward takes the signature's inputs as
keyword arguments and returns a dict of its outputs, so that the backend's names for them (KWARGS[ids],
RESULT[scores]) carry the signature's names, which the backend, with scripts/patches/r26.05/, also answers to
bare: a torch_aoti folder has the same tensor names as a TorchScript one. Every dynamic dimension keeps its range.
A PT2 runs only on the torch and the device kind it was compiled for: both go into build.json, and publish
refuses a package whose torch is not the serving image's (components/release/publish.py).
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from components.model import trace_retarget
from components.model.compile_errors import CompileError, root_cause
from components.model.export import ExportedModel, dynamic_shapes
from components.model.model_config import AOTI_PLATFORM, MODEL_FILES
from components.model.signature import Signature

MODEL_FILE = MODEL_FILES[AOTI_PLATFORM]
# What compile needs from the exported model: the aoti target starts from a torch.export program only.
NEEDS_EXPORT = (
    "the aoti target compiles a torch.export program, and this model was exported as TorchScript ({reason}); "
    "fix what stopped torch.export, or use --target torchscript."
)


class ServedAsNamed(nn.Module):
    """The model as the backend calls it: the signature's inputs by keyword, its outputs as a dict by name, in
    `dtype` inside when that is a low precision (the client's dtypes kept outside)."""

    def __init__(self, model: nn.Module, signature: Signature, dtype: torch.dtype | None) -> None:
        super().__init__()
        self.model, self.dtype = model, dtype
        self.inputs = [s.name for s in signature.inputs]
        self.outputs = [(s.name, s.torch_dtype) for s in signature.outputs]

    def forward(self, **tensors: torch.Tensor) -> dict[str, torch.Tensor]:
        args = [tensors[name] for name in self.inputs]
        if self.dtype is not None:
            args = [a.to(self.dtype) if a.is_floating_point() else a for a in args]
        result = self.model(*args)
        outputs = (result,) if isinstance(result, torch.Tensor) else tuple(result)
        return {name: t.to(dtype) for (name, dtype), t in zip(self.outputs, outputs, strict=True)}


def _keyword_only(module: ServedAsNamed) -> ServedAsNamed:
    """torch.export binds example kwargs to forward's parameters by name and cannot take a **kwargs forward with
    dynamic shapes, so this instance's forward declares each input as a keyword-only parameter."""

    def forward(self: ServedAsNamed, **tensors: torch.Tensor) -> dict[str, torch.Tensor]:
        return ServedAsNamed.forward(self, **tensors)

    forward.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        + [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY) for n in module.inputs]
    )
    module.__class__ = type("ServedAsNamed", (ServedAsNamed,), {"forward": forward})
    return module


def compile_aoti(exported: ExportedModel, device: str, precision: str, path: Path) -> None:
    """Compile the exported program with AOTInductor into the package `path`."""
    if exported.info.get("method") != "torch.export":
        raise CompileError(NEEDS_EXPORT.format(reason=exported.info.get("fallback_reason") or "asked for"))
    signature = exported.signature
    low = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)
    module = exported.module(device)
    if low is not None:  # the exported graph keeps fp32 as constants, as a trace does (trace_retarget.py)
        trace_retarget.point_graph_at_dtype(module, torch.float32, low)
        module = module.to(low)
    named = _keyword_only(ServedAsNamed(module, signature, low))
    rows = slice(0, 2) if signature.batch else slice(None)  # torch.export takes a batch of 1 as fixed
    example = {n: torch.from_numpy(a[rows]).to(device) for n, a in exported.golden_inputs.items()}
    shapes = dict(zip(named.inputs, dynamic_shapes(signature), strict=True))
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        try:
            program = torch.export.export(named, (), example, dynamic_shapes=shapes, strict=False)
            torch._inductor.aoti_compile_and_package(program, package_path=str(path))
        except Exception as exc:
            raise CompileError(f"AOTInductor could not compile the model: {root_cause(exc)}.") from None


def load_aoti(path: Path, signature: Signature, device: str) -> Callable[..., Sequence[torch.Tensor]]:
    """The package as a function of the signature's inputs in order, returning its outputs in order."""
    runner: Any = torch._inductor.aoti_load_package(str(path), device_index=_index(device))
    names = [s.name for s in signature.inputs]
    outputs = [s.name for s in signature.outputs]

    def run(*args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        result = runner(**dict(zip(names, args, strict=True)))
        return tuple(result[name] for name in outputs)

    return run


def _index(device: str) -> int:
    parsed = torch.device(device)
    return -1 if parsed.type == "cpu" else parsed.index or 0
