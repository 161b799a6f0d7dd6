"""Tune step: find the candidate's serving settings on the gate server before it is gated.

Each setting (max_batch_size, dynamic batching delay and preferred batch sizes, instance count, the PyTorch
backend's intra-op threads, and for an ensemble the instance count of its pre/post steps) is tried
by reloading `<model>__candidate` on the gate through the load API with a config override (S3 is never
written) and measuring it with perf_analyzer at the gate's load. The chosen setting has the highest
throughput whose p99 stays within the latency limit: the given one, or else the default setting's p99
plus `p99_slack_pct` (tuning must not buy throughput with latency nobody agreed to). One perf_analyzer
run's p99 moves by up to ±30% on a busy machine, so a derived limit comes from two runs of the default
(the higher p99; their mean throughput is the default's): one low reading would otherwise refuse
settings no slower than the default (benchmarks/README.md, tuning).

At a fixed request rate (the load's `request_rate`, as a service with a known traffic and a latency target
asks) every setting that keeps up serves the same throughput, so the ranking is the lowest p99 among the
settings that serve the rate (RATE_HELD of it), and a gain is a p99 that much lower.

The search is a coordinate search from the default: one knob at a time, every value of it with the other
knobs at their best so far; it moves only for a gain of at least `min_gain_pct` and stops after a pass
over all knobs that moved nothing, or when `budget` settings have been measured.

A winner other than the default is adopted only when it wins again: it and the default are measured once
more, one after the other (two runs beyond the budget), and over all their runs it must still gain
`min_gain_pct` with its highest p99 within the limit. One noisy run (a demo once chose 3 instances for
+15% that were 34% slower when measured again) otherwise decides what production serves.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict

from components import log
from components.errors import TritonshipError
from components.model import ensemble, model_config
from components.model.model_config import ServingSettings
from components.release.gate_turn import gate_turn
from components.release.results import Trial, TuneResult
from components.release.run_context import RunContext
from components.release.stage import CandidateVersion, read_candidate
from components.release.tune.bench import GateBench
from components.release.tune.settings import TuneSettings

LOG = log.get("tune")
RATE_HELD = 0.97  # at a fixed rate a setting keeps up when it serves 97% of it: perf_analyzer's schedule jitters


def default_settings(
    config: model_config.ModelConfig, members: Sequence[model_config.ModelConfig] = ()
) -> ServingSettings:
    """What the compiled model's config.pbtxt serves with; an ensemble's are its model's at the ensemble's
    max_batch_size, with its pre/post steps' instance count (tuning serves every member of an ensemble
    with the same settings, the steps with their own instance count)."""
    if members:
        steps = [m for m in members if ensemble.is_step(m)]
        model = next((m for m in members if not ensemble.is_step(m)), members[0])
        return dataclasses.replace(
            default_settings(model),
            max_batch_size=config.max_batch_size or None,
            step_instance_count=default_settings(steps[0]).instance_count if steps else None,
        )
    batching = config.HasField("dynamic_batching")
    return ServingSettings(
        max_batch_size=config.max_batch_size or None,
        dynamic_batching=batching,
        max_queue_delay_us=config.dynamic_batching.max_queue_delay_microseconds if batching else 0,
        preferred_batch_sizes=tuple(config.dynamic_batching.preferred_batch_size) if batching else (),
        instance_count=config.instance_group[0].count if config.instance_group else 1,
        intra_op_threads=model_config.intra_op_threads(config),
        optimized_execution=model_config.optimized_execution(config),
    )


# --------------------------------------------------------------------------------------- the space
Knob = tuple[str, Callable[[ServingSettings], list[ServingSettings]]]


def knobs(default: ServingSettings, settings: TuneSettings) -> list[Knob]:
    """Each knob: its name and the settings that differ from a given one in that knob only (itself included).

    The queue delay and the preferred batch size are one knob: a delay only pays when the scheduler may
    cut a batch early at the size the load fills (requests in flight), and neither helps alone, so a
    search that moves them separately never finds the pair (benchmarks/README.md, tuning, design 1)."""
    largest = default.max_batch_size or 0
    batch_sizes = sorted({b for b in (1, 4, 16, 64, 256) if b < largest} | {largest})
    load = settings.load
    in_flight = load.concurrency * load.batch_size if load.request_rate is None else None

    def preferred_for(max_batch_size: int) -> tuple[int, ...]:
        return (min(in_flight, max_batch_size),) if in_flight else (max_batch_size,)

    def counts_that_can_run(current: int | None) -> list[int]:
        """More instances than requests in flight at the tuning load never run at once: whatever such a count
        measures better is noise (a demo run adopted 3 instances at concurrency 1 for a +8.7% of it, and its
        gate then found the release slower beside a busy process)."""
        return [n for n in settings.instance_counts if in_flight is None or n <= in_flight or n == current]

    def sizes_that_differ(current: int | None) -> list[int]:
        """A batch never holds more requests than are in flight at the tuning load, so every max batch size
        from that number up serves it alike: whichever measures better is noise (a demo run adopted 1 over 16
        at concurrency 1 for a +6.8% of it, and production lost its batching)."""
        return [b for b in batch_sizes if in_flight is None or b < in_flight or b == current]

    def instances(c: ServingSettings) -> list[ServingSettings]:
        return [dataclasses.replace(c, instance_count=n) for n in counts_that_can_run(c.instance_count)]

    def intra_op(c: ServingSettings) -> list[ServingSettings]:
        return [dataclasses.replace(c, intra_op_threads=n) for n in settings.intra_op_thread_counts]

    def execution(c: ServingSettings) -> list[ServingSettings]:
        return [dataclasses.replace(c, optimized_execution=o) for o in settings.optimized_executions]

    def step_instances(c: ServingSettings) -> list[ServingSettings]:
        return [dataclasses.replace(c, step_instance_count=n) for n in counts_that_can_run(c.step_instance_count)]

    def max_batch(c: ServingSettings) -> list[ServingSettings]:
        return [
            dataclasses.replace(
                c, max_batch_size=b, preferred_batch_sizes=preferred_for(b) if c.preferred_batch_sizes else ()
            )
            for b in sizes_that_differ(c.max_batch_size)
        ]

    def batching(c: ServingSettings) -> list[ServingSettings]:
        return [
            dataclasses.replace(c, dynamic_batching=True, max_queue_delay_us=d, preferred_batch_sizes=p)
            for d in settings.queue_delays_us
            for p in ((), preferred_for(c.max_batch_size or 1))
        ]

    # an ensemble's pre/post steps (Python, CPU) get instances of their own: one process each serves a
    # few thousand requests/s whatever the model's speed (benchmarks/README.md, the users' BERT4Rec)
    counts: list[Knob] = [("instance_count", instances)]
    if len(settings.optimized_executions) > 1:  # on for a GPU model (tune)
        counts.insert(0, ("optimized_execution", execution))
    if len(settings.intra_op_thread_counts) > 1:  # off for a GPU model (tune): its CPU threads barely work
        counts.append(("intra_op_threads", intra_op))
    if default.step_instance_count is not None:
        counts.append(("step_instance_count", step_instances))
    if not largest:  # a model without a batch dimension: only instances can change
        return counts
    return [*counts, ("max_batch_size", max_batch), ("batching", batching)]


def grid(default: ServingSettings, settings: TuneSettings) -> list[ServingSettings]:
    """Every combination of every knob's values (the full grid the search avoids measuring)."""
    points = [default]
    for _name, values in knobs(default, settings):
        points = [v for p in points for v in values(p)]
    unique: dict[ServingSettings, None] = dict.fromkeys(points)
    return list(unique)


