"""Gate calibration: how noisy an equal candidate is on this gate server for this model, and so which limits the
gate's budget can decide there.

`calibrate` measures the stable version against itself exactly as the gate measures a candidate against stable:
its published copy loaded dark as the candidate, the stable version beside it, duet rounds at the gate's load. The
spread of the rounds' log ratios (p99, throughput) is the gate's noise there. With the anytime-valid interval
(components/release/effects.py) it gives, for the rounds the budget holds, the smallest limit an equal candidate
is decided within (`decidable`), and for a limit, the budget it needs (`budget_for`). The result is recorded in S3
per gate server and model; the gate reads it before measuring and says up front when its limits cannot be decided
within its budget there, or, where the settings allow, takes the budget the calibration asks for."""

from __future__ import annotations

import dataclasses
import tempfile
import time
from pathlib import Path

import numpy as np
from scipy import stats

from components import log
from components.errors import TritonshipError
from components.model.model_config import ModelConfig
from components.release import effects
from components.release.gate_turn import gate_turn
from components.release.results import GateCalibration
from components.release.run_context import RunContext
from components.release.stage import CandidateVersion, load_candidate, load_stable, read_candidate
from components.repository import ModelRepository, candidate_name
from components.serving import perf
from components.serving.tools import find_perf_analyzer, shared_client_cpus
from components.serving.triton_admin import TritonAdmin
from components.settings import GateSettings

LOG = log.get("gate")
MOST_ROUNDS = 400  # budget_for looks no further


class CalibrationError(TritonshipError):
    """The gate cannot be calibrated for this model (no stable version, or its published copy is gone)."""


def _normal_sample(sd: float, rounds: int) -> np.ndarray:
    """`rounds` values with mean 0 and sample standard deviation exactly `sd`: an equal candidate's typical rounds."""
    z = stats.norm.ppf((np.arange(rounds) + 0.5) / rounds)
    return z / z.std(ddof=1) * sd


def decidable(sd: float, rounds: int, confidence: float) -> float:
    """The smallest relative limit (a fraction) that an equal candidate's interval lies within after `rounds`
    rounds whose log ratios spread by `sd`; infinite when too few rounds fit."""
    if rounds < 3:
        return float("inf")
    _, low, high = effects.sequential_interval(_normal_sample(sd, rounds), confidence, robust=False)
    return float(np.expm1(max(high, -low)))


def budget_for(
    calibration: GateCalibration, sd: float, limit: float, confidence: float, min_rounds: int
) -> float | None:
    """The budget (s) in which an equal candidate's interval for `limit` (a fraction) is decided, its rounds' log
    ratios spreading by `sd`, at this gate server's round length and loading time; None when none does."""
    for rounds in range(min_rounds, MOST_ROUNDS):
        if decidable(sd, rounds, confidence) < limit:
            return calibration.setup_seconds + rounds * calibration.round_seconds
    return None


def _relative_limits(calibration: GateCalibration, settings: GateSettings) -> list[tuple[str, float, float]]:
    """(name, limit in %, the calibrated spread of its rounds) for each relative limit that is on."""
    t = settings.thresholds
    pairs = (
        ("p99", t.max_p99_regression_pct, calibration.p99_log_sd),
        ("throughput", t.max_throughput_regression_pct, calibration.throughput_log_sd),
    )
    return [(name, limit, sd) for name, limit, sd in pairs if limit is not None]


def budgets(calibration: GateCalibration, settings: GateSettings) -> dict[str, float | None]:
    """Each relative limit's budget at the calibrated noise (budget_for)."""
    return {
        name: budget_for(calibration, sd, limit / 100, settings.confidence, settings.min_rounds)
        for name, limit, sd in _relative_limits(calibration, settings)
    }


def limits_out_of_reach(calibration: GateCalibration, settings: GateSettings) -> list[str]:
    """Each relative limit that the budget cannot decide for an equal candidate at the calibrated noise, as a
    sentence with the limit that it can decide and the budget this limit needs."""
    rounds = calibration.rounds_within(settings.budget_s)
    needed = budgets(calibration, settings)
    out = []
    for name, limit, sd in _relative_limits(calibration, settings):
        reach = decidable(sd, rounds, settings.confidence)
        if reach * 100 >= limit:
            out.append(
                f"the {name} limit ({limit:g}%) is beyond what the {settings.budget_s:g} s budget decides on this "
                f"gate server ({reach * 100:.0f}% at its calibrated noise, {calibration.rounds} rounds measured "
                f"{calibration.recorded or 'earlier'}); "
                + (f"a budget of {needed[name]:.0f} s decides it" if needed[name] else "no budget decides it")
            )
    return out


