"""A model's I/O signature: names, dtypes, shapes (-1 = dynamic), batch dimension, id ranges.

Written by the user as YAML or JSON:

    batch: true            # dimension 0 of every input and output is the batch
    max_batch_size: 64
    inputs:
      - {name: item_ids, dtype: int64, shape: [-1, 40], range: [1, 5000]}
      - {name: mask_pos, dtype: int64, shape: [-1, 1], range: [0, 40]}
    outputs:
      - {name: topk_indices, dtype: int64, shape: [-1, 10]}
      - {name: topk_scores, dtype: fp32, shape: [-1, 10]}
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from components.errors import TritonshipError

# name -> (torch dtype name, numpy dtype or None where numpy has none, Triton config type, Triton wire type).
# torch is named, not imported: the gate and tools steps read signatures without torch installed.
DTYPES: dict[str, tuple[str, Any, str, str]] = {
    "fp32": ("float32", np.float32, "TYPE_FP32", "FP32"),
    "fp16": ("float16", np.float16, "TYPE_FP16", "FP16"),
    "bf16": ("bfloat16", None, "TYPE_BF16", "BF16"),
    "int32": ("int32", np.int32, "TYPE_INT32", "INT32"),
    "int64": ("int64", np.int64, "TYPE_INT64", "INT64"),
    "bool": ("bool", np.bool_, "TYPE_BOOL", "BOOL"),
}
FLOAT_DTYPES = {"fp32", "fp16", "bf16"}
# Triton model and tensor names: printable, no path separators, no leading dot (also safe as S3 keys).
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$")


class SignatureError(TritonshipError):
    """The signature file, or the model checked against it, is wrong."""


def dtype_name(dtype: Any) -> str:
    """The signature's name for a torch dtype (torch.float32 -> 'fp32')."""
    torch_name = str(dtype).removeprefix("torch.")
    for name, (candidate, *_rest) in DTYPES.items():
        if candidate == torch_name:
            return name
    return torch_name


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    shape: tuple[int, ...]
    value_range: tuple[float, float] | None = None  # [low, high) for generated golden inputs

    @property
    def torch_dtype(self) -> Any:
        import torch

        return getattr(torch, DTYPES[self.dtype][0])

    @property
    def numpy_dtype(self) -> Any:
        return DTYPES[self.dtype][1]

    @property
    def triton_type(self) -> str:
        return DTYPES[self.dtype][2]

    @property
    def wire_type(self) -> str:
        return DTYPES[self.dtype][3]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}
        if self.value_range is not None:
            out["range"] = list(self.value_range)
        return out


@dataclass(frozen=True)
class Signature:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    batch: bool = True
    max_batch_size: int = 64

    # -------------------------------------------------------------------------------- loading
    @classmethod
    def load(cls, path: str | Path) -> Signature:
        path = Path(path)
        try:
            text = path.read_text()
        except OSError as exc:
            raise SignatureError(f"cannot read the signature file {path}: {exc.strerror}.") from None
        try:
            data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        except (json.JSONDecodeError, yaml.YAMLError) as exc:
            first = str(exc).splitlines()[0]
            raise SignatureError(f"the signature file {path} is not valid YAML/JSON: {first}.") from None
        return cls.from_dict(data, source=str(path))

    @classmethod
    def from_dict(cls, data: Any, source: str = "signature") -> Signature:
        if not isinstance(data, dict):
            raise SignatureError(f"{source}: expected a mapping with 'inputs' and 'outputs'.")
        unknown = set(data) - {"batch", "max_batch_size", "inputs", "outputs"}
        if unknown:
            raise SignatureError(
                f"{source}: unknown key(s) {sorted(unknown)}; allowed: batch, max_batch_size, inputs, outputs."
            )
        batch = data.get("batch", True)
        if not isinstance(batch, bool):
            raise SignatureError(f"{source}: 'batch' must be true or false.")
        max_batch = data.get("max_batch_size", 64 if batch else 0)
        if not isinstance(max_batch, int) or isinstance(max_batch, bool) or not (0 <= max_batch <= 1 << 20):
            raise SignatureError(f"{source}: 'max_batch_size' must be an integer from 0 to 1048576.")
        if batch and max_batch < 1:
            raise SignatureError(f"{source}: a batched signature needs max_batch_size >= 1.")
        inputs = tuple(_tensor(t, source, "input", batch) for t in _list(data, "inputs", source))
        outputs = tuple(_tensor(t, source, "output", batch) for t in _list(data, "outputs", source))
        names = [t.name for t in inputs + outputs]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise SignatureError(f"{source}: tensor names must be unique; repeated: {', '.join(dupes)}.")
        return cls(inputs, outputs, batch, max_batch if batch else 0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch": self.batch,
            "max_batch_size": self.max_batch_size,
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
        }

    def save(self, path: str | Path) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))

    # ---------------------------------------------------------------------------- helpers
    def example_inputs(self, batch_size: int, seed: int = 0, dynamic_size: int = 1) -> dict[str, np.ndarray]:
        """Valid random inputs: ids within their range, floats in [-1, 1) unless a range is given; dynamic
        dimensions other than the batch take `dynamic_size`."""
        rng = np.random.default_rng(seed)
        out: dict[str, np.ndarray] = {}
        for spec in self.inputs:
            shape = concrete_shape(spec.shape, batch_size, self.batch, dynamic_size)
            if spec.dtype == "bool":
                out[spec.name] = rng.integers(0, 2, size=shape).astype(np.bool_)
            elif spec.dtype in FLOAT_DTYPES:
                low, high = spec.value_range or (-1.0, 1.0)
                values = rng.uniform(low, high, size=shape).astype(np.float32)
                out[spec.name] = values if spec.numpy_dtype is None else values.astype(spec.numpy_dtype)
            else:
                low, high = spec.value_range or (0, 100)
                out[spec.name] = rng.integers(int(low), int(high), size=shape).astype(spec.numpy_dtype)
        return out

    def check_arrays(self, arrays: dict[str, np.ndarray], specs: tuple[TensorSpec, ...], what: str) -> None:
        """Raise naming the first tensor whose presence, rank, shape or dtype disagrees with `specs`."""
        expected = {s.name for s in specs}
        missing = [s.name for s in specs if s.name not in arrays]
        if missing:
            raise SignatureError(f"{what}: missing {', '.join(missing)} (expected {sorted(expected)}).")
        extra = sorted(set(arrays) - expected)
        if extra:
            raise SignatureError(f"{what}: unexpected tensor(s) {', '.join(extra)} (expected {sorted(expected)}).")
        for spec in specs:
            check_tensor(spec, tuple(arrays[spec.name].shape), _np_dtype_name(arrays[spec.name].dtype), what)

    @property
    def has_dynamic_dims(self) -> bool:
        """A dynamic dimension besides the batch, on any input."""
        return any(d == -1 for s in self.inputs for d in (s.shape[1:] if self.batch else s.shape))


