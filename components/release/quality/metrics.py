"""Quality metrics: each row's value from a model's outputs and the labels, and a metric's estimate over a set of
rows for the candidate and the stable version together, with the covariance of the two estimates, so that the
paired difference, the relative change and the candidate's own value each get a standard error.

- Ranking over a top-k output of item ids against one label item: hit_rate, ndcg (one relevant item: 1/log2(rank
  + 1)), mrr (1/rank), each 0 beyond the cut-off k.
- Classification: accuracy (argmax of scores, or a single probability/logit thresholded), log_loss (probabilities,
  or logits with from_logits), auc (binary; DeLong's paired variance, since AUC is not a mean over rows).
- Regression: mae (mean absolute error of each row's elements), rmse (root of the mean squared error; delta
  method).
- A user metric `module:function(outputs, labels) -> one value per row`, averaged like the built-in means.

Rows are paired: the same row is sent to both versions, so the variance of a difference is that of the per-row
differences, far smaller than that of two independent means when the versions mostly agree.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from components.errors import TritonshipError
from components.model.signature import FLOAT_DTYPES, TensorSpec
from components.release.quality.spec import MetricSpec

Arrays = dict[str, np.ndarray]
EPS = 1e-15  # log_loss's probabilities are clipped to [EPS, 1 - EPS]


class QualityError(TritonshipError):
    """The evaluation data or a metric cannot judge the release."""


@dataclass(frozen=True)
class Estimate:
    """A metric over a set of rows: the candidate's value, the stable's (None for a first release), the
    covariance of the two estimates and the degrees of freedom their intervals take."""

    candidate: float
    stable: float | None
    cov: np.ndarray
    rows: int
    dof: int

    def own(self) -> tuple[float, float]:
        """The candidate's value and its standard error."""
        return self.candidate, float(np.sqrt(max(self.cov[0, 0], 0.0)))

    def difference(self) -> tuple[float, float]:
        """candidate - stable and its standard error."""
        assert self.stable is not None
        var = self.cov[0, 0] + self.cov[1, 1] - 2 * self.cov[0, 1]
        return self.candidate - self.stable, float(np.sqrt(max(var, 0.0)))

    def relative(self) -> tuple[float, float]:
        """candidate / stable - 1 and its standard error (delta method)."""
        assert self.stable is not None
        if self.stable == 0:
            return (0.0 if self.candidate == 0 else float("inf")), float("inf")
        gradient = np.array([1 / self.stable, -self.candidate / self.stable**2])
        return self.candidate / self.stable - 1, float(np.sqrt(max(gradient @ self.cov @ gradient, 0.0)))


def _mean_estimate(c: np.ndarray, s: np.ndarray | None) -> Estimate:
    n = c.size
    columns = np.stack([c, s]) if s is not None else c[None, :]
    cov = np.atleast_2d(np.cov(columns)) / n if n > 1 else np.full((columns.shape[0],) * 2, np.inf)
    return Estimate(float(c.mean()), None if s is None else float(s.mean()), cov, n, max(n - 1, 1))


def _rmse_estimate(c: np.ndarray, s: np.ndarray | None) -> Estimate:
    """sqrt of the mean squared error; its covariance by the delta method from the squared errors'."""
    squared = _mean_estimate(c, s)
    means = [squared.candidate] + ([squared.stable] if s is not None else [])
    roots = np.sqrt(np.maximum(means, 0.0))
    jacobian = np.diag([1 / (2 * r) if r > 0 else 0.0 for r in roots])
    cov = jacobian @ squared.cov @ jacobian
    return Estimate(float(roots[0]), None if s is None else float(roots[1]), cov, squared.rows, squared.dof)


