"""A model's I/O signature: names, dtypes, shapes, batch dimension, dynamic dimensions' ranges, id ranges.

Written by the user as YAML or JSON:

    batch: true            # dimension 0 of every input and output is the batch
    max_batch_size: 64
    dims:                  # dynamic dimensions besides the batch: the lengths served, and the one to tune for
      length: {min: 8, opt: 50, max: 200}
    inputs:
      - {name: item_ids, dtype: int64, shape: [-1, length], range: [1, 5000]}
      - {name: mask_pos, dtype: int64, shape: [-1, 1], range: [0, length]}   # ids below the length
    outputs:
      - {name: topk_indices, dtype: int64, shape: [-1, 10]}
      - {name: topk_scores, dtype: fp32, shape: [-1, 10]}

A dimension named in `dims` is dynamic (-1 in Triton's config); every tensor that names it has the same
length in one request. A bare -1 besides the batch is a dynamic dimension of its own with the default range
DEFAULT_DIM_RANGE (min 3, opt 8, max 13). Export and compile check the model at each range's min, opt and
max; TensorRT builds its optimisation profile from them; the gate and tune measure at the opt.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from components.errors import TritonshipError

# name -> (torch dtype name, numpy dtype or None where numpy has none, Triton config type).
# torch is named, not imported: the gate and tools steps read signatures without torch installed.
DTYPES: dict[str, tuple[str, Any, str]] = {
    "fp32": ("float32", np.float32, "TYPE_FP32"),
    "fp16": ("float16", np.float16, "TYPE_FP16"),
    "bf16": ("bfloat16", None, "TYPE_BF16"),
    "int32": ("int32", np.int32, "TYPE_INT32"),
    "int64": ("int64", np.int64, "TYPE_INT64"),
    "bool": ("bool", np.bool_, "TYPE_BOOL"),
}
FLOAT_DTYPES = {"fp32", "fp16", "bf16"}
# Triton model and tensor names: printable, no path separators, no leading dot (also safe as S3 keys).
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$")
DIM_NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
POINTS = ("min", "opt", "max")


@dataclass(frozen=True)
class DimRange:
    """A dynamic dimension's lengths: the smallest and largest served, and the one to optimise and measure at."""

    min: int
    opt: int
    max: int

    def at(self, point: str | int) -> int:
        return point if isinstance(point, int) else getattr(self, point)


DEFAULT_DIM_RANGE = DimRange(3, 8, 13)  # a bare -1 besides the batch


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
    value_range: tuple[float, float | str] | None = None  # [low, high) for generated inputs; high may name a dim
    dim_names: tuple[str | None, ...] = ()  # per dimension: the `dims` name of a named dynamic one, else None

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

    def to_dict(self) -> dict[str, Any]:
        names = self.dim_names or (None,) * len(self.shape)
        shape = [name or d for d, name in zip(self.shape, names, strict=True)]
        out: dict[str, Any] = {"name": self.name, "dtype": self.dtype, "shape": shape}
        if self.value_range is not None:
            out["range"] = list(self.value_range)
        return out


