"""Promote and reject steps.

Promote (only on a `pass` verdict) runs in four phases, each recorded in S3 before it starts
(root/promotions/<model>.json, components/repository/promotions.py):
1. **copy**: the staged candidate is copied into the production folder server-side (manifest re-verified);
2. **canary** (components/release/canary.py): the first replicas are compared with the others on live traffic
   while all serve the stable version, then switched and measured against them again. The desired state still
   names the stable version, so a pod restarting meanwhile comes up on it;
3. **roll**: the new desired state is written (config.pbtxt pinned to the new version, replaced only if it is
   still the config this promotion read: ETag), then every replica not yet switched is reloaded with it, one
   at a time, each checked with a smoke inference (components/release/rollout.py);
4. **finish**: an ensemble's members' desired configs drop the old version, the history records the
   promotion, the record is deleted, and the candidate leaves the gate server.

Any failure, and SIGTERM or SIGINT in any phase (components/release/cancel.py), writes the previous desired
state back and reloads every replica to it; the history says why. A run killed outright (SIGKILL) leaves its
record, which `reconcile` and the pipeline's exit handler settle (components/release/reconcile.py).

Reject: unload the candidate from the gate, leave production untouched, record the verdict.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import NoReturn

from components import log
from components.errors import TritonshipError
from components.model import ensemble, model_config
from components.release.canary import CanaryFailed, Watch, bake, canary_count, decide
from components.release.canary_settings import CanarySettings
from components.release.cancel import Cancelled, cancellable, raise_pending, shielded
from components.release.results import CanaryResult, PromoteResult
from components.release.rollout import PromotionError, Release, revert, switch_replica
from components.release.stage import read_candidate
from components.repository import ModelRepository, candidate_name, lease_owner
from components.s3 import S3Error, S3Settings
from components.serving.live_metrics import MetricsUnavailable, scrape
from components.serving.replicas import Replica
from components.serving.triton_admin import TritonAdmin
from components.settings import DEFAULT_LOAD_TIMEOUT_S

LOG = log.get("promote")
Progress = Callable[[str, Replica], None]

__all__ = ["CanaryRejected", "PartialRevert", "PromotionCancelled", "PromotionError", "promote", "reject"]


class CanaryRejected(PromotionError):
    """The canary failed on live traffic (or stayed undecided) and every replica is back on the stable version."""


class PromotionCancelled(PromotionError):
    """SIGTERM or SIGINT stopped the promotion and every replica is back on the stable version."""

    exit_code = Cancelled.exit_code


class PartialRevert(PromotionError):
    """The promotion failed and at least one replica could not be brought back: run the reconcile it names."""

    exit_code = 4


def promote(
    repository: str,
    model: str,
    version: int,
    replicas: list[Replica],
    verdict: str,
    gate_url: str | None = None,
    settings: model_config.ServingSettings | None = None,
    s3: S3Settings | None = None,
    run_id: str = "",
    progress: Progress | None = None,
    load_timeout: float = DEFAULT_LOAD_TIMEOUT_S,
    canary: CanarySettings | None = None,
    quality: str | None = None,
) -> PromoteResult:
    """Promote a gated version; `canary` (off when None) measures the first replicas switched on live traffic.
    `quality`: the verdict's quality decision, when the release was checked on labelled data."""
    if verdict != "pass":
        raise PromotionError(f"the gate verdict is '{verdict}', not 'pass': nothing is promoted.")
    if quality is not None and quality != "pass":
        raise PromotionError(f"the quality check is '{quality}', not 'pass': nothing is promoted.")
    if not replicas:
        raise PromotionError("no production replicas were given; nothing would serve the new version.")
    repo = ModelRepository(repository, s3)
    owner = lease_owner(run_id, model, version)
    with cancellable():
        repo.acquire_lease(model, owner)  # renews our lease; refuses if another release holds the model
        try:
            promotion = Promotion(repo, model, version, replicas, run_id, progress, load_timeout, canary)
            result = promotion.run(settings)
        finally:
            with shielded():
                try:
                    repo.release_lease(model, owner)
                except S3Error as exc:  # never hide the promotion's own outcome; the lease expires by itself
                    log.event(LOG, "lease not released", model=model, reason=str(exc), level=30)
    if gate_url:
        unload_candidate(gate_url, model)
    return result


