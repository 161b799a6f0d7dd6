"""Promote and reject steps.

Promote (only on a `pass` verdict) holds the model's release lease and runs a `Promotion`, a state machine: its
phases, what moves it from one to the next, and how it ends.

    COPY ──► CANARY ──► ROLL ──► FINISH ──► promoted
      │         │                   └── S3 fails after every replica switched ──► promoted, unrecorded (a failure)
      │         ├── no canary (turned off, a first release, too few replicas): COPY goes on to ROLL
      │         └── the canary fails, or is inconclusive and its settings revert ──► REVERT (the canary)
      └─────────┴──── a failure, SIGTERM or SIGINT in any phase ──► REVERT (a failure, a signal)
    REVERT ──► reverted (every replica serves the stable version again) or partial (some could not be brought back)

A replica that does not answer before COPY stops the promotion with an error; nothing has changed then.

1. **copy**: the staged candidate is copied into the production folder server-side (manifest re-verified);
2. **canary** (components/release/promote/canary.py): the canary compares the first replicas with the others on live
   traffic while all serve the stable version; the promotion then switches them, and the canary measures them
   against the others again until it decides. The desired state still names the stable version, so a pod
   restarting meanwhile comes up on it;
3. **roll**: the new desired state is written (config.pbtxt pinned to the new version, replaced only if it is
   still the config this promotion read: ETag), then every replica not yet switched is reloaded with it, one
   at a time, each checked with a smoke inference (components/release/promote/rollout.py);
4. **finish**: an ensemble's members' desired configs drop the old version, the history records the
   promotion, and the in-progress record is deleted.

Each phase is recorded in S3 (`PromotionRecord`) before it starts, and a signal that a library swallowed is
raised again there and after each replica (components/release/promote/cancel.py). The revert runs shielded from further
signals: it writes the previous desired state back, reloads every replica to it, and the history says why. A run
killed outright (SIGKILL) leaves its record, which `reconcile` and the pipeline's exit handler settle
(components/release/promote/reconcile.py). `Promotion.run` returns how it ended, never raising for an outcome.
`promote` returns the result when the version is promoted, or when the canary reverted it, a normal outcome
(`result.outcome`); it raises a PromotionError when a failure reverted it, PromotionCancelled when SIGTERM or SIGINT
did, and PartialRevert when a revert left a replica behind. Promoted, the candidate leaves the gate server.

Reject: unload the candidate from the gate, leave production untouched, record the verdict.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from typing import Protocol

from components import log
from components.errors import TritonshipError
from components.model import ensemble, model_config
from components.release.promote.canary import Canary, Watch, decide, why_reverted
from components.release.promote.canary_report import reverted_by_canary
from components.release.promote.cancel import Cancelled, cancellable, raise_pending, shielded
from components.release.promote.plan import Changes, Plan
from components.release.promote.records import (
    CanaryResult,
    Ending,
    Outcome,
    Phase,
    PromoteResult,
    PromotionRecord,
    Stop,
)
from components.release.promote.rollout import Fleet, PromotionError, Release
from components.release.promote.settings import CanarySettings, PromoteSettings
from components.release.run_context import RunContext
from components.release.stage import unload_candidate
from components.repository import ModelRepository
from components.s3 import S3Error
from components.serving.live_metrics import histograms_everywhere
from components.serving.replicas import Replica

LOG = log.get("promote")

__all__ = ["PartialRevert", "Plan", "Promotion", "PromotionCancelled", "PromotionError", "promote", "reject"]


class Progress(Protocol):
    def __call__(self, what: str, replica: Replica) -> None: ...


class CanaryRun(Protocol):
    """What a promotion asks of its canary (components/release/promote/canary.py `Canary`)."""

    result: CanaryResult

    def before_switch(self) -> bool: ...

    def after_switch(self) -> CanaryResult: ...


class CanaryFactory(Protocol):
    def __call__(
        self,
        watch: Watch,
        canary: list[Replica],
        baseline: list[Replica],
        settings: CanarySettings,
        progress: Callable[[str], None],
    ) -> CanaryRun: ...


class PromotionCancelled(PromotionError):
    """SIGTERM or SIGINT stopped the promotion and every replica is back on the stable version."""

    exit_code = Cancelled.exit_code


class PartialRevert(PromotionError):
    """The promotion failed and at least one replica could not be brought back: run the reconcile it names."""

    exit_code = 4


def promote(
    context: RunContext,
    settings: PromoteSettings | None = None,
    *,
    replicas: list[Replica],
    verdict: str,
    quality: str | None = None,
    serving: model_config.ServingSettings | None = None,
    progress: Progress | None = None,
) -> PromoteResult:
    """Promote the context's gated version to `replicas`, the first ones measured as a canary (`settings.canary`,
    which may be off). `verdict`: the gate's decision; `quality`: the verdict's quality decision, when the release
    was checked on labelled data; `serving`: the tuned serving settings. Promoted, the candidate leaves the
    context's gate server, when it names one."""
    chosen = settings or PromoteSettings()
    if verdict != "pass":
        raise PromotionError(f"the gate verdict is '{verdict}', not 'pass': nothing is promoted.")
    if quality is not None and quality != "pass":
        raise PromotionError(f"the quality check is '{quality}', not 'pass': nothing is promoted.")
    if not replicas:
        raise PromotionError("no production replicas were given; nothing would serve the new version.")
    repo = context.repo()
    with cancellable(), _leased(repo, context.model, context.lease_owner):
        plan = Plan.read(repo, context, replicas, serving)
        with Fleet(replicas, chosen.load_timeout_s) as fleet:
            ending = Promotion(plan, fleet, chosen.canary, progress=progress).run()
    result = ending.result
    if result.outcome is Outcome.PARTIAL:
        raise PartialRevert(ending.said, result)
    if ending.stopped_by is Stop.SIGNAL:
        raise PromotionCancelled(ending.said, result)
    if ending.stopped_by is Stop.FAILURE:
        raise PromotionError(ending.said, result)
    if context.gate is not None and result.promoted:
        unload_candidate(context.gate_url, context.model)
    return result