@dataclass(frozen=True)
class Signature:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    batch: bool = True
    max_batch_size: int = 64
    dims: dict[str, DimRange] = field(default_factory=dict)

    # -------------------------------------------------------------------------------- loading
    @classmethod
    def load(cls, path: str | Path) -> Signature:
        path = Path(path)
        try:
            text = path.read_text()
        except FileNotFoundError:
            raise SignatureError(f"the signature file {path} does not exist; check the path.") from None
        except IsADirectoryError:
            raise SignatureError(
                f"the signature file {path} is a folder; give the YAML or JSON file inside it."
            ) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise SignatureError(
                f"the signature file {path} cannot be read ({getattr(exc, 'strerror', None) or 'not text'}); "
                "give a YAML or JSON file."
            ) from None
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
        unknown = set(data) - {"batch", "max_batch_size", "dims", "inputs", "outputs"}
        if unknown:
            raise SignatureError(
                f"{source}: unknown key(s) {sorted(unknown)}; allowed: batch, max_batch_size, dims, inputs, outputs."
            )
        batch = data.get("batch", True)
        if not isinstance(batch, bool):
            raise SignatureError(f"{source}: 'batch' must be true or false.")
        max_batch = data.get("max_batch_size", 64 if batch else 0)
        if not isinstance(max_batch, int) or isinstance(max_batch, bool) or not (0 <= max_batch <= 1 << 20):
            raise SignatureError(f"{source}: 'max_batch_size' must be an integer from 0 to 1048576.")
        if batch and max_batch < 1:
            raise SignatureError(f"{source}: a batched signature needs max_batch_size >= 1.")
        dims = _dims(data.get("dims", {}), source)
        inputs = tuple(_tensor(t, source, "input", batch, dims) for t in _list(data, "inputs", source))
        outputs = tuple(_tensor(t, source, "output", batch, dims) for t in _list(data, "outputs", source))
        names = [t.name for t in inputs + outputs]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise SignatureError(f"{source}: tensor names must be unique; repeated: {', '.join(dupes)}.")
        unused = sorted(set(dims) - {n for t in inputs for n in t.dim_names if n})
        if unused:
            raise SignatureError(
                f"{source}: dims declares {', '.join(unused)} but no input's shape names it; name it in a shape or "
                "remove it."
            )
        return cls(inputs, outputs, batch, max_batch if batch else 0, dims)

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch": self.batch,
            "max_batch_size": self.max_batch_size,
            **({"dims": {n: asdict(r) for n, r in self.dims.items()}} if self.dims else {}),
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
        }

    def save(self, path: str | Path) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))

    # ---------------------------------------------------------------------------- helpers
    def dim_range(self, spec: TensorSpec, index: int) -> DimRange:
        """The range of a dynamic dimension besides the batch: its declared one, or the default for a bare -1."""
        name = spec.dim_names[index] if spec.dim_names else None
        return self.dims[name] if name else DEFAULT_DIM_RANGE

    def shape_at(self, spec: TensorSpec, batch_size: int, point: str | int = "opt") -> tuple[int, ...]:
        """A tensor's shape with the batch at `batch_size` and every dynamic dimension at `point` of its
        range ("min", "opt", "max"), or at that length."""
        return tuple(
            batch_size if self.batch and i == 0 else (self.dim_range(spec, i).at(point) if d == -1 else d)
            for i, d in enumerate(spec.shape)
        )

    def example_inputs(self, batch_size: int, seed: int = 0, dynamic_size: str | int = "opt") -> dict[str, np.ndarray]:
        """Valid random inputs: ids within their range (below a named dimension's length where the range says
        so), floats in [-1, 1) unless a range is given; dynamic dimensions besides the batch at `dynamic_size`:
        a point of their range ("min", "opt", "max") or a length."""
        rng = np.random.default_rng(seed)
        out: dict[str, np.ndarray] = {}
        for spec in self.inputs:
            shape = self.shape_at(spec, batch_size, dynamic_size)
            if spec.dtype == "bool":
                out[spec.name] = rng.integers(0, 2, size=shape).astype(np.bool_)
            elif spec.dtype in FLOAT_DTYPES:
                low, high = spec.value_range or (-1.0, 1.0)
                values = rng.uniform(low, high, size=shape).astype(np.float32)
                out[spec.name] = values if spec.numpy_dtype is None else values.astype(spec.numpy_dtype)
            else:
                low, high = spec.value_range or (0, 100)
                if isinstance(high, str):
                    high = self.dims[high].at(dynamic_size)
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
            check_tensor(spec, tuple(arrays[spec.name].shape), numpy_dtype_name(arrays[spec.name].dtype), what)

    @property
    def has_dynamic_dims(self) -> bool:
        """A dynamic dimension besides the batch, on any input."""
        return any(d == -1 for s in self.inputs for d in (s.shape[1:] if self.batch else s.shape))

    def dynamic_lengths(self, point: str) -> str:
        """The lengths of the dynamic dimensions at a point of their ranges, for a report ("length 50")."""
        named = {n: r.at(point) for n, r in self.dims.items()}
        bare = any(
            d == -1 and not (s.dim_names and s.dim_names[i])
            for s in self.inputs
            for i, d in enumerate(s.shape)
            if not (self.batch and i == 0)
        )
        parts = [f"{n} {v}" for n, v in named.items()] + ([f"-1 {DEFAULT_DIM_RANGE.at(point)}"] if bare else [])
        return ", ".join(parts)


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