def calibrate(context: RunContext, settings: GateSettings | None = None, *, rounds: int) -> GateCalibration:
    """Measure the stable version against its own published copy on the context's gate server, `rounds` duet
    rounds, and record the noise in S3. The context's version is not read: the version measured is the stable one.
    (`tritonship calibrate gate --rounds`, or the pipeline's calibrate_rounds, says how many rounds.)"""
    settings = settings or GateSettings()
    model, gate_url = context.model, context.gate_url
    repo = context.repo()
    desired, _ = repo.desired_config(model)
    if desired is None:
        raise CalibrationError(f"'{model}' has no promoted version to calibrate the gate with; release one first.")
    version = desired.version_policy.specific.versions[0]
    try:
        candidate = read_candidate(repo, model, version)
    except TritonshipError:
        raise CalibrationError(
            f"the published copy of '{model}' v{version} is no longer in staging (repo gc?); calibrate after the "
            "next release."
        ) from None
    find_perf_analyzer()
    owner = dataclasses.replace(context, version=version).lease_owner  # by hand: the stable version's
    repo.acquire_lease(model, owner)  # the candidate's name on the gate is the model's: no release meanwhile
    try:
        with gate_turn(repo, gate_url, owner), TritonAdmin(gate_url) as admin:
            admin.ensure_live()
            found = _measure(admin, repo, candidate, desired, settings, rounds)
    finally:
        repo.release_lease(model, owner)
    found.gate = gate_url
    found.budget_s = settings.budget_s
    found.decidable_pct = {
        name: round(decidable(sd, found.rounds_within(settings.budget_s), settings.confidence) * 100, 1)
        for name, sd in (("p99", found.p99_log_sd), ("throughput", found.throughput_log_sd))
    }
    found.uri = repo.write_calibration(gate_url, model, {k: v for k, v in found.to_dict().items() if k != "uri"})
    log.event(LOG, "calibrated", model=model, gate=gate_url, **found.decidable_pct)
    return found


def _measure(
    admin: TritonAdmin,
    repo: ModelRepository,
    candidate: CandidateVersion,
    desired: ModelConfig,
    settings: GateSettings,
    rounds: int,
) -> GateCalibration:
    name, version = candidate_name(candidate.model), candidate.version
    setup_started = time.monotonic()
    load_candidate(admin, candidate)
    try:
        load_stable(admin, repo, candidate.model, desired)
        targets = [perf.Target(name, str(version)), perf.Target(candidate.model, str(version))]
        first = {k: v[:1] for k, v in candidate.golden_inputs.items()}
        for target in targets:
            for _ in range(effects.WARM_UP_REQUESTS):
                admin.infer(target.model, first, candidate.output_names, target.version)
        setup = time.monotonic() - setup_started
        p99s, throughputs, durations = [], [], []
        with tempfile.TemporaryDirectory(prefix="tritonship-calibrate-") as tmp:
            data = perf.write_input_data(
                candidate.golden_inputs, Path(tmp) / "input.json", batched=candidate.config.max_batch_size > 0
            )
            for index in range(rounds):
                started = time.monotonic()
                a_ms, b_ms, a_s, b_s = _round(admin.url, targets, data, settings, index)
                durations.append(time.monotonic() - started)
                p99s.append(np.log(np.percentile(a_ms, 99) / np.percentile(b_ms, 99)))
                throughputs.append(np.log((a_ms.size / a_s) / (b_ms.size / b_s)))
    finally:
        admin.unload_with_members(candidate.model)
        for member in candidate.member_candidate_configs():
            admin.unload(member.name)
        admin.unload(name)
    return GateCalibration(
        candidate.model,
        version,
        rounds=rounds,
        round_seconds=float(np.mean(durations)),
        setup_seconds=setup,
        p99_log_sd=float(np.std(p99s, ddof=1)),
        throughput_log_sd=float(np.std(throughputs, ddof=1)),
    )


def _round(
    url: str, targets: list[perf.Target], data: Path, settings: GateSettings, index: int
) -> tuple[np.ndarray, np.ndarray, float, float]:
    """One A/A duet round: both sides' latencies (ms) over the span both measured, and its seconds. A round whose
    two runs shared no measured span (one perf_analyzer started late on a busy machine) is measured again, up to
    the gate's max_attempts, as the gate measures a round again."""
    why = ""
    for _ in range(settings.max_attempts):
        runs = perf.measure_together(
            url, targets, data, settings.load, settings.perf_timeout_s, shared_client_cpus(index)
        )
        if not all(r.ok for r in runs):
            why = runs[0].reason if not runs[0].ok else runs[1].reason
            continue
        a_ms, b_ms, a_s, b_s = effects.round_requests(runs[0].requests, runs[1].requests, duet=True)
        if a_ms.size and b_ms is not None and b_ms.size:
            return a_ms, b_ms, a_s, b_s
        why = "the two perf_analyzer runs measured no span in common"
    raise CalibrationError(f"round {index + 1} could not be measured in {settings.max_attempts} attempt(s): {why}")