def _placements(scores: np.ndarray, positive: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """DeLong's structural components: each positive's share of negatives scored below it (ties half), and each
    negative's share of positives scored above it."""
    pos, neg = np.sort(scores[positive]), np.sort(scores[~positive])
    below = np.searchsorted(neg, scores[positive], "left") + np.searchsorted(neg, scores[positive], "right")
    above = (
        2 * pos.size
        - np.searchsorted(pos, scores[~positive], "left")
        - np.searchsorted(pos, scores[~positive], "right")
    )
    return below / (2 * neg.size), above / (2 * pos.size)


def _auc_estimate(c: np.ndarray, s: np.ndarray | None) -> Estimate:
    """Rows are [score, label]; the AUC of each version and DeLong's covariance of the two AUCs."""
    positive = c[:, 1] > 0.5
    m, n = int(positive.sum()), int((~positive).sum())
    if m < 2 or n < 2:
        raise QualityError(
            f"auc needs at least two rows of each label among the rows it is measured on ({m} positive, {n} "
            "negative); add labelled rows of the missing class."
        )
    sides = [c] if s is None else [c, s]
    v10, v01 = zip(*(_placements(side[:, 0], positive) for side in sides), strict=True)
    cov = np.atleast_2d(np.cov(np.stack(v10))) / m + np.atleast_2d(np.cov(np.stack(v01))) / n
    aucs = [float(v.mean()) for v in v10]
    return Estimate(aucs[0], aucs[1] if s is not None else None, cov, m + n, min(m, n) - 1)


# ----------------------------------------------------------------------------------------- per row
def _ranks(top: np.ndarray, label: np.ndarray) -> np.ndarray:
    """Each row's 0-based rank of its label in the top-k list; the list's width where it is absent."""
    hits = top == label.reshape(-1, 1)
    return np.where(hits.any(axis=1), hits.argmax(axis=1), top.shape[1])


def _ranking(kind: str, k: int) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    def rows(top: np.ndarray, label: np.ndarray) -> np.ndarray:
        rank = _ranks(top.reshape(top.shape[0], -1)[:, :k], label)
        inside = rank < k
        if kind == "hit_rate":
            return inside.astype(np.float64)
        if kind == "mrr":
            return np.where(inside, 1.0 / (rank + 1), 0.0)
        return np.where(inside, 1.0 / np.log2(rank + 2), 0.0)

    return rows


def _scores(output: np.ndarray, from_logits: bool) -> np.ndarray:
    """Rows of class probabilities ([n, C], C >= 2) from probabilities or logits; one column: P(class 1)."""
    values = output.reshape(output.shape[0], -1).astype(np.float64)
    if values.shape[1] == 1:
        p = 1 / (1 + np.exp(-values[:, 0])) if from_logits else values[:, 0]
        return np.stack([1 - p, p], axis=1)
    if from_logits:
        values = np.exp(values - values.max(axis=1, keepdims=True))
        return values / values.sum(axis=1, keepdims=True)
    return values


def _classification(kind: str, from_logits: bool) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    def rows(output: np.ndarray, label: np.ndarray) -> np.ndarray:
        label = label.reshape(-1).astype(np.int64)
        if kind == "accuracy" and output.dtype.kind in "iub":
            return (output.reshape(output.shape[0], -1)[:, 0] == label).astype(np.float64)
        probabilities = _scores(output, from_logits)
        if kind == "accuracy":
            return (probabilities.argmax(axis=1) == label).astype(np.float64)
        if kind == "log_loss":
            chosen = probabilities[np.arange(label.size), label]
            return -np.log(np.clip(chosen, EPS, 1 - EPS))
        # auc: the score of class 1 beside the label (estimated by _auc_estimate over all rows at once)
        raw = output.reshape(output.shape[0], -1).astype(np.float64)
        score = raw[:, 1] - raw[:, 0] if raw.shape[1] == 2 and from_logits else probabilities[:, 1]
        return np.stack([score, label.astype(np.float64)], axis=1)

    return rows


def _regression(kind: str) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    def rows(output: np.ndarray, label: np.ndarray) -> np.ndarray:
        error = output.reshape(output.shape[0], -1).astype(np.float64) - label.reshape(label.shape[0], -1)
        return np.abs(error).mean(axis=1) if kind == "mae" else (error**2).mean(axis=1)

    return rows


@dataclass(frozen=True)
class Metric:
    """A metric ready to run: its spec, how it makes rows and how it estimates over them."""

    spec: MetricSpec
    per_row: Callable[[Arrays, Arrays], np.ndarray]
    estimate: Callable[[np.ndarray, np.ndarray | None], Estimate]

    def rows(self, outputs: Arrays, labels: Arrays) -> np.ndarray:
        """One value (or one [score, label] pair, for auc) per row, checked."""
        count = len(next(iter(outputs.values())))
        try:
            values = np.asarray(self.per_row(outputs, labels), dtype=np.float64)
        except Exception as exc:
            if not self.spec.is_user:
                raise
            raise QualityError(
                f"the user metric {self.spec.metric} raised {type(exc).__name__}: {exc}; fix the function (it gets "
                "dicts of output and label arrays and returns one value per row)."
            ) from None
        if values.shape[0:1] != (count,) or (self.spec.is_user and values.ndim != 1):
            raise QualityError(
                f"the metric {self.spec.label_text} returned shape {list(values.shape)} for {count} rows; it must "
                "return one value per row."
            )
        if not np.isfinite(values).all():
            raise QualityError(
                f"the metric {self.spec.label_text} returned a value that is not finite (NaN or infinite) for "
                f"{int((~np.isfinite(values)).any(axis=tuple(range(1, values.ndim))).sum())} rows; every row needs "
                "a number."
            )
        return values


def build(spec: MetricSpec, outputs: dict[str, TensorSpec]) -> Metric:
    """The metric of a spec whose outputs the model has (QualitySpec.check_against)."""
    if spec.is_user:
        function = _user_function(spec.metric)
        return Metric(spec, function, _mean_estimate)
    output = outputs[spec.output]
    width = int(np.prod([d for d in output.shape[1:] if d > 0])) if len(output.shape) > 1 else 1
    if spec.metric in ("hit_rate", "ndcg", "mrr"):
        if output.dtype in FLOAT_DTYPES or -1 in output.shape[1:]:
            raise QualityError(
                f"the metric {spec.label_text} ranks by the integer ids of a fixed-width top-k output; "
                f"'{spec.output}' is {output.dtype} {list(output.shape)}."
            )
        if spec.k is not None and spec.k > width:
            raise QualityError(f"{spec.label_text}: k {spec.k} is more than the {width} ids '{spec.output}' returns.")
        ranking = _ranking(spec.metric, spec.k or width)
        return Metric(spec, lambda o, lab: ranking(o[spec.output], lab[spec.label]), _mean_estimate)
    if spec.metric in ("accuracy", "log_loss", "auc"):
        classify = _classification(spec.metric, spec.from_logits)
        estimate = _auc_estimate if spec.metric == "auc" else _mean_estimate
        return Metric(spec, lambda o, lab: classify(o[spec.output], lab[spec.label]), estimate)
    regress = _regression(spec.metric)
    estimate = _rmse_estimate if spec.metric == "rmse" else _mean_estimate
    return Metric(spec, lambda o, lab: regress(o[spec.output], lab[spec.label]), estimate)


def _user_function(target: str) -> Callable[[Arrays, Arrays], np.ndarray]:
    module_name, _, attribute = target.rpartition(":")
    try:
        function = getattr(importlib.import_module(module_name), attribute)
    except ImportError as exc:
        raise QualityError(f"the user metric {target} cannot be imported ({exc}); check the module's name.") from None
    except AttributeError:
        raise QualityError(f"the user metric {target}: the module has no '{attribute}'; check its name.") from None
    if not callable(function):
        raise QualityError(f"the user metric {target} is not a function.")
    return function


def check_labels(spec: MetricSpec, output: TensorSpec | None, label: np.ndarray, column: str) -> None:
    """A built-in metric's labels fit its output: ids within the output's declared range, classes below the
    number of scores, binary labels for auc, finite numbers for regression. Raises a QualityError."""
    if spec.is_user or output is None:
        return
    per_row = label.reshape(label.shape[0], -1)
    if spec.metric in ("mae", "rmse"):
        if label.dtype.kind not in "iuf" or not np.isfinite(per_row).all():
            raise QualityError(f"the label column '{column}' must hold finite numbers for {spec.label_text}.")
        width = int(np.prod(output.shape[1:])) if -1 not in output.shape[1:] else per_row.shape[1]
        if per_row.shape[1] != width:
            raise QualityError(
                f"the label column '{column}' has {per_row.shape[1]} value(s) a row; '{output.name}' gives {width}."
            )
        return
    if label.dtype.kind not in "iub" or per_row.shape[1] != 1:
        raise QualityError(
            f"the label column '{column}' must hold one integer a row for {spec.label_text}, not {label.dtype} "
            f"with {per_row.shape[1]} value(s) a row."
        )
    values = per_row[:, 0].astype(np.int64)
    if spec.metric in ("hit_rate", "ndcg", "mrr"):
        if output.value_range is None:
            return
        low, high = output.value_range
        bad = (values < low) | (values >= high) if not isinstance(high, str) else values < low
        bounds = f"[{low}, {high})"
    else:
        width = int(np.prod(output.shape[1:])) if -1 not in output.shape[1:] else 2
        classes = 2 if spec.metric == "auc" or width == 1 else width
        bad = (values < 0) | (values >= classes)
        bounds = f"0 to {classes - 1}"
    if bad.any():
        raise QualityError(
            f"the label column '{column}' has {int(bad.sum())} value(s) outside {bounds}, which '{output.name}' can "
            f"answer (the first: {int(values[bad][0])}); fix the labels or the signature's range."
        )