def numpy_dtype_name(dtype: np.dtype) -> str:
    for name, (_t, np_dtype, *_rest) in DTYPES.items():
        if np_dtype is not None and np.dtype(np_dtype) == dtype:
            return name
    return str(dtype)


def _list(data: dict[str, Any], key: str, source: str) -> list[Any]:
    value = data.get(key)
    if not isinstance(value, list) or not value:
        raise SignatureError(f"{source}: '{key}' must be a non-empty list of tensors.")
    return value


def _dims(data: Any, source: str) -> dict[str, DimRange]:
    if not isinstance(data, dict):
        raise SignatureError(f"{source}: 'dims' must map each dimension's name to {{min: .., opt: .., max: ..}}.")
    dims = {}
    for name, spec in data.items():
        if not isinstance(name, str) or not DIM_NAME_PATTERN.fullmatch(name):
            raise SignatureError(f"{source}: dimension name {name!r} is not valid; use letters, digits and '_'.")
        if (
            not isinstance(spec, dict)
            or set(spec) != set(POINTS)
            or not all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 1 << 24 for v in spec.values())
        ):
            raise SignatureError(
                f"{source}: dimension '{name}' must be {{min: .., opt: .., max: ..}}, each a positive integer "
                f"(like {{min: 8, opt: 50, max: 200}}), not {spec!r}."
            )
        low, opt, high = (spec[p] for p in POINTS)
        if low > high:
            raise SignatureError(f"{source}: dimension '{name}' has min {low} above max {high}; swap them.")
        if low == high:
            raise SignatureError(
                f"{source}: dimension '{name}' has min = max = {low}, so it is fixed; write {low} in the shapes "
                "instead of its name."
            )
        if not low <= opt <= high:
            raise SignatureError(
                f"{source}: dimension '{name}' has opt {opt} outside its range {low} to {high}; choose the length "
                "served most often, within the range."
            )
        dims[name] = DimRange(low, opt, high)
    return dims


def _tensor(data: Any, source: str, kind: str, batch: bool, dims: dict[str, DimRange]) -> TensorSpec:
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
        or not all(
            isinstance(d, str) or (isinstance(d, int) and not isinstance(d, bool) and (d == -1 or 1 <= d <= 1 << 24))
            for d in shape
        )
    ):
        raise SignatureError(
            f"{source}: {kind} '{name}' shape must be a list of 1 to 8 dimensions, each -1, a positive integer or "
            "the name of a dimension in dims."
        )
    for d in shape:
        if isinstance(d, str) and d not in dims:
            raise SignatureError(
                f"{source}: {kind} '{name}' shape names the dimension '{d}', which dims does not declare; add "
                f"dims: {{{d}: {{min: .., opt: .., max: ..}}}}."
            )
    if batch and isinstance(shape[0], str):
        raise SignatureError(
            f"{source}: {kind} '{name}': dimension 0 is the batch (-1, ranged by max_batch_size), not '{shape[0]}'."
        )
    dim_names = tuple(d if isinstance(d, str) else None for d in shape)
    shape = [-1 if isinstance(d, str) else d for d in shape]
    if batch and shape[0] != -1:
        raise SignatureError(f"{source}: {kind} '{name}': with batch: true, dimension 0 must be -1 (the batch).")
    if batch and len(shape) < 2:
        raise SignatureError(
            f"{source}: {kind} '{name}': with batch: true, give at least one dimension after the batch."
        )
    value_range = data.get("range")
    if value_range is not None:
        high_dim = isinstance(value_range, list) and len(value_range) == 2 and isinstance(value_range[1], str)
        if high_dim and value_range[1] not in dims:
            raise SignatureError(
                f"{source}: {kind} '{name}' range ends at '{value_range[1]}', which dims does not declare."
            )
        bound = dims[value_range[1]].min if high_dim else None
        if (
            not isinstance(value_range, list)
            or len(value_range) != 2
            or not all(
                isinstance(v, int | float) and not isinstance(v, bool) for v in value_range[: 1 if high_dim else 2]
            )
            or not value_range[0] < (bound if high_dim else value_range[1])
        ):
            raise SignatureError(
                f"{source}: {kind} '{name}' range must be [low, high] with low < high (high may name a dimension, "
                "its length then bounds the ids)."
            )
        value_range = (value_range[0], value_range[1])
    return TensorSpec(name, dtype, tuple(shape), value_range, dim_names if any(dim_names) else ())