def _keeps_up(trial: Trial, rate: float | None) -> bool:
    """At a fixed request rate, whether the setting served it (all but RATE_HELD's slack of it)."""
    return rate is None or (trial.throughput or 0) >= rate * RATE_HELD


def _eligible(trial: Trial, limit_ms: float | None, rate: float | None) -> bool:
    return trial.measured and (limit_ms is None or trial.p99_ms <= limit_ms) and _keeps_up(trial, rate)


def _best(trials: Iterator[Trial], limit_ms: float | None, rate: float | None) -> Trial | None:
    eligible = [t for t in trials if _eligible(t, limit_ms, rate)]
    if rate is None:
        return max(eligible, key=lambda t: t.throughput, default=None)
    return min(eligible, key=lambda t: t.p99_ms, default=None)


def _leader(trials: Iterator[Trial], rate: float | None) -> ServingSettings | None:
    """At a fixed rate, while no setting is eligible yet: the one the next knobs start from, the lowest p99 of
    those that keep up, else the highest throughput. Starting from the default instead, a combination none of
    whose single steps is eligible (more instances and a queue delay) is never tried."""
    measured = [t for t in trials if t.measured]
    if rate is None or not measured:
        return None
    keeping = [t for t in measured if _keeps_up(t, rate)]
    best = min(keeping, key=lambda t: t.p99_ms) if keeping else max(measured, key=lambda t: t.throughput)
    return best.settings


