"""Reconcile: make every production replica serve the desired state in S3 (for an operator after an
incident: a replica restarted without --load-model, a promotion interrupted half-way, a manual load).

An ensemble's desired state includes its members': they are checked and loaded before it, since its
steps are pinned to member versions that must be loaded for the ensemble to load."""

from __future__ import annotations

from dataclasses import dataclass

from components import log
from components.errors import TritonshipError
from components.model.ensemble import member_names
from components.model.model_config import ModelConfig
from components.repository import ModelRepository
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
    action: str  # "in sync", "loaded", "would load", or what went wrong

    @property
    def ok(self) -> bool:
        return self.action in ("in sync", "loaded")


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
) -> list[ReplicaState]:
    desired = desired_states(ModelRepository(repository, s3), models)
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
