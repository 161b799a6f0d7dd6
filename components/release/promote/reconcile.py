"""Reconcile: make every production replica serve the desired state in S3 (for an operator after an
incident: a replica restarted without --load-model, a promotion killed half-way, a manual load).

An ensemble's desired state includes its members': they are checked and loaded before it, since its
steps are pinned to member versions that must be loaded for the ensemble to load.

A promotion that did not finish (killed, or failed where a replica could not be put back) leaves its
in-progress record (components/repository/promotions.py). Reconcile settles it by what the desired state names:
the stable version (killed while copying or in the canary, or reverted in S3 before a replica failed), so every
replica goes back to it and the history records the revert; or the new version (killed while rolling or
finishing), so every replica goes on to it, an ensemble's members drop their old version, and the history
records the promotion. Either way the record is deleted and the run's release lease given back. The pipeline's
exit handler does the same for its own run."""

from __future__ import annotations

from dataclasses import dataclass

from components import log
from components.errors import TritonshipError
from components.model.ensemble import member_names
from components.model.model_config import ModelConfig, pin_version
from components.release.promote.records import PromotionRecord
from components.repository import ModelRepository, lease_owner
from components.s3 import S3Settings
from components.serving.replicas import Replica
from components.serving.triton_admin import TritonAdmin

LOG = log.get("reconcile")


@dataclass(frozen=True)
class ReplicaState:
    replica: str
    model: str
    desired: tuple[int, ...]
    serving: tuple[int, ...]  # ready versions before reconciling
    action: str  # "in sync", "loaded", "would load", "settled: …" (a killed promotion), or what went wrong

    @property
    def ok(self) -> bool:
        return self.action in ("in sync", "loaded") or self.action.startswith("settled:")


def desired_states(repo: ModelRepository, models: list[str] | None = None) -> dict[str, ModelConfig]:
    """The desired config of each model (all promoted models by default), an ensemble's members placed
    before it."""
    desired: dict[str, ModelConfig] = {}
    for model in models or repo.models():
        config, _ = repo.desired_config(model)
        if config is None:
            if models:
                raise TritonshipError(f"'{model}' has no desired state in {repo.production_uri()} (never promoted).")
            continue
        for member in member_names(config):
            if member not in desired:
                member_config, _ = repo.desired_config(member)
                if member_config is None:
                    raise TritonshipError(
                        f"the ensemble '{model}' uses '{member}', which has no desired state in "
                        f"{repo.production_uri()}; re-run the ensemble's promotion."
                    )
                desired[member] = member_config
        desired.setdefault(model, config)
    return desired


def reconcile(
    repository: str,
    replicas: list[Replica],
    models: list[str] | None = None,
    dry_run: bool = False,
    s3: S3Settings | None = None,
    run_id: str | None = None,
) -> list[ReplicaState]:
    """Bring every replica to the desired state, and settle the promotions that were killed (only `run_id`'s,
    when given: the pipeline's exit handler)."""
    repo = ModelRepository(repository, s3)
    found = [PromotionRecord.read(repo, model) for model in models or repo.promotion_models()]
    killed = [r for r in found if r is not None and (run_id is None or r.run_id == run_id)]
    never_promoted = {r.model for r in killed if repo.desired_config(r.model)[0] is None}
    wanted = [m for m in models if m not in never_promoted] if models else None
    desired = desired_states(repo, wanted) if wanted != [] else {}
    states = _sync(replicas, desired, dry_run)
    if dry_run:
        return states
    for record in killed:
        model, members = record.model, _members(desired.get(record.model))
        if not all(s.ok for s in states if s.model in (model, *members)):
            continue  # a replica did not come right: the record stays for the next reconcile
        goes_on = _names(desired.get(model), record.version)
        if goes_on and members:
            finished = {m: pin_version(desired[m], record.version) for m in members}
            for member, config in finished.items():
                repo.write_desired_config(member, config, repo.desired_config(member)[1])
            states += _sync(replicas, finished, dry_run)
        states.append(_settle(repo, record, goes_on))
    return states


def _names(config: ModelConfig | None, version: int) -> bool:
    """Whether the desired state serves `version`: what settles an unfinished promotion, whatever its phase (a
    failed one may have written the stable version back before a replica stopped its revert)."""
    return config is not None and version in config.version_policy.specific.versions


def _members(config: ModelConfig | None) -> list[str]:
    return member_names(config) if config is not None else []


def _settle(repo: ModelRepository, record: PromotionRecord, goes_on: bool) -> ReplicaState:
    model, version, phase, previous = record.model, record.version, record.phase, record.previous_version
    reverted = not goes_on
    said = f"the promotion of v{version} stopped in its {phase} phase and never finished; " + (
        f"reconcile put every replica back on {f'v{previous}' if previous else 'no version'}"
        if reverted
        else f"the desired state already named v{version}, so reconcile finished it"
    )
    repo.record(
        model,
        "reverted" if reverted else "promoted",
        version,
        record.run_id,
        previous_version=previous,
        phase=phase.value,
        settled_by="reconcile",
        problems=[said],
    )
    repo.clear_promotion(model)
    repo.release_lease(model, lease_owner(record.run_id, model, version))
    log.event(LOG, "promotion settled", model=model, version=version, phase=phase, reverted=reverted)
    action = f"settled: the unfinished promotion of v{version} (stopped in its {phase} phase) was " + (
        "reverted" if reverted else "finished"
    )
    return ReplicaState("(history)", model, (), (), action)


def _sync(replicas: list[Replica], desired: dict[str, ModelConfig], dry_run: bool) -> list[ReplicaState]:
    states = []
    for replica in replicas:
        with TritonAdmin(replica.url, retries=1) as admin:
            for model, config in desired.items():
                want = tuple(sorted(config.version_policy.specific.versions))
                try:
                    serving = tuple(admin.ready_versions(model))
                except TritonshipError as exc:
                    states.append(ReplicaState(replica.name, model, want, (), f"unreachable: {exc}"))
                    continue
                if serving == want:
                    action = "in sync"
                elif dry_run:
                    action = "would load"
                else:
                    try:
                        admin.load(model, config)
                        for version in want:
                            admin.wait_ready(model, version)
                        action = "loaded"
                    except TritonshipError as exc:
                        action = f"failed: {exc}"
                log.event(
                    LOG, "replica", replica=replica.name, model=model, desired=want, serving=serving, action=action
                )
                states.append(ReplicaState(replica.name, model, want, serving, action))
    return states
