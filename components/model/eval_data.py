"""A labelled evaluation set, read in chunks and checked against a model's signature.

Its columns are the signature's input names, the label columns and, optionally, a slice column (a user
segment): nothing missing, nothing else. Parquet (pyarrow; streamed by record batches, so a million rows fit in
a pod's memory) or .npz (numpy; one array per column, read whole). A tensor input is a list column in Parquet
(`list<int64>`, or fixed-size; nested lists for more dimensions): rows may differ in a dynamic dimension's
length, and rows of one length are sent together. An input whose shape per row is [1] may be a plain column.

Checked before anything is measured (`EvalData.check`, a pass over every chunk): names, dtypes (exactly the
signature's: an int32 column for an int64 input is refused, not cast), shapes per row (fixed dimensions equal,
dynamic ones within their declared range), ids within each input's `range`, no nulls, and at least one row.
"""

from __future__ import annotations

import contextlib
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from components.errors import TritonshipError
from components.model.signature import Signature, TensorSpec, numpy_dtype_name
from components.s3 import S3Settings, download_file, split_s3_uri

FORMATS = {".parquet": "parquet", ".pq": "parquet", ".npz": "npz"}
Column = np.ndarray | list[np.ndarray]  # a regular array [rows, ...], or one array per row (ragged lengths)


class EvalDataError(TritonshipError):
    """The evaluation set cannot be read, or does not fit the model."""


@dataclass
class Chunk:
    """Consecutive rows of the set: `start` is the first one's index in the whole set."""

    start: int
    rows: int
    columns: dict[str, Column]


@dataclass
class Batch:
    """Rows of one chunk that share every input's shape, as one request's inputs."""

    rows: np.ndarray  # the rows' indices in the whole set
    inputs: dict[str, np.ndarray]


@contextlib.contextmanager
def open_eval_data(source: str, s3: S3Settings | None = None) -> Iterator[EvalData]:
    """The set at a local path or an s3:// URI (downloaded to a temporary file first)."""
    suffix = Path(source.split("?")[0]).suffix.lower()
    if suffix not in FORMATS:
        raise EvalDataError(f"the evaluation data {source} is neither .parquet nor .npz; give one of those.")
    if not source.startswith("s3://"):
        if not Path(source).is_file():
            raise EvalDataError(f"the evaluation data {source} does not exist; check the path.")
        yield EvalData(Path(source), source)
        return
    bucket, key = split_s3_uri(source)
    with tempfile.TemporaryDirectory(prefix="tritonship-eval-") as tmp:
        local = Path(tmp) / f"data{suffix}"
        download_file(s3 or S3Settings.from_env(), bucket, key, local)
        yield EvalData(local, source)


class EvalData:
    """An opened evaluation set: its columns, its rows and its chunks."""

    def __init__(self, path: Path, source: str) -> None:
        self.path, self.source, self.format = path, source, FORMATS[path.suffix.lower()]
        self._arrays: dict[str, np.ndarray] | None = None
        try:
            if self.format == "parquet":
                import pyarrow.parquet as pq

                self._parquet = pq.ParquetFile(path)
                schema = self._parquet.schema_arrow
                self.columns = list(schema.names)
                self.rows = self._parquet.metadata.num_rows
                self._dtypes = {f.name: _arrow_dtype(f.type) for f in schema}
            else:
                with np.load(path, allow_pickle=False) as data:
                    self._arrays = {k: data[k] for k in data.files}
                self.columns = list(self._arrays)
                lengths = {len(a) if a.ndim else 0 for a in self._arrays.values()}
                if len(lengths) > 1:
                    raise EvalDataError(
                        f"the evaluation data {source} has arrays of different lengths ({sorted(lengths)}); every "
                        "column needs one entry per row."
                    )
                self.rows = lengths.pop() if lengths else 0
                self._dtypes = {k: numpy_dtype_name(a.dtype) for k, a in self._arrays.items()}
        except EvalDataError:
            raise
        except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:  # pyarrow's errors are ValueErrors
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise EvalDataError(
                f"the evaluation data {source} cannot be read as {self.format} ({first}); check that the file is whole."
            ) from None

    def check_columns(self, signature: Signature, labels: list[str], slice_column: str) -> None:
        """Exactly the inputs, the labels and the slice column; each input of the signature's dtype; some rows."""
        if self.rows == 0:
            raise EvalDataError(f"the evaluation data {self.source} has no rows; give it labelled rows.")
        inputs = [s.name for s in signature.inputs]
        wanted = inputs + labels + ([slice_column] if slice_column else [])
        missing = [c for c in wanted if c not in self.columns]
        if missing:
            raise EvalDataError(
                f"the evaluation data {self.source} has no column {', '.join(missing)}; it needs the model's inputs "
                f"({', '.join(inputs)}), the labels the quality spec reads ({', '.join(labels) or 'none'})"
                + (f" and the slice column {slice_column}" if slice_column else "")
                + "."
            )
        extra = [c for c in self.columns if c not in wanted]
        if extra:
            raise EvalDataError(
                f"the evaluation data {self.source} has column(s) {', '.join(extra)} that are neither inputs, labels "
                "nor the slice column; remove them or name them in the quality spec."
            )
        for spec in signature.inputs:
            if self._dtypes[spec.name] != spec.dtype:
                raise EvalDataError(
                    f"the evaluation data's column '{spec.name}' holds {self._dtypes[spec.name]}, the signature says "
                    f"{spec.dtype}; write the column as {spec.dtype}."
                )

    def chunks(self, rows: int, columns: list[str]) -> Iterator[Chunk]:
        """The named columns, `rows` rows at a time."""
        start = 0
        if self._arrays is not None:
            for start in range(0, self.rows, rows):
                yield Chunk(
                    start, min(rows, self.rows - start), {c: self._arrays[c][start : start + rows] for c in columns}
                )
            return
        for record in self._parquet.iter_batches(batch_size=rows, columns=columns):
            yield Chunk(start, record.num_rows, {c: _column(record.column(c), c) for c in columns})
            start += record.num_rows


