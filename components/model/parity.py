"""Comparing served or compiled outputs with the eager fp32 reference, per output, within tolerances."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# (atol, rtol) per precision: an output passes where |compiled - reference| <= atol + rtol * |reference|.
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {"fp32": (1e-4, 1e-4), "fp16": (2e-2, 2e-2), "bf16": (8e-2, 5e-2)}
# Share of integer output elements that may differ (top-k indices can swap near-ties at low precision).
DEFAULT_INT_MISMATCH: dict[str, float] = {"fp32": 0.0, "fp16": 0.05, "bf16": 0.1}


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float
    int_mismatch: float

    @classmethod
    def for_precision(
        cls, precision: str, atol: float | None = None, rtol: float | None = None, int_mismatch: float | None = None
    ) -> Tolerance:
        default_atol, default_rtol = DEFAULT_TOLERANCES[precision]
        return cls(
            default_atol if atol is None else atol,
            default_rtol if rtol is None else rtol,
            DEFAULT_INT_MISMATCH[precision] if int_mismatch is None else int_mismatch,
        )


@dataclass(frozen=True)
class OutputParity:
    name: str
    passed: bool
    max_abs_err: float
    max_rel_err: float
    mismatch_fraction: float
    check: str  # which inputs: "golden", "batch N" or "batch N, length L (opt)"


def compare(name: str, got: np.ndarray, want: np.ndarray, tol: Tolerance, check: str) -> OutputParity:
    """Compare one output with its reference (numpy.allclose semantics for floats, exact share for ints)."""
    if got.shape != want.shape:
        return OutputParity(name, False, float("inf"), float("inf"), 1.0, f"{check}: shape {got.shape} != {want.shape}")
    if want.dtype.kind in "fc":
        a, b = got.astype(np.float64), want.astype(np.float64)
        err = np.abs(a - b)
        rel = err / np.maximum(np.abs(b), 1e-12)
        bad = ~(err <= tol.atol + tol.rtol * np.abs(b))
        bad |= np.isnan(a) != np.isnan(b)
        fraction = float(bad.mean()) if bad.size else 0.0
        return OutputParity(name, not bad.any(), float(err.max(initial=0)), float(rel.max(initial=0)), fraction, check)
    differs = got != want
    fraction = float(differs.mean()) if differs.size else 0.0
    return OutputParity(name, fraction <= tol.int_mismatch, float(differs.any()), float(differs.any()), fraction, check)


def parity_table(results: list[OutputParity]) -> str:
    lines = [f"{'output':<24} {'check':<10} {'max abs err':>12} {'max rel err':>12} {'mismatch':>9}  result"]
    for r in results:
        lines.append(
            f"{r.name:<24} {r.check:<10} {r.max_abs_err:>12.3g} {r.max_rel_err:>12.3g} "
            f"{r.mismatch_fraction:>8.1%}  {'ok' if r.passed else 'FAIL'}"
        )
    return "\n".join(lines)