@contextmanager
def _leased(repo: ModelRepository, model: str, owner: str) -> Iterator[None]:
    """The model's release lease (renewed: refused if another release holds it), given back whatever happens."""
    repo.acquire_lease(model, owner)
    try:
        yield
    finally:
        with shielded():
            try:
                repo.release_lease(model, owner)
            except S3Error as exc:  # never hide the promotion's own outcome; the lease expires by itself
                log.event(LOG, "lease not released", model=model, reason=str(exc), level=30)


def reject(context: RunContext, verdict: str, reasons: list[str]) -> None:
    """Production is left as it is; the candidate leaves the context's gate server, when it names one; the
    rejection goes into the history."""
    repo, model = context.repo(), context.model
    unloaded = unload_candidate(context.gate_url, model) if context.gate is not None else False
    repo.record(
        model,
        "rejected",
        context.version,
        context.run_id,
        verdict=verdict,
        reasons=reasons,
        candidate_unloaded=unloaded,
    )
    repo.release_lease(model, context.lease_owner)
    log.event(LOG, "rejected", model=model, version=context.version, verdict=verdict)


class Promotion:
    """One promotion through its phases (the module's diagram); `run` once."""

    def __init__(
        self,
        plan: Plan,
        fleet: Fleet,
        canary: CanarySettings | None = None,  # None: no canary
        *,
        new_canary: CanaryFactory = Canary,
        progress: Progress | None = None,
    ):
        self.plan, self.fleet, self.canary, self.new_canary, self.progress = plan, fleet, canary, new_canary, progress
        self.phase = Phase.COPY
        urls = [r.url for r in plan.replicas]
        self.result = PromoteResult(plan.model, plan.version, plan.previous_version, urls, promoted=False)

    def run(self) -> Ending:
        plan, changes = self.plan, None
        self.fleet.ensure_live()
        try:
            self._enter(Phase.COPY)
            changes = Changes(self._copy())
            first, skipped = self._canary_replicas()
            if skipped:
                self.result.canary = CanaryResult(plan.model, plan.version, plan.previous_version, "skipped", [skipped])
                log.event(LOG, "canary skipped", model=plan.model, reason=skipped, level=30)
            goes_on = True
            if first and self.canary is not None and plan.previous_version is not None:
                self._enter(Phase.CANARY)
                canary = self._canary(changes, first, self.canary, plan.previous_version)
                goes_on = decide(canary, self.canary)
            if goes_on:
                self._enter(Phase.ROLL)
                self._roll(changes)
                self._enter(Phase.FINISH)
                return self._finish(changes)
            stop, reason = Stop.CANARY, why_reverted(canary)
        except Cancelled as exc:
            stop, reason = Stop.SIGNAL, f"stopped by {exc.signal_name} in its {self.phase} phase"
        except TritonshipError as exc:
            stop, reason = Stop.FAILURE, str(exc)
        with shielded():
            return self._revert(changes, stop, reason)

    def _canary_replicas(self) -> tuple[int, str]:
        """How many replicas the canary switches first (0: none), and why a canary that was asked for cannot run."""
        if self.canary is None or not self.canary.enabled:
            return 0, ""
        if self.plan.previous_version is None:
            return 0, "a first release: no stable version serves live traffic to compare the canary with"
        if len(self.plan.replicas) <= self.canary.replicas:
            return 0, (
                f"{len(self.plan.replicas)} replica(s) and {self.canary.replicas} canary replica(s): none would stay on "
                "the stable version to compare with"
            )
        return self.canary.replicas, ""

    def _enter(self, phase: Phase) -> None:
        raise_pending()
        self.phase = phase
        plan = self.plan
        replicas = [r.url for r in plan.replicas]
        PromotionRecord(plan.model, plan.version, phase, plan.previous_version, plan.run_id, replicas).write(plan.repo)
        log.event(LOG, "phase", model=plan.model, version=plan.version, phase=phase.value)
        self._say(f"{phase} phase")

    def _say(self, what: str, replica: Replica | None = None) -> None:
        if self.progress:
            self.progress(what, replica or self.plan.replicas[0])

    def _copy(self) -> Release:
        plan, candidate = self.plan, self.plan.candidate
        for name in [*candidate.members, plan.model]:
            plan.repo.copy_to_production(name, plan.version)
        configs = candidate.production_configs()
        config = configs.pop(plan.model)
        if plan.serving is not None and candidate.members:
            config, configs = ensemble.with_serving_settings(config, configs, plan.serving)
        elif plan.serving is not None:
            config = model_config.with_settings(config, plan.serving)
        if histograms_everywhere(plan.replicas):
            config = model_config.with_latency_buckets(config)  # the canary's p99 of each round, from now on
        old_members = ensemble.pinned_member_version(plan.previous) if plan.previous and candidate.members else None
        return Release(candidate, config, configs, old_members)

    def _canary(self, changes: Changes, first: int, settings: CanarySettings, stable: int) -> CanaryResult:
        """The canary measures before and after the switch; the promotion switches its replicas in between."""
        plan, release = self.plan, changes.release
        watch = Watch(
            plan.model, plan.version, stable, dict.fromkeys(release.members, (plan.version, release.old_members))
        )
        canary = self.new_canary(watch, plan.replicas[:first], plan.replicas[first:], settings, self._say)
        if canary.before_switch():
            self._switch(changes, first)
            canary.after_switch()
        self.result.canary = canary.result
        return canary.result

    def _roll(self, changes: Changes) -> None:
        """The desired state for pods that restart meanwhile, then every replica not yet switched (an inconclusive
        canary may go on with none switched). An ensemble's members keep the old version beside the new one until
        every replica runs the new ensemble, so any ensemble config finds its members."""
        repo, model = self.plan.repo, self.plan.model
        for member in changes.release.members_beside_old():
            changes.member_previous[member.name], etag = repo.desired_config(member.name)
            changes.desired_etags[member.name] = repo.write_desired_config(member.name, member, etag)
        changes.desired_etags[model] = repo.write_desired_config(model, changes.release.config, self.plan.etag)
        self._switch(changes, len(self.plan.replicas))

    def _switch(self, changes: Changes, upto: int) -> None:
        """The replicas not yet switched, up to the `upto`th, one at a time."""
        for i in range(changes.switched, upto):
            replica = self.plan.replicas[i]
            self._say("switching", replica)
            self.result.load_seconds.append(self.fleet.switch(self.plan.repo, i, changes.release))
            changes.switched = i + 1
            raise_pending()
            self._say("switched", replica)

    def _finish(self, changes: Changes) -> Ending:
        """Every replica runs the new members only now. An S3 failure here leaves every replica on the new version
        and S3 naming it: promoted, and a failure to say so (re-running promote records it)."""
        plan, result = self.plan, self.result
        try:
            for name, member_config in changes.release.members.items():
                changes.desired_etags[name] = plan.repo.write_desired_config(
                    name, member_config, changes.desired_etags[name]
                )
            plan.repo.record(
                plan.model,
                "promoted",
                plan.version,
                plan.run_id,
                previous_version=plan.previous_version,
                replicas=result.replicas,
                members=dict.fromkeys(changes.release.members, plan.version),
                canary=result.canary.to_dict() if result.canary else None,
            )
            plan.repo.clear_promotion(plan.model)
        except S3Error as exc:
            result.promoted = True
            return Ending(
                result,
                Stop.FAILURE,
                f"{plan.model} v{plan.version} is promoted (every replica serves it and S3 names it) but the last "
                f"write to S3 (history or member configs) failed ({exc}); re-run this promote step to finish it.",
            )
        result.promoted = True
        log.event(LOG, "promoted", model=plan.model, version=plan.version, previous=plan.previous_version)
        return Ending(result)

    def _revert(self, changes: Changes | None, stop: Stop, reason: str) -> Ending:
        """Put every replica back on the stable version and record why; `changes` is None when it stopped while
        copying, before anything a replica reads was loaded or written."""
        plan, result = self.plan, self.result
        result.problems.append(reason)
        if changes is not None:
            etags = dict(sorted(changes.desired_etags.items(), key=lambda item: item[0] != plan.model))  # model first
            result.after_revert, problems = self.fleet.revert(
                plan.repo, changes.release, plan.previous, etags, changes.member_previous
            )
            result.problems += problems
            result.reverted = all(state.reverted for state in result.after_revert)
        else:
            result.reverted = True
        log.event(LOG, "reverted" if result.reverted else "partly reverted", model=plan.model, level=30)
        try:
            plan.repo.record(
                plan.model,
                "reverted",
                plan.version,
                plan.run_id,
                previous_version=plan.previous_version,
                phase=self.phase.value,
                complete=result.reverted,
                replicas=[asdict(state) for state in result.after_revert],
                problems=result.problems,
                canary=result.canary.to_dict() if result.canary else None,
            )
            if result.reverted:
                plan.repo.clear_promotion(plan.model)
        except S3Error as record_error:
            result.problems.append(f"the history event could not be written ({record_error})")
        return Ending(result, stop, self._said(stop, reason))

    def _said(self, stop: Stop, reason: str) -> str:
        plan, result = self.plan, self.result
        what = f"{plan.model} v{plan.version}"
        if not result.reverted:
            urls = ",".join(r.url for r in plan.replicas)
            return (
                f"promotion of {what} failed and could not be reverted to {result.stable} "
                f"({', '.join(s.describe() for s in result.after_revert)}): {'; '.join(result.problems)}; "
                f"once S3 and every replica answer, run `tritonship reconcile -r {plan.repo.uri} -m {plan.model} "
                f"--replicas {urls}`"
            )
        if stop is Stop.SIGNAL:
            return f"the promotion of {what} was {reason}; every replica was reverted to {result.stable}."
        if stop is Stop.CANARY:
            return reverted_by_canary(result)
        return (
            f"promotion of {what} failed and every replica was reverted to {result.stable}: "
            f"{'; '.join(result.problems)}"
        )
