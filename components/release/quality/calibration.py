"""Quality calibration: how much each metric of a spec moves between retrains of a model that are equally good
(the same code and data, other seeds), measured on the user's labelled data as the quality step measures it.

Each published retrain is loaded dark on the gate server in turn and every row is sent to it. Per metric, the
retrains' values spread by a standard deviation sd (relative to their mean); two retrains then differ by about
sqrt(2) x sd, which is not a regression but the seed each one drew. The drop an equally good retrain stays within
at FALSE_FAIL (one-sided, the t quantile for the retrains measured, so a few of them give a wide limit) plus the
quality step's own interval half-width for one pair is the metric's calibrated limit. The quality step gives it to
each metric whose spec sets no limit of its own, when it is wider than the default (a calibration only loosens a
default that a good retrain would fail), and says so in its report."""

from __future__ import annotations

import statistics

import numpy as np
from scipy import stats

from components import log
from components.model.eval_data import open_eval_data
from components.release.gate_turn import gate_turn
from components.release.quality import metrics as quality_metrics
from components.release.quality.metrics import Metric, QualityError
from components.release.quality.quality import check, measure
from components.release.quality.spec import QualitySettings
from components.release.results import MetricVariation, QualityCalibration
from components.release.run_context import RunContext
from components.release.stage import load_candidate, read_candidate
from components.repository import candidate_name, lease_owner
from components.serving.triton_admin import TritonAdmin
from components.settings import DEFAULT_CONFIDENCE

LOG = log.get("quality")
MIN_RETRAINS = 3
FALSE_FAIL = 0.01  # per metric: the share of equally good retrains a calibrated limit may fail


def calibrate_quality(context: RunContext, settings: QualitySettings, versions: list[int]) -> QualityCalibration:
    """Measure every metric of `settings.spec` on `settings.eval_data` on each published retrain in `versions`, on
    `context.gate`; record the variation in S3."""
    model, gate_url, spec = context.model, context.gate_url, settings.spec
    versions = list(dict.fromkeys(versions))
    if len(versions) < MIN_RETRAINS:
        raise QualityError(
            f"quality calibration needs at least {MIN_RETRAINS} retrains of '{model}' (other seeds, published); "
            f"{len(versions)} given."
        )
    repo = context.repo()
    candidates = [read_candidate(repo, model, v) for v in versions]
    spec.check_against(candidates[0].signature)
    metrics = [quality_metrics.build(m, {s.name: s for s in candidates[0].signature.outputs}) for m in spec.metrics]
    values: list[list[np.ndarray]] = []
    owner = lease_owner(context.run_id, model, versions[0])  # a manual run's lease names the first retrain
    with open_eval_data(settings.eval_data, context.s3) as data:
        check(data, candidates[0], spec)
        repo.acquire_lease(model, owner)  # the retrains load under the candidate's name: no release meanwhile
        try:
            with gate_turn(repo, gate_url, owner) as _, TritonAdmin(gate_url) as admin:
                for candidate in candidates:
                    load_candidate(admin, candidate)
                    try:
                        target = [(candidate_name(model), str(candidate.version))]
                        rows, _ = measure(
                            admin.url, data, candidate, spec, metrics, target, candidate.config.max_batch_size
                        )
                        values.append(rows[0])
                    finally:
                        admin.unload_with_members(candidate_name(model))
        finally:
            repo.release_lease(model, owner)
        found = QualityCalibration(model, versions, settings.eval_data, data.rows)
    found.metrics = {
        m.spec.label_text: variation(m, [v[i] for v in values], DEFAULT_CONFIDENCE) for i, m in enumerate(metrics)
    }
    found.uri = repo.write_quality_calibration(model, {k: v for k, v in found.to_dict().items() if k != "uri"})
    log.event(LOG, "calibrated", model=model, **{k: v.max_drop_pct for k, v in found.metrics.items()})
    return found


def variation(metric: Metric, rows: list[np.ndarray], confidence: float) -> MetricVariation:
    """One metric's values on each retrain (`rows`: its per-row values, one array a retrain) and the limit."""
    values = [metric.estimate(r, None).own()[0] for r in rows]
    mean = float(np.mean(values))
    sd = float(np.std(values, ddof=1) / abs(mean)) if mean else float("inf")
    halves = []
    for candidate, stable in zip(rows[1:], rows[:-1], strict=True):
        estimate = metric.estimate(candidate, stable)
        _, se = estimate.relative()
        halves.append(float(stats.t.ppf(0.5 + confidence / 2, estimate.dof) * se))
    half = statistics.median(halves)
    bound = stats.t.ppf(1 - FALSE_FAIL, len(values) - 1) * np.sqrt(2) * sd
    return MetricVariation(
        [round(v, 6) for v in values],
        round(sd * 100, 3),
        round(half * 100, 3),
        float(np.ceil((bound + half) * 1000) / 10),  # percent, rounded up to 0.1
    )
