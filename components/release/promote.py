"""Promote and reject steps.

Promote (only on a `pass` verdict):
1. copy the staged candidate into the production folder server-side (manifest re-verified);
2. write the new desired state: config.pbtxt pinned to the new version, replaced atomically only if
   it is still the config this promotion read (ETag);
3. reload the production replicas one at a time with that config through the load API, wait until
   the new version is ready, send a smoke inference (unversioned, as clients do) and check that the
   new version answered correctly; then the next replica;
4. if any replica fails: write the previous desired state back, reload every replica to it, fail;
5. unload the candidate from the gate server.

With a canary (components/release/canary.py) the first replicas are compared with the others on live
traffic while all still serve the stable version, then switched before step 2 and measured against them
again; the desired state changes only once the canary passes, so a pod restarting during the bake comes
up on the stable version. A canary that fails reverts the switched replicas.

An ensemble release (components/model/ensemble.py) does the same for its members and the ensemble together:
members' version N is loaded beside the old one, the ensemble is reloaded pinned to N in one step,
then the old members are unloaded; the members' desired configs keep both versions until every
replica runs the new ensemble, so a pod restarting meanwhile always finds the members its config runs.

Triton swaps a model's versions without failing requests when it is reloaded with a config override
(docs/design.md section 3): the old version serves until the new one is ready.

Reject: unload the candidate from the gate, leave production untouched, record the verdict.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from components import log
from components.errors import TritonshipError
from components.model import ensemble, model_config
from components.model.parity import parity_table
from components.release.canary import CanaryFailed, Watch, bake, canary_count, decide
from components.release.canary_settings import CanarySettings
from components.release.results import CanaryResult, PromoteResult, ReplicaOutcome
from components.release.stage import CandidateVersion, read_candidate, served_accuracy
from components.repository import ModelRepository, candidate_name, lease_owner
from components.s3 import S3Error, S3Settings
from components.serving.replicas import Replica
from components.serving.triton_admin import TritonAdmin
from components.settings import DEFAULT_LOAD_TIMEOUT_S

LOG = log.get("promote")
Progress = Callable[[str, Replica], None]


class PromotionError(TritonshipError):
    """The promotion failed and every replica was brought back to the previous version."""

    exit_code = 1

    def __init__(self, message: str, result: PromoteResult | None = None) -> None:
        super().__init__(message)
        self.result = result


class CanaryRejected(PromotionError):
    """The canary failed on live traffic (or stayed undecided) and every replica is back on the stable version."""


class PartialRevert(PromotionError):
    """The promotion failed and at least one replica could not be brought back: run the reconcile it names."""

    exit_code = 4


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


def _switch(admin: TritonAdmin, release: Release) -> float:
    """Reload one replica to the new version, check an unversioned answer comes from it and is right.
    An ensemble: new members beside the old, then the ensemble pinned to them in one reload, then the old
    members out; no request runs a mix. Returns the seconds Triton took to load."""
    candidate, version = release.candidate, release.candidate.version
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
    return load_seconds


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
    repo.acquire_lease(model, owner)  # renews our lease; refuses if another release holds the model
    try:
        return _promote(repo, model, version, replicas, gate_url, settings, run_id, progress, load_timeout, canary)
    finally:
        try:
            repo.release_lease(model, owner)
        except S3Error as exc:  # never hide the promotion's own outcome; the lease expires by itself
            log.event(LOG, "lease not released", model=model, reason=str(exc), level=30)


def _promote(
    repo: ModelRepository,
    model: str,
    version: int,
    replicas: list[Replica],
    gate_url: str | None,
    settings: model_config.ServingSettings | None,
    run_id: str,
    progress: Progress | None,
    load_timeout: float,
    canary: CanarySettings | None,
) -> PromoteResult:
    candidate = read_candidate(repo, model, version)
    previous, etag = repo.desired_config(model)
    previous_version = previous.version_policy.specific.versions[0] if previous else None
    admins = [TritonAdmin(r.url, load_timeout=load_timeout) for r in replicas]
    for admin in admins:
        admin.ensure_live()  # before anything changes: an unreachable replica stops the promotion here

    for name in [*candidate.members, model]:
        repo.copy_to_production(name, version)
    configs = candidate.production_configs()
    config = configs.pop(model)
    if settings is not None and candidate.members:
        config, configs = ensemble.with_serving_settings(config, configs, settings)
    elif settings is not None:
        config = model_config.with_settings(config, settings)
    old_members = ensemble.pinned_member_version(previous) if previous and candidate.members else None
    release = Release(candidate, config, configs, old_members)
    result = PromoteResult(model, version, previous_version, [r.url for r in replicas], promoted=False)
    first, skipped = canary_count(canary, replicas, previous_version)
    if skipped:
        result.canary = CanaryResult(model, version, previous_version, "skipped", [skipped])
        log.event(LOG, "canary skipped", model=model, reason=skipped, level=30)
    member_state: dict[str, tuple[model_config.ModelConfig | None, str | None]] = {}
    member_etags: dict[str, str] = {}
    new_etag: str | None = None  # set once the desired state names the new version
    switched: list[int] = []  # indexes of the replicas that serve the new version

    def switch(indexes: range) -> None:
        for i in indexes:
            result.load_seconds.append(_switch_one(repo, replicas[i], admins[i], release, progress))
            switched.append(i)

    try:
        if first:
            assert canary is not None and previous_version is not None
            watch = Watch(model, version, previous_version, dict.fromkeys(configs, (version, old_members)))
            result.canary = bake(
                watch,
                replicas[:first],
                replicas[first:],
                canary,
                lambda: switch(range(first)),
                lambda what: progress(what, replicas[0]) if progress else None,
            )
            decide(result.canary, canary)
        # Desired state for pods that restart meanwhile: members keep the old version beside the new one
        # until every replica runs the new ensemble, so any ensemble config finds its members.
        member_state = {name: repo.desired_config(name) for name in configs}
        member_etags = {
            m.name: repo.write_desired_config(m.name, m, member_state[m.name][1]) for m in release.members_beside_old()
        }
        new_etag = repo.write_desired_config(model, config, etag)
        switch(range(len(switched), len(replicas)))  # an inconclusive canary may go on before any switch
    except TritonshipError as exc:
        result.problems.append(str(exc))
        _revert(repo, release, admins, previous, new_etag, member_state, member_etags, result)
        try:
            repo.record(
                model,
                "reverted",
                version,
                run_id,
                previous_version=previous_version,
                complete=result.reverted,
                replicas=[asdict(state) for state in result.after_revert],
                problems=result.problems,
                canary=result.canary.to_dict() if result.canary else None,
            )
        except S3Error as record_error:
            result.problems.append(f"the history event could not be written ({record_error})")
        stable = f"v{previous_version}" if previous_version else "no version"
        if result.reverted and isinstance(exc, CanaryFailed):
            raise CanaryRejected(f"{exc} Every replica was reverted to {stable}.", result) from None
        if result.reverted:
            raise PromotionError(
                f"promotion of {model} v{version} failed and every replica was reverted to {stable}: "
                f"{'; '.join(result.problems)}",
                result,
            ) from None
        raise PartialRevert(
            f"promotion of {model} v{version} failed and could not be reverted to {stable} "
            f"({', '.join(s.describe() for s in result.after_revert)}): {'; '.join(result.problems)}; "
            "once S3 and every replica answer, run "
            f"`tritonship reconcile -r {repo.uri} -m {model} --replicas {','.join(r.url for r in replicas)}`",
            result,
        ) from None
    finally:
        for admin in admins:
            admin.close()
    result.promoted = True
    try:
        for name, member_config in configs.items():  # every replica runs the new members only now
            repo.write_desired_config(name, member_config, member_etags[name])
        repo.record(
            model,
            "promoted",
            version,
            run_id,
            previous_version=previous_version,
            replicas=result.replicas,
            members=dict.fromkeys(configs, version),
            canary=result.canary.to_dict() if result.canary else None,
        )
    except S3Error as exc:
        raise PromotionError(
            f"{model} v{version} is promoted (every replica serves it and S3 names it) but the last write to S3 "
            f"(history{' or member configs' if configs else ''}) failed ({exc}); re-run this promote step to finish it."
        ) from None
    if gate_url:
        unload_candidate(gate_url, model)
    log.event(LOG, "promoted", model=model, version=version, previous=previous_version, replicas=len(replicas))
    return result


def _switch_one(
    repo: ModelRepository, replica: Replica, admin: TritonAdmin, release: Release, progress: Progress | None
) -> float:
    if progress:
        progress("switching", replica)
    # Triton holds a model's requests while a load of it polls an unreachable S3 (about 25 s),
    # so S3 is checked just before each load: an outage then stops the promotion, not the clients.
    repo.manifest(release.candidate.model, release.candidate.version, staged=False)
    seconds = _switch(admin, release)
    log.event(LOG, "replica switched", replica=replica.name, version=release.candidate.version)
    if progress:
        progress("switched", replica)
    return seconds


def _revert(
    repo: ModelRepository,
    release: Release,
    admins: list[TritonAdmin],
    previous: model_config.ModelConfig | None,
    new_etag: str | None,
    member_state: dict[str, tuple[model_config.ModelConfig | None, str | None]],
    member_etags: dict[str, str],
    result: PromoteResult,
) -> None:
    """Desired state first (so restarted pods come up right), then every replica not already back on stable.

    Without S3 neither can be done (a Triton load would fail after holding requests): the replicas are
    left as they are. `result.reverted` is true only when S3 and every replica, asked afterwards, are back."""
    candidate = release.candidate
    model = candidate.model
    stable_versions = previous.version_policy.specific.versions if previous else []
    try:
        if new_etag is not None:  # a canary that failed left the desired state as it was
            _write_or_delete(repo, model, previous, new_etag)
            for name, (member_previous, _etag) in member_state.items():
                _write_or_delete(repo, name, member_previous, member_etags[name])
    except S3Error as exc:
        result.after_revert = [_state(admin, model, candidate.version, stable_versions) for admin in admins]
        result.problems.append(
            f"S3 could not be written to revert the desired state, which still names v{candidate.version} ({exc}); "
            "the replicas were left as they are"
        )
        log.event(LOG, "not reverted", model=model, version=candidate.version, level=40)
        return  # result.reverted stays False: S3 still names the candidate
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
            result.problems.append(f"revert of {admin.url}: {exc}")
    result.after_revert = [_state(admin, model, candidate.version, stable_versions) for admin in admins]
    result.reverted = all(state.reverted for state in result.after_revert)
    log.event(
        LOG,
        "reverted" if result.reverted else "partly reverted",
        model=model,
        version=candidate.version,
        level=30 if result.reverted else 40,
    )


def _state(admin: TritonAdmin, model: str, candidate: int, stable: list[int]) -> ReplicaOutcome:
    try:
        serving = [v for v in (candidate, *stable) if admin.is_ready(model, v)]
    except TritonshipError:
        return ReplicaOutcome(admin.url, None, False)
    return ReplicaOutcome(admin.url, serving, candidate not in serving and all(v in serving for v in stable))


def _write_or_delete(repo: ModelRepository, model: str, config: model_config.ModelConfig | None, etag: str) -> None:
    if config is not None:
        repo.write_desired_config(model, config, etag)
    else:
        repo.delete_desired_config(model)


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