def search(
    measure: Callable[[ServingSettings], Trial], default: ServingSettings, settings: TuneSettings, grid_size: int
) -> TuneResult:
    """Coordinate search from `default` (see the module docstring). `measure` loads and measures one setting."""
    rate = settings.load.request_rate
    result = TuneResult("", 0, default, default, settings.max_p99_ms, grid_size, request_rate=rate)
    measured: dict[ServingSettings, Trial] = {}

    def measure_once(candidate: ServingSettings) -> Trial | None:
        if len(result.trials) >= settings.budget:
            return None
        trial = measure(candidate)
        result.trials.append(trial)
        log.event(LOG, "trial", **trial.row())
        return trial

    def run(candidate: ServingSettings) -> Trial | None:
        if candidate not in measured:
            trial = measure_once(candidate)
            if trial is None:
                return None
            measured[candidate] = trial
        return measured[candidate]

    baseline = run(default)
    if baseline is None or not baseline.measured:
        return result  # the default stays; the gate measures (and judges) it
    if result.p99_limit_ms is None:
        again = measure_once(default)
        if again is not None and again.measured:
            baseline = measured[default] = Trial.combined([baseline, again])
        result.p99_limit_ms = baseline.p99_ms * (1 + settings.p99_slack_pct / 100)
    current = default if _eligible(baseline, result.p99_limit_ms, rate) else None
    moved = True
    while moved and len(result.trials) < settings.budget:
        moved = False
        for _name, values in knobs(default, settings):
            anchor = current or _leader(iter(measured.values()), rate) or default
            tried = [t for t in (run(v) for v in values(anchor)) if t is not None]
            best = _best(iter(tried), result.p99_limit_ms, rate)
            if best is None or best.settings == current:
                continue
            reference = measured.get(current) if current else None
            if reference is None or best.gain_pct(reference, rate) >= settings.min_gain_pct:
                current, moved = best.settings, True
    result.chosen = default
    if current is not None and current != default:
        result.chosen, result.confirmation = _confirm(measure, result, current, settings)
    return result


def _confirm(
    measure: Callable[[ServingSettings], Trial], result: TuneResult, winner: ServingSettings, settings: TuneSettings
) -> tuple[ServingSettings, str]:
    """Measure the search's winner and the default once more; the winner stays only if it still wins.
    (Over a default whose p99 breaks a given limit, winning means keeping p99 within it.)"""
    for setting in (winner, result.default):
        result.trials.append(measure(setting))
        log.event(LOG, "trial", confirming=True, **result.trials[-1].row())
    if not all(t.measured for t in result.trials[-2:]):
        return result.default, "not confirmed: it or the default could not be measured again; the default is kept"
    won, default, limit = result.trial(winner), result.trial(result.default), result.p99_limit_ms
    rate = settings.load.request_rate
    gain = result.gain_of(winner)
    if limit is not None and won.p99_ms > limit:
        return (
            result.default,
            f"not confirmed: measured again, its p99 {won.p99_ms:.2f} ms is over the limit; the default is kept",
        )
    if not _keeps_up(won, rate):
        return result.default, (
            f"not confirmed: measured again, it served {won.throughput:,.0f} of the {rate:,.0f} requests/s offered; "
            "the default is kept"
        )
    figure = "throughput" if rate is None else f"lower p99 at {rate:,.0f} requests/s"
    if _eligible(default, limit, rate) and gain < settings.min_gain_pct:
        return result.default, (
            f"not confirmed: measured again beside the default, {gain:+.1f}% {figure} over all runs "
            f"(under +{settings.min_gain_pct:g}%); the default is kept"
        )
    return winner, f"confirmed: {gain:+.1f}% {figure} over all runs of both"


