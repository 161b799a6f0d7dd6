"""Gate step: measure the candidate against the stable version on the gate server and decide.

How it measures (docs/design.md section 4)
    Both versions are loaded on the gate server and warmed up. Then rounds: in the **duet** design
    (default) one perf_analyzer per model starts at the same moment, each at the full load, so both
    see the same seconds of the machine, and both on the same CPUs, a different group each round, so
    neither is favoured by where the scheduler puts it (components/serving/tools.py, client_cpu_groups); in the
    **alternating** design they run one after the other
    (S C, C S, ...). perf_analyzer's own stability check is relaxed (it always measures three
    windows and never exits 2 for noise): every request's latency comes from its profile export and
    the gate judges the noise itself, from the intervals of effects.

How it decides
    After each round every limit's effect gets an interval (release/effects.py): fail as soon as one lies
    wholly beyond its limit, pass once all lie wholly within, otherwise another round, until the
    time budget is spent: only then inconclusive. The budget is the whole decision's (loading the
    stable version and warming up count), so `budget_s` bounds what a release waits for a verdict. A
    round whose perf_analyzer exits 2 anyway is measured again (at most `max_attempts` times, within
    the budget); every attempt is recorded in verdict.json.

Fail closed: only `pass` promotes.
- fail: the accuracy check failed, a limit is broken, perf_analyzer is missing, crashed, found no
  valid request or could not reach the server, or the candidate is not loaded;
- inconclusive: an interval still straddles its limit when the budget is spent, a round could not
  be measured within its attempts, the stable version could not be loaded, or no limit applies.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from components import log
from components.errors import TritonshipError
from components.model import model_config
from components.release import effects
from components.release.gate import calibration as gate_calibration
from components.release.gate_turn import GateBusy, gate_turn
from components.release.quality.quality import fold_into_verdict
from components.release.results import Attempt, GateCalibration, GateResult, QualityResult, StageResult, TuneResult
from components.release.run_context import RunContext
from components.release.stage import load_stable, read_candidate
from components.repository import ModelRepository, candidate_name
from components.serving import perf, server_metrics
from components.serving.tools import client_cpu_groups, find_perf_analyzer, shared_client_cpus
from components.serving.triton_admin import TritonAdmin, TritonError
from components.settings import GateSettings

LOG = log.get("gate")
CALIBRATION_STOP = "the gate server's calibration says its budget cannot decide these limits"


RoundMeasure = Callable[[int], list[perf.PerfRun]]  # round index -> [candidate run, stable run?]


def measure_sequentially(
    result: GateResult,
    settings: GateSettings,
    measure_round: RoundMeasure,
    with_stable: bool,
    clock=time.monotonic,
    started: float | None = None,
) -> None:
    """Rounds until the effects decide, the budget is spent, or a measurement fails; fills in the result.
    The budget counts from `started` (the decision's start: loading and warming up count too), else from now;
    a round is begun only if the longest one so far still fits in it."""
    limits = settings.thresholds.limits(with_stable)
    started = clock() if started is None else started
    round_seconds = 0.0  # the longest round so far: what the next one is expected to take at most
    while True:
        runs: list[perf.PerfRun] = []
        attempt = 0
        for attempt in range(1, settings.max_attempts + 1):
            attempt_started = clock()
            runs = measure_round(result.rounds)
            took = clock() - attempt_started
            round_seconds = max(round_seconds, took)
            result.measurement_seconds += took
            for run in runs:
                result.attempts.append(Attempt.of(result.rounds + 1, attempt, run))
            broken = next((r for r in runs if not r.ok and r.exit_code != 2), None)
            if broken is not None:
                result.verdict, result.stopped = "fail", "a measurement failed"
                result.reasons = [
                    f"perf_analyzer on {broken.model} v{broken.version} (round {result.rounds + 1}) "
                    f"exited {broken.exit_code}: {broken.reason}"
                ]
                return
            if all(r.ok for r in runs) or clock() - started + round_seconds > settings.budget_s:
                break
        if not all(r.ok for r in runs):
            unstable = next(r for r in runs if not r.ok)
            result.verdict, result.stopped = "inconclusive", "a round could not be measured"
            result.reasons = [
                f"perf_analyzer on {unstable.model} v{unstable.version} could not measure round "
                f"{result.rounds + 1} in {attempt} attempt(s): {unstable.reason}"
            ]
            return
        result.rounds += 1
        c_ms, s_ms, c_s, s_s = effects.round_requests(
            runs[0].requests, runs[1].requests if len(runs) > 1 else None, settings.design == "duet"
        )
        result.candidate.add(c_ms, c_s)
        if s_ms is not None:
            result.stable.add(s_ms, s_s)
        if result.rounds >= settings.min_rounds:
            result.effects = effects.effects(
                result.candidate, result.stable if with_stable else None, limits, settings.confidence
            )
            decision = effects.judge(result.effects)
            if decision != "undecided":
                result.verdict = decision
                result.stopped = f"decided after {result.rounds} rounds"
                broken = [e.describe() for e in result.effects if e.status == "beyond"]
                result.reasons = broken if decision == "fail" else [e.describe() for e in result.effects]
                return
        if clock() - started + round_seconds > settings.budget_s:
            result.verdict = "inconclusive"
            result.stopped = f"the {settings.budget_s:g} s budget was spent after {result.rounds} rounds"
            straddling = [e.describe() for e in result.effects if e.status == "straddles"]
            why = "too few rounds were measured"
            if straddling:
                why = "; ".join(straddling) + (
                    " (the rounds disagree too much to decide: a quieter gate server or a larger budget_s"
                    " narrows the interval)"
                )
            result.reasons = [f"still undecided when the {settings.budget_s:g} s budget was spent: {why}"]
            return


def _calibrated(
    result: GateResult, settings: GateSettings, repo: ModelRepository, gate_url: str, with_stable: bool
) -> GateSettings:
    """With a calibration of this gate server for the model: the settings to measure with (the budget the
    calibration asks for, where max_calibrated_budget_s allows it), or the verdict inconclusive up front when the
    relative limits are out of the budget's reach at the calibrated noise."""
    record = repo.calibration(gate_url, result.model) if with_stable else None
    if record is None:
        return settings
    calibration = result.calibration = GateCalibration.from_json(json.dumps(record))
    far = gate_calibration.limits_out_of_reach(calibration, settings)
    if not far:
        return settings
    needed = list(gate_calibration.budgets(calibration, settings).values())
    budget = max((n for n in needed if n is not None), default=None)
    if (
        None not in needed
        and budget
        and settings.max_calibrated_budget_s
        and budget <= settings.max_calibrated_budget_s
    ):
        log.event(LOG, "budget from the calibration", model=result.model, budget_s=round(budget), gate=gate_url)
        result.settings["budget_s"] = float(np.ceil(budget))
        return dataclasses.replace(settings, budget_s=result.settings["budget_s"])
    result.verdict, result.stopped = "inconclusive", CALIBRATION_STOP
    result.reasons = [*far, "raise the limits or budget_s, or let max_calibrated_budget_s take what it asks for"]
    return settings


def _failed(result: GateResult, reason: str) -> GateResult:
    result.verdict, result.reasons, result.stopped = "fail", [reason], "could not measure"
    return result


def gate(
    context: RunContext,
    settings: GateSettings | None = None,
    stage_result: StageResult | None = None,
    out_dir: Path | None = None,
    tuning: TuneResult | None = None,
    quality: QualityResult | None = None,
) -> GateResult:
    """The gate step, on `context.gate`. Never raises for a measurement problem: it becomes the verdict.

    With `tuning`, the candidate is measured as the tune step left it loaded: with the chosen settings.
    With the gate server's metrics endpoint, its GPU and CPU utilisation while measuring go into the verdict.
    With `quality` (the quality step's result), the verdict is both's: pass only when both pass."""
    settings = settings or GateSettings()
    model, version, gate_url = context.model, context.version, context.gate_url
    repo = context.repo()
    desired, _ = repo.desired_config(model)
    stable_version = desired.version_policy.specific.versions[0] if desired else None
    result = GateResult(model, version, "inconclusive", [], stable_version, settings=_settings_dict(settings))
    result.gate_url = gate_url
    result.tuning = json.loads(tuning.to_json()) if tuning is not None else None
    try:
        with gate_turn(repo, gate_url, context.lease_owner) as waited:
            result.gate_wait_s = round(waited, 1)
            started = time.monotonic()  # the budget covers the whole decision, loading the stable version included
            settings = _calibrated(result, settings, repo, gate_url, desired is not None)
            if result.stopped != CALIBRATION_STOP:
                _measure(repo, result, settings, stage_result, desired, gate_url, context.metrics_url, started)
    except GateBusy as exc:  # nothing was measured: no decision, and nothing promoted
        result.verdict, result.reasons, result.stopped = "inconclusive", [str(exc)], "the gate server stayed busy"
    except TritonshipError as exc:
        _failed(result, str(exc))
    if quality is not None:
        result.quality, result.speed_verdict = quality, result.verdict
        result.verdict = fold_into_verdict(result.verdict, quality)
        if quality.decision != "pass":
            result.reasons = [f"quality: {r}" for r in quality.reasons] + result.reasons
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "verdict.json").write_text(result.to_json())
        _write_latencies(result, out_dir / "raw" / "latencies.npz")
        from components.release.gate import report as gate_report

        gate_report.write(result, out_dir)
    repo.record(
        model,
        "gate",
        version,
        context.run_id,
        verdict=result.verdict,
        reasons=result.reasons,
        stable_version=stable_version,
        candidate=result.candidate.summary(),
        stable=result.stable.summary(),
        effects=[e.to_dict() for e in result.effects],
        rounds=result.rounds,
        serving=result.tuning["chosen"] if result.tuning else None,
        quality=quality.decision if quality is not None else None,
    )
    log.event(LOG, "verdict", model=model, version=version, verdict=result.verdict, reasons="; ".join(result.reasons))
    return result


