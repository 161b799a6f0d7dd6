"""A promotion as a state machine: its phases, what moves it from one to the next, and how it ends.

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
(components/release/promote/reconcile.py). `Promotion.run` returns how it ended, never raising for an outcome;
components/release/promote/promote.py says which endings are errors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Protocol

from components import log
from components.errors import TritonshipError
from components.model import ensemble, model_config
from components.release.promote.canary import Canary, Watch, decide, why_reverted
from components.release.promote.cancel import Cancelled, raise_pending, shielded
from components.release.promote.records import CanaryResult, Phase, PromoteResult, PromotionRecord
from components.release.promote.rollout import Fleet, Release
from components.release.promote.settings import CanarySettings
from components.release.run_context import RunContext
from components.release.stage import CandidateVersion, read_candidate
from components.repository import ModelRepository
from components.s3 import S3Error
from components.serving.live_metrics import MetricsUnavailable, scrape
from components.serving.replicas import Replica

LOG = log.get("promote")


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


class Stop(StrEnum):
    """What made a promotion revert, or left it unrecorded."""

    CANARY = "canary"  # its decision: a revert that is an outcome, not an error
    FAILURE = "failure"
    SIGNAL = "signal"


@dataclass(frozen=True)
class Ending:
    """How a promotion ended: its result (`result.outcome`), what stopped it (None: nothing) and what to tell."""

    result: PromoteResult
    stopped_by: Stop | None = None
    said: str = ""


@dataclass(frozen=True)
class Plan:
    """What a promotion is asked to do, read from S3 once before it starts."""

    repo: ModelRepository
    candidate: CandidateVersion
    replicas: list[Replica]
    previous: model_config.ModelConfig | None  # the desired state it replaces; None before a first release
    etag: str | None  # the roll replaces that desired state only if no one else did meanwhile
    run_id: str = ""
    serving: model_config.ServingSettings | None = None
    canary: CanarySettings | None = None  # None: no canary

    @classmethod
    def read(
        cls,
        repo: ModelRepository,
        context: RunContext,
        replicas: list[Replica],
        serving: model_config.ServingSettings | None = None,
        canary: CanarySettings | None = None,
    ) -> Plan:
        """The context's candidate and the desired state it replaces, from `repo` (the context's, opened once)."""
        previous, etag = repo.desired_config(context.model)
        candidate = read_candidate(repo, context.model, context.version)
        return cls(repo, candidate, replicas, previous, etag, context.run_id, serving, canary)

    @property
    def model(self) -> str:
        return self.candidate.model

    @property
    def version(self) -> int:
        return self.candidate.version

    @property
    def previous_version(self) -> int | None:
        return self.previous.version_policy.specific.versions[0] if self.previous else None

    def canary_replicas(self) -> tuple[int, str]:
        """How many replicas the canary switches first (0: none), and why a canary that was asked for cannot run."""
        if self.canary is None or not self.canary.enabled:
            return 0, ""
        if self.previous_version is None:
            return 0, "a first release: no stable version serves live traffic to compare the canary with"
        if len(self.replicas) <= self.canary.replicas:
            return 0, (
                f"{len(self.replicas)} replica(s) and {self.canary.replicas} canary replica(s): none would stay on "
                "the stable version to compare with"
            )
        return self.canary.replicas, ""


@dataclass
class Changes:
    """What a promotion changed after its copy, which a revert undoes."""

    release: Release
    switched: int = 0  # the first `switched` replicas serve the new version
    desired_etags: dict[str, str] = field(default_factory=dict)  # the desired configs written, to put back
    member_previous: dict[str, model_config.ModelConfig | None] = field(default_factory=dict)


class Promotion:
    """One promotion through its phases (the module's diagram); `run` once."""

    def __init__(self, plan: Plan, fleet: Fleet, canary: CanaryFactory = Canary, progress: Progress | None = None):
        self.plan, self.fleet, self.new_canary, self.progress = plan, fleet, canary, progress
        self.phase = Phase.COPY
        urls = [r.url for r in plan.replicas]
        self.result = PromoteResult(plan.model, plan.version, plan.previous_version, urls, promoted=False)

    def run(self) -> Ending:
        plan, changes = self.plan, None
        self.fleet.ensure_live()
        try:
            self._enter(Phase.COPY)
            changes = Changes(self._copy())
            first, skipped = plan.canary_replicas()
            if skipped:
                self.result.canary = CanaryResult(plan.model, plan.version, plan.previous_version, "skipped", [skipped])
                log.event(LOG, "canary skipped", model=plan.model, reason=skipped, level=30)
            goes_on = True
            if first and plan.canary is not None and plan.previous_version is not None:
                self._enter(Phase.CANARY)
                canary = self._canary(changes, first, plan.canary, plan.previous_version)
                goes_on = decide(canary, plan.canary)
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
        if _histograms_everywhere(plan.replicas):
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


def reverted_by_canary(result: PromoteResult) -> str:
    """What a person reads when the canary reverted a promotion: its decision (the first problem) and the version
    every replica serves again."""
    return f"{result.problems[0]} Every replica was reverted to {result.stable}."


def _histograms_everywhere(replicas: list[Replica]) -> bool:
    """Whether every replica exports latency histograms (Triton 26.01 and later with histogram_latencies=true):
    only then may a config carry its buckets, which an older Triton refuses."""
    try:
        return all(r.metrics_url and scrape(r.metrics_url).has_histograms for r in replicas)
    except MetricsUnavailable:
        return False