def _on_gpu(candidate: CandidateVersion) -> bool:
    """The candidate's model runs on GPU instances (an ensemble's: its model member's)."""
    configs = [c for c in [candidate.config, *candidate.members.values()] if c.platform in model_config.MODEL_FILES]
    return any(g.kind == model_config.mc.ModelInstanceGroup.KIND_GPU for c in configs for g in c.instance_group)


def _is_aoti(candidate: CandidateVersion) -> bool:
    return any(c.platform == model_config.AOTI_PLATFORM for c in [candidate.config, *candidate.members.values()])


def _tuned(
    gate_url: str,
    candidate: CandidateVersion,
    default: ServingSettings,
    settings: TuneSettings,
    size: int,
    metrics_url: str,
) -> TuneResult:
    """Warm up with the default, search, and leave the candidate loaded with the chosen settings."""
    bench = GateBench(gate_url, candidate, settings.load, settings.perf_timeout_s, metrics_url)
    try:
        bench.admin.ensure_live()
        if not bench.admin.is_ready(bench.name, candidate.version):
            raise TritonshipError(
                f"the candidate {bench.name} v{candidate.version} is not loaded on {gate_url}; run stage first."
            )
        warm_up = bench.measure(default)
        log.event(LOG, "warmed up", throughput=warm_up.throughput, p99_ms=warm_up.p99_ms, problem=warm_up.problem)
        result = search(bench.measure, default, settings, size)
        result.model, result.version, result.request_shapes = (
            candidate.model,
            candidate.version,
            candidate.request_shapes,
        )
        result.warm_up = warm_up
        if result.trials and result.trials[-1].settings != result.chosen:
            bench.apply(result.chosen)
        return result
    finally:
        bench.close()


def tune(context: RunContext, settings: TuneSettings | None = None) -> TuneResult:
    """The tune step: warm up, search, leave the candidate loaded with the chosen settings, record the table.
    The first run at the load on a freshly started server is slow (on the H200 a p99 of 38 ms against 9-11
    ms in the runs after it, and 14 against 5-6 ms): counted, it would loosen the limit derived from the
    default's runs and count against the default, so one run of the default comes first and is kept apart
    (TuneResult.warm_up).
    Turned off (`settings.enabled`) it returns the default settings. An ensemble's members are all served with the
    same settings (components/model/ensemble.py, with_serving_settings).
    With the gate server's metrics endpoint (the context's gate), each trial carries its GPU and CPU utilisation. It
    measures while it holds the gate server alone (gate_turn), after any other release's measurement there."""
    settings = settings or TuneSettings()
    model, version, run_id = context.model, context.version, context.run_id
    repo = context.repo()
    candidate = read_candidate(repo, model, version)
    default = default_settings(candidate.config, list(candidate.members.values()))
    if _on_gpu(candidate):
        settings = dataclasses.replace(settings, intra_op_thread_counts=(default.intra_op_threads,))
    else:  # on the CPU its pauses are the fuser's, which libtorch leaves off there
        settings = dataclasses.replace(settings, optimized_executions=(default.optimized_execution,))
    if _is_aoti(candidate):  # a package has no TorchScript executor; each instance runs its own loader (patch 6)
        settings = dataclasses.replace(settings, optimized_executions=(default.optimized_execution,))
    size = len(grid(default, settings))
    started = time.monotonic()
    if not settings.enabled:
        result = TuneResult(model, version, default, default, None, size, enabled=False)
    else:
        with gate_turn(repo, context.gate_url, context.lease_owner) as waited:
            started = time.monotonic()
            result = _tuned(context.gate_url, candidate, default, settings, size, context.metrics_url)
            result.gate_wait_s = round(waited, 1)
    result.seconds = time.monotonic() - started
    if result.enabled:  # turned off, there is nothing to record
        details = {k: v for k, v in json.loads(result.to_json()).items() if k not in ("model", "version")}
        repo.record(model, "tuned", version, run_id, **details)
    log.event(
        LOG,
        "tuned",
        model=model,
        version=version,
        chosen=asdict(result.chosen),
        gain_pct=result.gain_pct,
        tried=len(result.trials),
        grid=size,
    )
    return result
