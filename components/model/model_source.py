"""Where the export step gets the user's model: `package.module:factory` (with an optional state_dict
checkpoint, local or s3://), a TorchScript file or a saved ExportedProgram (.pt2). Every failure is one
sentence saying what to fix; a checkpoint is loaded as data only (`weights_only=True`)."""

from __future__ import annotations

import importlib
import logging
import os
import re
import sys
import tempfile
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

from components.errors import TritonshipError
from components.s3 import S3Settings, download_file, split_s3_uri

T = TypeVar("T")
IMAGE_ENV = "TRITONSHIP_IMAGE"  # set by every image the project builds (images/*.Dockerfile) to its own name


class ExportError(TritonshipError):
    """The model could not be loaded, checked or exported."""


def where_this_runs() -> str:
    """The image this task runs in (its TRITONSHIP_IMAGE), else this Python environment: for error messages."""
    image = os.environ.get(IMAGE_ENV)
    return f"the image {image}" if image else f"this Python environment ({sys.prefix})"


def load_model(source: str, checkpoint: str | None = None, s3: S3Settings | None = None) -> nn.Module:
    """The user's model in eval mode on the CPU, from a factory, a TorchScript file or an ExportedProgram."""
    path = Path(source)
    if path.suffix in {".pt2", ".ts", ".pt", ".pth", ".jit"} or path.exists():
        if checkpoint:
            raise ExportError("a checkpoint goes with a `package.module:factory` model, not with a saved model file.")
        return _load_saved_model(path)
    if ":" not in source:
        raise ExportError(
            f"model {source!r} is neither a file nor `package.module:factory`; give a factory that returns an "
            "nn.Module, a TorchScript file or an ExportedProgram (.pt2)."
        )
    model = _call_factory(source)
    if checkpoint:
        _load_checkpoint(model, checkpoint, s3)
    return model.eval()


def _call_factory(source: str) -> nn.Module:
    factory = load_callable(source, "model factory")
    model = factory()
    if not isinstance(model, nn.Module):
        raise ExportError(f"{source} returned {type(model).__name__}, not a torch.nn.Module.")
    return model


def load_callable(source: str, what: str) -> Callable[..., Any]:
    """The callable `package.module:name` names (the model factory, a training pipeline's trainer), imported here;
    one sentence saying how to bring its package where it cannot be imported."""
    module_name, _, attr = source.partition(":")
    if "." not in sys.path and "" not in sys.path:
        sys.path.insert(0, ".")  # a factory in the caller's working tree, as `python -m` would find it
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ExportError(_not_importable(module_name, exc, what)) from None
    found = getattr(module, attr, None)
    if not callable(found):
        hint = "the factory must return an nn.Module" if what == "model factory" else f"name the {what} function"
        raise ExportError(f"{module_name} has no callable {attr!r}; {hint}.")
    return found


def load_saved(path: Path, load: Callable[[], T], source: str | None = None) -> T:
    """`load()` of a saved program or TorchScript file, which needs none of the model's code unless it calls an
    operator the model's package registers. Then the module of the export's `source` factory registers it where
    it can be imported, and otherwise one sentence names the operator. torch's own log of it is kept for the
    sentence, not printed."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("torch.export")
    handlers, propagate = logger.handlers, logger.propagate
    logger.handlers, logger.propagate = [handler], False
    try:
        return load()
    except Exception as exc:  # torch raises many types for an operator or class it cannot find
        said = " ".join([str(exc), *(f"{r.getMessage()} {r.exc_info[1] if r.exc_info else ''}" for r in records)])
        operator = re.search(r"resolve torch\.ops\.(\w+)\.(\w+)|Unknown builtin op: (\w+)::(\w+)", said)
        if operator is None:
            raise ExportError(f"{path} could not be loaded: {first_line(exc)}.") from None
        name = "::".join(g for g in operator.groups() if g)
        if source and ":" in source and _imported(source.partition(":")[0]):
            return load_saved(path, load)
        raise ExportError(
            f"{path} calls the operator {name}, which the model's package registers and {where_this_runs()} does "
            "not have; compile where the package is installed (in a pipeline, compile_image: `tritonship images "
            "build --model-package PATH --on compile` builds one), or export the model without its own operators."
        ) from None
    finally:
        logger.handlers, logger.propagate = handlers, propagate


def _imported(module_name: str) -> bool:
    try:
        importlib.import_module(module_name)
    except ImportError:
        return False
    return True


def _not_importable(module_name: str, exc: ImportError, what: str) -> str:
    """Why the module is not here, and the ways to bring its package: in an image, the pipeline's."""
    ways = (
        "pass an image that has it as model_image (`tritonship images build --model-package PATH` builds one), "
        "name it in model_packages (pip specifiers or wheel URIs, s3:// too), or export in your training image"
        if os.environ.get(IMAGE_ENV)
        else "install its package here or put it on PYTHONPATH (a pipeline run takes model_image or model_packages)"
    )
    return f"cannot import {module_name!r} for the {what} in {where_this_runs()} ({exc}); {ways}."


