"""Quality step: does the candidate recommend (classify, predict) at least as well as the stable version, on labelled
data, as Triton serves both? (docs/design.md section 4, quality.)

How it measures
    The evaluation set (components/model/eval_data.py) is first checked whole against the candidate's signature and
    the spec's labels, before anything is loaded. Then the stable version is loaded on the gate beside the dark
    candidate (as the gate step does), and every row is sent to both, in requests of the smaller of the two
    versions' max_batch_size, a few in flight per model; each metric's value per row is kept for both (a float a
    row per metric and version: a million rows fit), and the stable version is unloaded again.

How it decides
    Per metric: the paired difference candidate - stable (and relative to stable) with its interval at the
    gate's confidence, from the per-row differences (components/release/quality/metrics.py); the candidate's
    own value with its interval against a floor (or a ceiling). Each limit is an Effect (release/effects.py): `beyond`
    fails, all `within` passes, otherwise inconclusive, and the effect says about how many more rows would
    decide at the same estimate and spread. Slices are reported; a metric with `per_slice` is judged on each.

Bad input raises a QualityError (or the spec's, or the data's) naming what is wrong, before the stable version is
touched: nothing is recorded as a verdict, and the pipeline's run fails.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from scipy import stats

from components import log
from components.model.eval_data import EvalData, batches, open_eval_data
from components.release.effects import Effect, judge
from components.release.gate_turn import gate_turn
from components.release.quality import metrics as quality_metrics
from components.release.quality.metrics import Estimate, Metric, QualityError
from components.release.quality.spec import MetricSpec, QualitySettings, QualitySpec, spec_outputs
from components.release.results import QualityCalibration, QualityResult
from components.release.run_context import RunContext
from components.release.stage import CandidateVersion, load_stable, read_candidate
from components.repository import candidate_name
from components.serving.triton_admin import TritonAdmin, TritonError
from components.settings import (
    DEFAULT_CONFIDENCE,
    DEFAULT_QUALITY_CHUNK_ROWS,
    DEFAULT_QUALITY_MAX_DROP_PCT,
    DEFAULT_QUALITY_REQUESTS_IN_FLIGHT,
)

LOG = log.get("quality")
Progress = Callable[[int, int], None]  # rows measured, rows in all


def quality(context: RunContext, settings: QualitySettings, progress: Progress | None = None) -> QualityResult:
    """The quality step on `context.gate`: `settings.eval_data` judged by `settings.spec`. Raises a TritonshipError
    for bad input (data, spec, metric) or an unreachable gate."""
    started = time.monotonic()
    model, version, gate_url = context.model, context.version, context.gate_url
    spec, eval_data = settings.spec, settings.eval_data
    repo = context.repo()
    candidate = read_candidate(repo, model, version)
    desired, _ = repo.desired_config(model)
    stable_version = desired.version_policy.specific.versions[0] if desired else None
    spec.check_against(candidate.signature)
    outputs = {s.name: s for s in candidate.signature.outputs}
    metrics = [quality_metrics.build(m, outputs) for m in spec.metrics]
    confidence = DEFAULT_CONFIDENCE  # the gate's
    result = QualityResult(
        model, version, stable_version, "inconclusive", [], eval_data, confidence=confidence, spec=spec.model_dump()
    )
    record = repo.quality_calibration(model)
    calibrated = calibrated_limits(spec, record)
    if calibrated:
        result.calibration = QualityCalibration.from_json(json.dumps(record))
    with open_eval_data(eval_data, context.s3) as data:
        check(data, candidate, spec)
        result.rows = data.rows
        turn = gate_turn(repo, gate_url, context.lease_owner, progress=progress)
        with turn as waited, TritonAdmin(gate_url) as admin:
            result.gate_wait_s = round(waited, 1)
            admin.ensure_live()
            name = candidate_name(model)
            if not admin.is_ready(name, version):
                raise QualityError(
                    f"the candidate {name} v{version} is not loaded on the gate server {admin.url}; run the stage step "
                    "first."
                )
            if desired is not None:
                try:
                    result.stable_load_seconds = load_stable(admin, repo, model, desired)
                except TritonError as exc:
                    raise QualityError(f"the stable version could not be loaded on the gate server: {exc}") from None
            try:
                targets = [(name, str(version))] + ([(model, str(stable_version))] if desired is not None else [])
                # each request fits both versions: stable may serve a smaller max_batch_size (tuned or built so)
                largest = min(c.max_batch_size for c in (candidate.config, desired) if c is not None)
                rows, slices = measure(admin.url, data, candidate, spec, metrics, targets, largest, progress)
            finally:
                if desired is not None:
                    admin.unload_with_members(model)
    decide(result, metrics, rows, slices, confidence, calibrated)
    result.seconds = round(time.monotonic() - started, 3)
    repo.record(
        model,
        "quality",
        version,
        context.run_id,
        decision=result.decision,
        reasons=result.reasons,
        stable_version=stable_version,
        rows=result.rows,
        eval_data=eval_data,
        effects=result.effects,
    )
    log.event(LOG, "quality", model=model, version=version, decision=result.decision, reasons="; ".join(result.reasons))
    return result


def check(data: EvalData, candidate: CandidateVersion, spec: QualitySpec) -> None:
    """The whole set against the signature and the metrics' labels (a pass over every chunk), before measuring."""
    signature = candidate.signature
    data.check_columns(signature, spec.label_columns, spec.slice)
    outputs = {s.name: s for s in signature.outputs}
    columns = [s.name for s in signature.inputs] + spec.label_columns
    for chunk in data.chunks(DEFAULT_QUALITY_CHUNK_ROWS, columns):
        for _ in batches(chunk, signature, candidate.config.max_batch_size):
            pass
        for metric in spec.metrics:
            for column in metric.read_labels:
                quality_metrics.check_labels(
                    metric, outputs.get(metric.output), np.asarray(chunk.columns[column]), column
                )


