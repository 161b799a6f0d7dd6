"""Promote and reject steps.

Promote (only on a `pass` verdict) holds the model's release lease and runs a `Promotion` through its phases (copy,
canary, roll, finish: components/release/promote/promotion.py, which documents its states). It returns the result when
the version is promoted, or when the canary reverted it, a normal outcome (`result.outcome`); it raises a
PromotionError when a failure reverted it, PromotionCancelled when SIGTERM or SIGINT did, and PartialRevert when a
revert left a replica behind. Promoted, the candidate leaves the gate server.

Reject: unload the candidate from the gate, leave production untouched, record the verdict.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from components import log
from components.errors import TritonshipError
from components.model import model_config
from components.release.promote.cancel import Cancelled, cancellable, shielded
from components.release.promote.promotion import Plan, Progress, Promotion, Stop
from components.release.promote.records import Outcome, PromoteResult
from components.release.promote.rollout import Fleet, PromotionError
from components.release.promote.settings import PromoteSettings
from components.release.run_context import RunContext
from components.repository import ModelRepository, candidate_name
from components.s3 import S3Error
from components.serving.replicas import Replica
from components.serving.triton_admin import TritonAdmin

LOG = log.get("promote")

__all__ = ["PartialRevert", "PromotionCancelled", "PromotionError", "promote", "reject"]


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
        plan = Plan.read(repo, context, replicas, serving, chosen.canary)
        with Fleet(replicas, chosen.load_timeout_s) as fleet:
            ending = Promotion(plan, fleet, progress=progress).run()
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