def _load_saved_model(path: Path) -> nn.Module:
    if not path.is_file():
        raise ExportError(f"the model file {path} does not exist.")
    if path.stat().st_size == 0 or not zipfile.is_zipfile(path):
        raise ExportError(f"{path} is not a TorchScript or ExportedProgram file (empty, truncated or another format).")
    try:
        if path.suffix == ".pt2":
            return torch.export.load(str(path)).module()
        return torch.jit.load(str(path), map_location="cpu").eval()
    except Exception as exc:  # torch raises many types for a bad archive
        raise ExportError(f"{path} could not be loaded as a saved model: {first_line(exc)}.") from None


def _load_checkpoint(model: nn.Module, checkpoint: str, s3: S3Settings | None) -> None:
    with tempfile.TemporaryDirectory(prefix="tritonship-ckpt-") as tmp:
        local = Path(checkpoint)
        if checkpoint.startswith("s3://"):
            bucket, key = split_s3_uri(checkpoint)
            local = Path(tmp) / "checkpoint.pt"
            download_file(s3 or S3Settings.from_env(), bucket, key, local)
        if not local.is_file():
            raise ExportError(f"the checkpoint {checkpoint} does not exist.")
        try:
            # weights_only: a checkpoint is data, never code; a pickle that needs more is refused.
            state = torch.load(local, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise ExportError(_unloadable(checkpoint, local, exc)) from None
    if isinstance(state, Mapping) and isinstance(state.get("state_dict"), Mapping):
        state = state["state_dict"]  # Lightning-style {"state_dict": ...}
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ExportError(
            f"the checkpoint {checkpoint} is not a state_dict (a mapping of names to tensors); "
            "save it with torch.save(model.state_dict(), path)."
        )
    try:
        result = model.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # shape mismatches
        detail = " ".join(str(exc).split("\n")[1:2]).strip()
        raise ExportError(f"the checkpoint {checkpoint} does not fit the model: {detail[:300]}") from None
    if result.missing_keys or result.unexpected_keys:
        raise ExportError(_misfit(checkpoint, model, result.missing_keys, result.unexpected_keys))


def _unloadable(checkpoint: str, local: Path, exc: Exception) -> str:
    """Why torch.load refused a checkpoint, in our words: torch's own text advises loading with
    weights_only=False, which would run whatever code the file holds."""
    save = "save it with torch.save(model.state_dict(), path)."
    with open(local, "rb") as fh:
        head = fh.read(2)
    if not head.startswith((b"PK", b"\x80")):  # neither torch's zip format nor a pickle
        return f"the checkpoint {checkpoint} is not a torch.save file (neither its zip format nor a pickle); {save}"
    found = re.search(r"Unsupported global: GLOBAL (\S+)", str(exc))
    if found or "Weights only load failed" in str(exc):
        what = f" ({found.group(1)})" if found else ""
        return (
            f"the checkpoint {checkpoint} holds Python objects beside tensors{what}, which tritonship never "
            f"loads (a checkpoint is data, not code); {save}"
        )
    reason = first_line(exc).split(". ")[0]  # torch's first sentence; the rest is advice
    return f"the checkpoint {checkpoint} is a damaged torch.save file ({reason}); {save}"


def _misfit(checkpoint: str, model: nn.Module, missing: list[str], unexpected: list[str]) -> str:
    """Counts and a few examples, not every key."""
    wanted = len(model.state_dict())
    examples = lambda keys: ", ".join(repr(k) for k in list(keys)[:3]) + (", …" if len(keys) > 3 else "")  # noqa: E731
    if len(missing) == wanted and unexpected:
        return (
            f"the checkpoint {checkpoint} is a state_dict with none of the model's {wanted} keys (it has "
            f"{len(unexpected)}, e.g. {examples(unexpected)}); it belongs to another model or was saved from a wrapper."
        )
    parts = [f"{len(missing)} of the model's {wanted} keys are missing (e.g. {examples(missing)})"] if missing else []
    if unexpected:
        parts.append(f"{len(unexpected)} keys are not the model's (e.g. {examples(unexpected)})")
    return f"the checkpoint {checkpoint} does not fit the model: {' and '.join(parts)}."


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]