def measure(
    url: str,
    data: EvalData,
    candidate: CandidateVersion,
    spec: QualitySpec,
    metrics: list[Metric],
    targets: list[tuple[str, str]],
    max_batch_size: int,
    progress: Progress | None = None,
) -> tuple[list[list[np.ndarray]], np.ndarray | None]:
    """Every row through every target, at most `max_batch_size` rows a request; per target and metric, the rows'
    values; and each row's slice."""
    wanted = spec_outputs(spec)
    values: list[list[np.ndarray | None]] = [[None] * len(metrics) for _ in targets]
    slices: list[np.ndarray] = []
    local, clients = threading.local(), []

    def infer(target: tuple[str, str], inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if not hasattr(local, "admin"):  # one client a thread: an HTTP client serves one request at a time
            local.admin = TritonAdmin(url)
            clients.append(local.admin)
        return local.admin.infer(target[0], inputs, wanted, target[1])

    columns = [s.name for s in candidate.signature.inputs] + spec.label_columns + ([spec.slice] if spec.slice else [])
    done = 0
    with (
        contextlib.ExitStack() as closing,
        ThreadPoolExecutor(max_workers=DEFAULT_QUALITY_REQUESTS_IN_FLIGHT * len(targets)) as pool,
    ):
        closing.callback(lambda: [client.close() for client in clients])
        for chunk in data.chunks(DEFAULT_QUALITY_CHUNK_ROWS, columns):
            requests = list(batches(chunk, candidate.signature, max_batch_size))
            answers = [[pool.submit(infer, t, b.inputs) for b in requests] for t in targets]
            for t, futures in enumerate(answers):
                for batch, future in zip(requests, futures, strict=True):
                    local_rows = batch.rows - chunk.start
                    labels = {c: np.asarray(chunk.columns[c])[local_rows] for c in spec.label_columns}
                    answer = future.result()
                    for m, metric in enumerate(metrics):
                        row_values = metric.rows(answer, labels)
                        if values[t][m] is None:
                            values[t][m] = np.zeros((data.rows, *row_values.shape[1:]))
                        values[t][m][batch.rows] = row_values
            if spec.slice:
                slices.append(np.asarray(chunk.columns[spec.slice]).astype(str))
            done += chunk.rows
            if progress:
                progress(done, data.rows)
    return values, (np.concatenate(slices) if slices else None)  # type: ignore[return-value]


def calibrated_limits(spec: QualitySpec, record: dict[str, Any] | None) -> dict[str, float]:
    """For each metric of `spec` without a limit of its own that the quality calibration `record` measured
    (components/release/quality/calibration.py), the drop it may take (percent): the calibrated one where it is
    wider than the default."""
    if not record:
        return {}
    measured = QualityCalibration.from_json(json.dumps(record)).metrics
    return {
        m.label_text: max(DEFAULT_QUALITY_MAX_DROP_PCT, measured[m.label_text].max_drop_pct)
        for m in spec.metrics
        if not m.has_limits and m.label_text in measured
    }


def decide(
    result: QualityResult,
    metrics: list[Metric],
    values: list[list[np.ndarray]],
    slices: np.ndarray | None,
    confidence: float,
    calibrated: dict[str, float] | None = None,
) -> None:
    """Each metric's figures overall and per slice, its limits' effects (a metric in `calibrated` judged by that
    drop), and the decision."""
    effects: list[tuple[Effect, int | None]] = []
    groups: list[tuple[str, np.ndarray | None]] = [("", None)]
    if slices is not None:
        groups += [(str(v), slices == v) for v in np.unique(slices)]
    for m, metric in enumerate(metrics):
        for label, mask in groups:
            c = values[0][m] if mask is None else values[0][m][mask]
            s = None if len(values) == 1 else (values[1][m] if mask is None else values[1][m][mask])
            try:
                estimate = metric.estimate(c, s)
            except QualityError as exc:
                if mask is None:
                    raise
                result.metrics.append({"metric": metric.spec.label_text, "slice": label, "problem": str(exc)})
                continue
            result.metrics.append(_figures(metric.spec, label, estimate, confidence))
            if mask is None or metric.spec.per_slice:
                effects += _effects(
                    metric.spec, label, estimate, confidence, (calibrated or {}).get(metric.spec.label_text)
                )
    result.effects = [{**e.to_dict(), "more_rows": more} for e, more in effects]
    judged = [e for e, _ in effects]
    if not judged:
        result.decision = "inconclusive"
        result.reasons = [
            "no quality limit applies (a first release whose metrics have no floor or ceiling): nothing to judge "
            "the candidate by; give each metric a floor (or a ceiling)"
        ]
        return
    decision = judge(judged)
    result.decision = "inconclusive" if decision == "undecided" else decision
    if decision == "fail":
        result.reasons = [e.describe() for e in judged if e.status == "beyond"]
    elif decision == "pass":
        result.reasons = [e.describe() for e in judged]
    else:
        result.reasons = [
            f"{e.describe()}; about {more:,} more rows would decide" if more else f"{e.describe()}"
            for e, more in effects
            if e.status == "straddles"
        ]


def _interval(estimate: float, se: float, dof: int, confidence: float) -> tuple[float, float]:
    half = float(stats.t.ppf(0.5 + confidence / 2, dof) * se) if np.isfinite(se) else float("inf")
    return estimate - half, estimate + half


def _figures(spec: MetricSpec, label: str, estimate: Estimate, confidence: float) -> dict[str, Any]:
    own, own_se = estimate.own()
    figures: dict[str, Any] = {
        "metric": spec.label_text,
        "slice": label,
        "rows": estimate.rows,
        "higher_is_better": spec.better_high,
        "candidate": own,
        "candidate_interval": _interval(own, own_se, estimate.dof, confidence),
        "stable": estimate.stable,
    }
    if estimate.stable is not None:
        change, se = estimate.difference()
        figures.update(difference=change, difference_interval=_interval(change, se, estimate.dof, confidence))
    return figures


def _effects(
    spec: MetricSpec, label: str, estimate: Estimate, confidence: float, calibrated_pct: float | None
) -> list[tuple[Effect, int | None]]:
    name = spec.label_text + (f" [{label}]" if label else "")
    worse_high = not spec.better_high
    sign = 1 if worse_high else -1  # a drop's direction in candidate - stable
    found: list[tuple[Effect, int | None]] = []

    def add(what: str, value: float, se: float, limit: float, unit: str) -> None:
        low, high = _interval(value, se, estimate.dof, confidence)
        effect = Effect(what, value, low, high, limit, worse_high, unit)  # type: ignore[arg-type]
        found.append((effect, _more_rows(effect, estimate.rows)))

    if spec.absolute_limit is not None:
        add(name, *estimate.own(), spec.absolute_limit, "")
    if estimate.stable is not None and spec.max_drop is not None:
        add(f"{name} change", *estimate.difference(), sign * spec.max_drop, "")
    relative_pct = calibrated_pct or spec.relative_limit_pct
    if estimate.stable is not None and relative_pct is not None:
        add(f"{name} change", *estimate.relative(), sign * relative_pct / 100, "%")
    return found


def _more_rows(effect: Effect, rows: int) -> int | None:
    """About how many more rows would put the interval wholly on one side of the limit, at the same estimate and
    spread (the interval narrows with the square root of the rows); None when it is decided or cannot be."""
    if effect.status != "straddles":
        return None
    margin, half = abs(effect.estimate - effect.limit), (effect.high - effect.low) / 2
    if margin == 0 or not np.isfinite(half):
        return None
    return max(int(np.ceil(rows * ((half / margin) ** 2 - 1))), 1)


def fold_into_verdict(speed: str, quality: QualityResult | None) -> str:
    """The release's verdict from the speed gate's and the quality check's: fail if either fails, pass only
    when both pass, otherwise inconclusive."""
    if quality is None:
        return speed
    decisions = {speed, quality.decision}
    if "fail" in decisions:
        return "fail"
    return "pass" if decisions == {"pass"} else "inconclusive"