def _measure(
    repo: ModelRepository,
    result: GateResult,
    settings: GateSettings,
    stage_result: StageResult | None,
    desired: model_config.ModelConfig | None,
    gate_url: str,
    metrics_url: str,
    started: float,
) -> None:
    if stage_result is not None and stage_result.load_error:
        _failed(result, f"the gate server could not load the candidate: {stage_result.load_error}")
        return
    if stage_result is not None and not stage_result.accuracy_passed:
        failed = [r.name for r in stage_result.accuracy if not r.passed]
        _failed(
            result,
            f"the accuracy check failed for output(s) {', '.join(failed)}: the candidate answers differ from the golden outputs",
        )
        return
    find_perf_analyzer()  # raises a plain error if it is missing
    candidate = read_candidate(repo, result.model, result.version)
    with TritonAdmin(gate_url) as admin:
        admin.ensure_live()  # an unreachable gate is a failure, whatever the limits
    t = settings.thresholds
    with_stable = desired is not None and t.relative
    if not t.absolute and not with_stable:
        result.reasons = ["no limit applies (first release without absolute limits): nothing to judge the candidate by"]
        result.stopped = "nothing to measure against"
        return
    targets = [perf.Target(candidate_name(result.model), str(result.version))]
    with TritonAdmin(gate_url) as admin:
        admin.ensure_live()
        if not admin.is_ready(targets[0].model, result.version):
            _failed(
                result,
                f"the candidate {targets[0].model} v{result.version} is not loaded on the gate server {admin.url}; run the stage step first",
            )
            return
        if with_stable:
            try:
                result.stable_load_seconds = load_stable(admin, repo, result.model, desired)
                targets.append(perf.Target(result.model, str(result.stable_version)))
            except TritonError as exc:
                result.reasons = [f"the stable version could not be loaded on the gate server: {exc}"]
                result.stopped = "no stable version to measure against"
                return
        try:
            first = {k: v[:1] for k, v in candidate.golden_inputs.items()}
            for target in targets:  # a freshly loaded model's first requests are slow
                for _ in range(effects.WARM_UP_REQUESTS):
                    admin.infer(target.model, first, candidate.output_names, target.version)
            result.settings["request_shapes"] = candidate.request_shapes
            with tempfile.TemporaryDirectory(prefix="tritonship-gate-") as tmp:
                data = perf.write_input_data(
                    candidate.golden_inputs, Path(tmp) / "input.json", batched=candidate.config.max_batch_size > 0
                )
                with server_metrics.Sampler(metrics_url) if metrics_url else contextlib.nullcontext() as sampler:
                    measure = _round_measure(admin.url, targets, data, settings)
                    measure_sequentially(result, settings, measure, with_stable, started=started)
                result.server = sampler.summary() if sampler else {}
        finally:
            if with_stable:
                admin.unload_with_members(result.model)


