"""Reconcile: make every production replica serve the desired state in S3 (for an operator after an
incident: a replica restarted without --load-model, a promotion interrupted half-way, a manual load)."""

from __future__ import annotations

from dataclasses import dataclass

from components import log
from components.errors import TritonshipError
from components.replicas import Replica
from components.repository import ModelRepository
from components.s3repo import S3Settings
from components.triton_admin import TritonAdmin

LOG = log.get("reconcile")


@dataclass(frozen=True)
class ReplicaState:
    replica: str
    model: str
    desired: int
    serving: tuple[int, ...]  # ready versions before reconciling
    action: str  # "in sync", "loaded", "would load", or what went wrong

    @property
    def ok(self) -> bool:
        return self.action in ("in sync", "loaded")


def reconcile(
    repository: str,
    replicas: list[Replica],
    models: list[str] | None = None,
    dry_run: bool = False,
    s3: S3Settings | None = None,
) -> list[ReplicaState]:
    repo = ModelRepository(repository, s3)
    desired = {}
    for model in models or repo.models():
        config, _ = repo.desired_config(model)
        if config is not None:
            desired[model] = config
        elif models:
            raise TritonshipError(f"'{model}' has no desired state in {repo.production_uri()} (never promoted).")
    states = []
    for replica in replicas:
        with TritonAdmin(replica.url, retries=1) as admin:
            for model, config in sorted(desired.items()):
                want = config.version_policy.specific.versions[0]
                try:
                    serving = tuple(admin.ready_versions(model))
                except TritonshipError as exc:
                    states.append(ReplicaState(replica.name, model, want, (), f"unreachable: {exc}"))
                    continue
                if serving == (want,):
                    action = "in sync"
                elif dry_run:
                    action = "would load"
                else:
                    try:
                        admin.load(model, config)
                        admin.wait_ready(model, want)
                        action = "loaded"
                    except TritonshipError as exc:
                        action = f"failed: {exc}"
                log.event(
                    LOG, "replica", replica=replica.name, model=model, desired=want, serving=serving, action=action
                )
                states.append(ReplicaState(replica.name, model, want, serving, action))
    return states