class Promotion:
    """One promotion's state through its phases; `run` returns the result or raises a PromotionError after
    putting every replica back on the stable version."""

    def __init__(
        self,
        repo: ModelRepository,
        model: str,
        version: int,
        replicas: list[Replica],
        run_id: str,
        progress: Progress | None,
        load_timeout: float,
        canary: CanarySettings | None,
    ) -> None:
        self.repo, self.model, self.version, self.replicas = repo, model, version, replicas
        self.run_id, self.progress, self.canary = run_id, progress, canary
        self.candidate = read_candidate(repo, model, version)
        self.previous, self.etag = repo.desired_config(model)
        self.previous_version = self.previous.version_policy.specific.versions[0] if self.previous else None
        self.admins = [TritonAdmin(r.url, load_timeout=load_timeout) for r in replicas]
        self.result = PromoteResult(model, version, self.previous_version, [r.url for r in replicas], promoted=False)
        self.phase = ""
        self.switched: list[int] = []  # indexes of the replicas that serve the new version
        self.desired_etags: dict[str, str] = {}  # desired configs this promotion wrote, to put back on a revert
        self.member_previous: dict[str, model_config.ModelConfig | None] = {}
        self.release: Release | None = None

    def run(self, settings: model_config.ServingSettings | None) -> PromoteResult:
        try:
            for admin in self.admins:
                admin.ensure_live()  # before anything changes: an unreachable replica stops the promotion here
            unrecorded = self._phases(settings)
        finally:
            for admin in self.admins:
                admin.close()
        self.result.promoted = True
        if unrecorded is not None:
            raise PromotionError(
                f"{self.model} v{self.version} is promoted (every replica serves it and S3 names it) but the last "
                f"write to S3 (history or member configs) failed ({unrecorded}); re-run this promote step to finish it."
            )
        log.event(LOG, "promoted", model=self.model, version=self.version, previous=self.previous_version)
        return self.result

    def _phases(self, settings: model_config.ServingSettings | None) -> S3Error | None:
        """Copy, canary, roll and finish; any failure or signal puts every replica back on the previous version."""
        try:
            self._enter("copy")
            self.release = self._copy(settings)
            first, skipped = canary_count(self.canary, self.replicas, self.previous_version)
            if skipped:
                self.result.canary = CanaryResult(self.model, self.version, self.previous_version, "skipped", [skipped])
                log.event(LOG, "canary skipped", model=self.model, reason=skipped, level=30)
            if first:
                self._enter("canary")
                self._bake(first)
            self._enter("roll")
            self._roll()
            self._enter("finish")
            return self._finish()
        except TritonshipError as exc:
            with shielded():
                self._fail(exc)

    def _enter(self, phase: str) -> None:
        raise_pending()
        self.phase = phase
        self.repo.write_promotion(
            self.model,
            {
                "run_id": self.run_id,
                "version": self.version,
                "previous_version": self.previous_version,
                "phase": phase,
                "replicas": [r.url for r in self.replicas],
            },
        )
        log.event(LOG, "phase", model=self.model, version=self.version, phase=phase)
        if self.progress:
            self.progress(f"{phase} phase", self.replicas[0])

    def _copy(self, settings: model_config.ServingSettings | None) -> Release:
        for name in [*self.candidate.members, self.model]:
            self.repo.copy_to_production(name, self.version)
        configs = self.candidate.production_configs()
        config = configs.pop(self.model)
        if settings is not None and self.candidate.members:
            config, configs = ensemble.with_serving_settings(config, configs, settings)
        elif settings is not None:
            config = model_config.with_settings(config, settings)
        if _histograms_everywhere(self.replicas):
            config = model_config.with_latency_buckets(config)  # the canary's p99 of each round, from now on
        old_members = (
            ensemble.pinned_member_version(self.previous) if self.previous and self.candidate.members else None
        )
        return Release(self.candidate, config, configs, old_members)

    def _bake(self, first: int) -> None:
        assert self.canary is not None and self.previous_version is not None and self.release is not None
        members = dict.fromkeys(self.release.members, (self.version, self.release.old_members))
        self.result.canary = bake(
            Watch(self.model, self.version, self.previous_version, members),
            self.replicas[:first],
            self.replicas[first:],
            self.canary,
            lambda: self._switch(range(first)),
            lambda what: self.progress(what, self.replicas[0]) if self.progress else None,
        )
        decide(self.result.canary, self.canary)

    def _roll(self) -> None:
        """The desired state for pods that restart meanwhile, then every replica not yet switched. An ensemble's
        members keep the old version beside the new one until every replica runs the new ensemble, so any
        ensemble config finds its members."""
        assert self.release is not None
        for member in self.release.members_beside_old():
            self.member_previous[member.name], etag = self.repo.desired_config(member.name)
            self.desired_etags[member.name] = self.repo.write_desired_config(member.name, member, etag)
        self.desired_etags[self.model] = self.repo.write_desired_config(self.model, self.release.config, self.etag)
        self._switch(range(len(self.switched), len(self.replicas)))  # an inconclusive canary may go on unswitched

    def _switch(self, indexes: range) -> None:
        assert self.release is not None
        for i in indexes:
            if self.progress:
                self.progress("switching", self.replicas[i])
            self.result.load_seconds.append(switch_replica(self.repo, self.replicas[i], self.admins[i], self.release))
            self.switched.append(i)
            raise_pending()
            if self.progress:
                self.progress("switched", self.replicas[i])

    def _finish(self) -> S3Error | None:
        """Every replica runs the new members only now. An S3 failure here leaves every replica on the new
        version and S3 naming it: returned, for `run` to say so (re-running promote records it)."""
        assert self.release is not None
        try:
            for name, member_config in self.release.members.items():
                self.desired_etags[name] = self.repo.write_desired_config(name, member_config, self.desired_etags[name])
            self.repo.record(
                self.model,
                "promoted",
                self.version,
                self.run_id,
                previous_version=self.previous_version,
                replicas=self.result.replicas,
                members=dict.fromkeys(self.release.members, self.version),
                canary=self.result.canary.to_dict() if self.result.canary else None,
            )
            self.repo.clear_promotion(self.model)
        except S3Error as exc:
            return exc
        return None

    def _fail(self, exc: TritonshipError) -> NoReturn:
        """Put every replica back on the stable version, record why, and raise the error that says so."""
        stopped = f"stopped by {exc.signal_name} in its {self.phase} phase" if isinstance(exc, Cancelled) else ""
        self.result.problems.append(stopped or str(exc))
        if self.release is not None:
            etags = dict(sorted(self.desired_etags.items(), key=lambda item: item[0] != self.model))  # model first
            self.result.after_revert, problems = revert(
                self.repo, self.release, self.admins, self.previous, etags, self.member_previous
            )
            self.result.problems += problems
            self.result.reverted = all(state.reverted for state in self.result.after_revert)
        else:  # stopped while copying: nothing was loaded or written anywhere a replica reads
            self.result.reverted = True
        log.event(LOG, "reverted" if self.result.reverted else "partly reverted", model=self.model, level=30)
        try:
            self.repo.record(
                self.model,
                "reverted",
                self.version,
                self.run_id,
                previous_version=self.previous_version,
                phase=self.phase,
                complete=self.result.reverted,
                replicas=[asdict(state) for state in self.result.after_revert],
                problems=self.result.problems,
                canary=self.result.canary.to_dict() if self.result.canary else None,
            )
            if self.result.reverted:
                self.repo.clear_promotion(self.model)
        except S3Error as record_error:
            self.result.problems.append(f"the history event could not be written ({record_error})")
        stable = f"v{self.previous_version}" if self.previous_version else "no version"
        what = f"{self.model} v{self.version}"
        if self.result.reverted and isinstance(exc, Cancelled):
            raise PromotionCancelled(
                f"the promotion of {what} was {stopped}; every replica was reverted to {stable}.", self.result
            ) from None
        if self.result.reverted and isinstance(exc, CanaryFailed):
            raise CanaryRejected(f"{exc} Every replica was reverted to {stable}.", self.result) from None
        if self.result.reverted:
            raise PromotionError(
                f"promotion of {what} failed and every replica was reverted to {stable}: "
                f"{'; '.join(self.result.problems)}",
                self.result,
            ) from None
        urls = ",".join(r.url for r in self.replicas)
        raise PartialRevert(
            f"promotion of {what} failed and could not be reverted to {stable} "
            f"({', '.join(s.describe() for s in self.result.after_revert)}): {'; '.join(self.result.problems)}; "
            f"once S3 and every replica answer, run `tritonship reconcile -r {self.repo.uri} -m {self.model} "
            f"--replicas {urls}`",
            self.result,
        ) from None