def _arrow_dtype(kind) -> str:
    import pyarrow as pa

    while pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        kind = kind.value_type
    names = {pa.int64(): "int64", pa.int32(): "int32", pa.float32(): "fp32", pa.float16(): "fp16", pa.bool_(): "bool"}
    return names.get(kind, str(kind))


def _column(array, name: str) -> Column:
    """An Arrow column as numpy: a regular array where every row has one shape, else one array per row."""
    import pyarrow as pa

    if array.null_count:
        raise EvalDataError(f"the evaluation data's column '{name}' has {array.null_count} empty (null) value(s).")
    kind = array.type
    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)):
        return array.to_numpy(zero_copy_only=False)
    inner = _column(array.flatten(), name)
    if pa.types.is_fixed_size_list(kind):
        lengths = np.full(len(array), kind.list_size)
    else:
        offsets = np.asarray(array.offsets)
        lengths = np.diff(offsets)
    if isinstance(inner, list):
        raise EvalDataError(
            f"the evaluation data's column '{name}' is ragged below its first level; only the outer list may vary."
        )
    if len(array) and (lengths == lengths[0]).all():
        return inner.reshape(len(array), int(lengths[0]), *inner.shape[1:])
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    return [inner[s : s + n] for s, n in zip(starts, lengths, strict=True)]


def batches(chunk: Chunk, signature: Signature, max_batch_size: int) -> Iterator[Batch]:
    """The chunk's rows as requests: rows whose inputs share every shape together, at most `max_batch_size` a
    request (one row a request for a model without batching). Raises an EvalDataError for a row whose shape or
    ids do not fit the signature."""
    specs = signature.inputs
    columns = {s.name: chunk.columns[s.name] for s in specs}
    ragged = [n for n, c in columns.items() if isinstance(c, list)]
    if ragged:
        keys = [tuple(columns[n][i].shape for n in ragged) for i in range(chunk.rows)]
        groups: dict[tuple, list[int]] = {}
        for i, key in enumerate(keys):
            groups.setdefault(key, []).append(i)
        index_groups = [np.asarray(g) for g in groups.values()]
    else:
        index_groups = [np.arange(chunk.rows)]
    step = max(max_batch_size, 1) if signature.batch else 1
    for rows in index_groups:
        group = {s.name: _stack(columns[s.name], rows, s, signature) for s in specs}
        for s in specs:
            _check_rows(s, group, signature, chunk.start + rows)
        for begin in range(0, rows.size, step):
            part = slice(begin, begin + step)
            inputs = {n: a[part] if signature.batch else a[begin] for n, a in group.items()}
            yield Batch(chunk.start + rows[part], inputs)


def _stack(column: Column, rows: np.ndarray, spec: TensorSpec, signature: Signature) -> np.ndarray:
    array = np.stack([column[i] for i in rows]) if isinstance(column, list) else column[rows]
    per_row = spec.shape[1:] if signature.batch else spec.shape
    if array.ndim == 1 and list(per_row) == [1]:
        array = array.reshape(-1, 1)  # a plain column for an input of one value a row
    dtype = spec.numpy_dtype
    return array if dtype is None or array.dtype == dtype else array.astype(dtype)


def _check_rows(spec: TensorSpec, group: dict[str, np.ndarray], signature: Signature, rows: np.ndarray) -> None:
    array = group[spec.name]
    first = int(rows[0])
    expected = spec.shape[1:] if signature.batch else spec.shape
    got = array.shape[1:]
    if len(got) != len(expected):
        raise EvalDataError(
            f"row {first} of the evaluation data: '{spec.name}' has shape {list(got)} a row, the signature says "
            f"{spec.to_dict()['shape'][1:]} (rank {len(expected)})."
        )
    offset = 1 if signature.batch else 0
    for i, (have, want) in enumerate(zip(got, expected, strict=True)):
        if want != -1 and have != want:
            raise EvalDataError(
                f"row {first} of the evaluation data: '{spec.name}' has shape {list(got)} a row, the signature "
                f"says {list(expected)}."
            )
        if want == -1:
            span = signature.dim_range(spec, i + offset)
            if not span.min <= have <= span.max:
                raise EvalDataError(
                    f"row {first} of the evaluation data: '{spec.name}' is {have} long, outside the served range "
                    f"{span.min} to {span.max}."
                )
    if spec.value_range is None or array.size == 0:
        return
    low, high = spec.value_range
    if isinstance(high, str):  # ids below a named dimension's length, as this group has it
        holder = next(s for s in signature.inputs if high in s.dim_names)
        high = group[holder.name].shape[holder.dim_names.index(high)]
    bad = (array < low) | (array >= high)
    if bad.any():
        where = int(rows[np.argwhere(bad.reshape(len(array), -1).any(axis=1))[0, 0]])
        raise EvalDataError(
            f"row {where} of the evaluation data: '{spec.name}' holds {array[bad].flat[0]}, outside its range "
            f"[{low}, {high}); fix the data or the signature's range."
        )