def check_tensor(spec: TensorSpec, shape: tuple[int, ...], dtype: str, what: str) -> None:
    if dtype != spec.dtype:
        raise SignatureError(f"{what} '{spec.name}': dtype is {dtype}, the signature says {spec.dtype}.")
    if len(shape) != len(spec.shape):
        raise SignatureError(
            f"{what} '{spec.name}': rank is {len(shape)} (shape {list(shape)}), the signature says "
            f"{len(spec.shape)} (shape {list(spec.shape)})."
        )
    for got, want in zip(shape, spec.shape, strict=True):
        if want != -1 and got != want:
            raise SignatureError(
                f"{what} '{spec.name}': shape is {list(shape)}, the signature says {list(spec.shape)}."
            )


def concrete_shape(shape: tuple[int, ...], batch_size: int, batch: bool, dynamic_size: int = 1) -> tuple[int, ...]:
    """Replace -1: the batch dimension by batch_size, other dynamic dimensions by dynamic_size."""
    return tuple(batch_size if (batch and i == 0) else (dynamic_size if d == -1 else d) for i, d in enumerate(shape))


def _np_dtype_name(dtype: np.dtype) -> str:
    for name, (_t, np_dtype, *_rest) in DTYPES.items():
        if np_dtype is not None and np.dtype(np_dtype) == dtype:
            return name
    return str(dtype)


def _list(data: dict[str, Any], key: str, source: str) -> list[Any]:
    value = data.get(key)
    if not isinstance(value, list) or not value:
        raise SignatureError(f"{source}: '{key}' must be a non-empty list of tensors.")
    return value


def _tensor(data: Any, source: str, kind: str, batch: bool) -> TensorSpec:
    if not isinstance(data, dict):
        raise SignatureError(f"{source}: each {kind} must be a mapping with name, dtype and shape.")
    name = data.get("name")
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise SignatureError(
            f"{source}: {kind} name {name!r} is not valid; use letters, digits, '_', '.', '-' "
            "(at most 128, not starting with '.' or '-')."
        )
    unknown = set(data) - {"name", "dtype", "shape", "range"}
    if unknown:
        raise SignatureError(f"{source}: {kind} '{name}' has unknown key(s) {sorted(unknown)}.")
    dtype = data.get("dtype")
    if dtype not in DTYPES:
        raise SignatureError(f"{source}: {kind} '{name}' has dtype {dtype!r}; use one of {', '.join(DTYPES)}.")
    shape = data.get("shape")
    if (
        not isinstance(shape, list)
        or not shape
        or len(shape) > 8
        or not all(isinstance(d, int) and not isinstance(d, bool) and (d == -1 or 1 <= d <= 1 << 24) for d in shape)
    ):
        raise SignatureError(
            f"{source}: {kind} '{name}' shape must be a list of 1 to 8 dimensions, each -1 or a positive integer."
        )
    if batch and shape[0] != -1:
        raise SignatureError(f"{source}: {kind} '{name}': with batch: true, dimension 0 must be -1 (the batch).")
    if batch and len(shape) < 2:
        raise SignatureError(
            f"{source}: {kind} '{name}': with batch: true, give at least one dimension after the batch."
        )
    value_range = data.get("range")
    if value_range is not None:
        if (
            not isinstance(value_range, list)
            or len(value_range) != 2
            or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in value_range)
            or not value_range[0] < value_range[1]
        ):
            raise SignatureError(f"{source}: {kind} '{name}' range must be [low, high] with low < high.")
        value_range = (value_range[0], value_range[1])
    return TensorSpec(name, dtype, tuple(shape), value_range)