def _histograms_everywhere(replicas: list[Replica]) -> bool:
    """Whether every replica exports latency histograms (Triton 26.01 and later with histogram_latencies=true):
    only then may a config carry its buckets, which an older Triton refuses."""
    try:
        return all(r.metrics_url and scrape(r.metrics_url).has_histograms for r in replicas)
    except MetricsUnavailable:
        return False


def unload_candidate(gate_url: str, model: str) -> bool:
    """Unload `<model>__candidate` from the gate server; False if it was not loaded or the gate is gone."""
    name = candidate_name(model)
    with TritonAdmin(gate_url, timeout=10, retries=1) as gate:
        try:
            if not gate.is_ready(name):
                return False
            gate.unload_with_members(name)  # an ensemble's candidate members too
            return True
        except TritonshipError as exc:
            log.event(LOG, "candidate not unloaded", gate=gate_url, reason=str(exc), level=30)
            return False


def reject(
    repository: str,
    model: str,
    version: int,
    verdict: str,
    reasons: list[str],
    gate_url: str | None = None,
    s3: S3Settings | None = None,
    run_id: str = "",
) -> None:
    """Production is left as it is; the candidate leaves the gate; the rejection goes into the history."""
    repo = ModelRepository(repository, s3)
    unloaded = unload_candidate(gate_url, model) if gate_url else False
    repo.record(model, "rejected", version, run_id, verdict=verdict, reasons=reasons, candidate_unloaded=unloaded)
    repo.release_lease(model, lease_owner(run_id, model, version))
    log.event(LOG, "rejected", model=model, version=version, verdict=verdict)
