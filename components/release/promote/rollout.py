"""What promote does to one replica: switch it to the new version (and check its answers), or put it back on
the stable one. components/release/promote/promote.py's Promotion runs these in its phases (`Fleet`).

An ensemble switches with its members: members' version N is loaded beside the old one, the ensemble is
reloaded pinned to N in one step, then the old members are unloaded, so no request runs a mix. Triton swaps a
model's versions without failing requests when it is reloaded with a config override (docs/design.md
section 3): the old version serves until the new one is ready."""

from __future__ import annotations

import time
from dataclasses import dataclass

from components import log
from components.errors import TritonshipError
from components.model import model_config
from components.model.parity import parity_table
from components.release.promote.records import PromoteResult, ReplicaOutcome
from components.release.stage import CandidateVersion, served_accuracy
from components.repository import ModelRepository
from components.s3 import S3Error
from components.serving.replicas import Replica
from components.serving.triton_admin import TritonAdmin

LOG = log.get("promote")


class PromotionError(TritonshipError):
    """The promotion failed and every replica was brought back to the previous version."""

    exit_code = 1

    def __init__(self, message: str, result: PromoteResult | None = None) -> None:
        super().__init__(message)
        self.result = result


@dataclass
class Release:
    """What one promotion loads: the entry point's config and, for an ensemble, its members' configs
    (pinned to the new version alone, and beside the old one while the ensemble switches)."""

    candidate: CandidateVersion
    config: model_config.ModelConfig
    members: dict[str, model_config.ModelConfig]
    old_members: int | None  # the member version the previous ensemble runs

    def members_beside_old(self) -> list[model_config.ModelConfig]:
        old = [self.old_members] if self.old_members is not None else []
        return [model_config.pin_version(c, *old, self.candidate.version) for c in self.members.values()]

    def members_old_only(self) -> list[model_config.ModelConfig]:
        return (
            [model_config.pin_version(c, self.old_members) for c in self.members.values()] if self.old_members else []
        )


class Fleet:
    """The production replicas a promotion switches, through Triton's admin API; a context that closes them."""

    def __init__(self, replicas: list[Replica], load_timeout: float) -> None:
        self.replicas = replicas
        self.admins = [TritonAdmin(r.url, load_timeout=load_timeout) for r in replicas]

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *_exc: object) -> None:
        for admin in self.admins:
            admin.close()

    def ensure_live(self) -> None:
        """Before anything changes: an unreachable replica stops the promotion here."""
        for admin in self.admins:
            admin.ensure_live()

    def switch(self, repo: ModelRepository, index: int, release: Release) -> float:
        return switch_replica(repo, self.replicas[index], self.admins[index], release)

    def revert(
        self,
        repo: ModelRepository,
        release: Release,
        previous: model_config.ModelConfig | None,
        desired_etags: dict[str, str],
        member_previous: dict[str, model_config.ModelConfig | None],
    ) -> tuple[list[ReplicaOutcome], list[str]]:
        return revert(repo, release, self.admins, previous, desired_etags, member_previous)


def switch_replica(repo: ModelRepository, replica: Replica, admin: TritonAdmin, release: Release) -> float:
    """Reload one replica to the new version, check an unversioned answer comes from it and is right.
    Returns the seconds Triton took to load."""
    candidate, version = release.candidate, release.candidate.version
    # Triton holds a model's requests while a load of it polls an unreachable S3 (about 25 s),
    # so S3 is checked just before each load: an outage then stops the promotion, not the clients.
    repo.manifest(candidate.model, version, staged=False)
    started = time.monotonic()
    for member in release.members_beside_old():
        admin.load(member.name, member)
        admin.wait_ready(member.name, version)
    admin.load(candidate.model, release.config)
    admin.wait_ready(candidate.model, version)
    load_seconds = time.monotonic() - started
    for member in release.members.values():
        admin.load(member.name, member)
    first = {k: v[:1] for k, v in candidate.golden_inputs.items()}
    served, _ = admin.served(candidate.model, first, candidate.output_names, after_load=True)
    if served != version:
        raise PromotionError(f"{admin.url} answered an unversioned request with v{served}, expected v{version}.")
    accuracy = served_accuracy(admin, candidate.model, candidate, version, release.config.max_batch_size)
    if not all(r.passed for r in accuracy):
        raise PromotionError(f"{admin.url} serves v{version} with wrong answers:\n{parity_table(accuracy)}")
    log.event(LOG, "replica switched", replica=replica.name, version=version)
    return load_seconds


def revert(
    repo: ModelRepository,
    release: Release,
    admins: list[TritonAdmin],
    previous: model_config.ModelConfig | None,
    desired_etags: dict[str, str],
    member_previous: dict[str, model_config.ModelConfig | None],
) -> tuple[list[ReplicaOutcome], list[str]]:
    """Desired state first (so restarted pods come up right), then every replica not already back on stable.
    `desired_etags`: the desired configs this promotion wrote (model and members), to put back.

    Without S3 neither can be done (a Triton load would fail after holding requests): the replicas are left as
    they are. Returns what each replica serves afterwards and the problems met."""
    candidate = release.candidate
    model = candidate.model
    stable_versions = previous.version_policy.specific.versions if previous else []
    problems: list[str] = []
    try:
        for name, etag in desired_etags.items():
            earlier = previous if name == model else member_previous.get(name)
            if earlier is not None:
                repo.write_desired_config(name, earlier, etag)
            else:
                repo.delete_desired_config(name)
    except S3Error as exc:
        problems.append(
            f"S3 could not be written to revert the desired state, which still names v{candidate.version} ({exc}); "
            "the replicas were left as they are"
        )
        log.event(LOG, "not reverted", model=model, version=candidate.version, level=40)
        return [replica_state(a, model, candidate.version, stable_versions) for a in admins], problems
    for admin in admins:
        try:
            if previous is None:
                admin.unload_with_members(model)
                continue
            stable = previous.version_policy.specific.versions[0]
            if admin.is_ready(model, stable) and not admin.is_ready(model, candidate.version):
                continue  # never switched, or its load failed and Triton kept the stable version
            for member in release.members_beside_old():
                admin.load(member.name, member)
            admin.load(model, previous)
            admin.wait_ready(model, stable)
            for member in release.members_old_only():
                admin.load(member.name, member)
        except TritonshipError as exc:
            problems.append(f"revert of {admin.url}: {exc}")
    return [replica_state(a, model, candidate.version, stable_versions) for a in admins], problems


def replica_state(admin: TritonAdmin, model: str, candidate: int, stable: list[int]) -> ReplicaOutcome:
    try:
        serving = [v for v in (candidate, *stable) if admin.is_ready(model, v)]
    except TritonshipError:
        return ReplicaOutcome(admin.url, None, False)
    return ReplicaOutcome(admin.url, serving, candidate not in serving and all(v in serving for v in stable))