def _round_measure(url: str, targets: list[perf.Target], data: Path, settings: GateSettings) -> RoundMeasure:
    def duet(round_index: int) -> list[perf.PerfRun]:
        cpus = shared_client_cpus(round_index)
        return perf.measure_together(url, targets, data, settings.load, settings.perf_timeout_s, cpus)

    def alternating(round_index: int) -> list[perf.PerfRun]:
        order = targets if round_index % 2 == 0 else targets[::-1]
        runs = {t: perf.measure_together(url, [t], data, settings.load, settings.perf_timeout_s)[0] for t in order}
        return [runs[t] for t in targets]

    return duet if settings.design == "duet" or len(targets) == 1 else alternating


def _write_latencies(result: GateResult, path: Path) -> None:
    """Every measured request's latency (ms), round by round, for anyone who wants to check the verdict."""
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {
        f"{side}_round{i + 1:03d}": lat
        for side, r in (("candidate", result.candidate), ("stable", result.stable))
        for i, lat in enumerate(r.latencies_ms)
    }
    np.savez_compressed(path, **arrays)


def _settings_dict(settings: GateSettings) -> dict[str, Any]:
    groups = [sorted(g) for g in client_cpu_groups()] if settings.design == "duet" else []
    whole = asdict(settings)
    load = whole.pop("load")
    # the load options the gate takes, beside the others as verdict.json has always had them
    taken = {n: load[n] for n, o in GateSettings.options().items() if o.path[0] == "load"}
    return {**taken, **whole, "load": load, "client_cpu_groups": groups}
