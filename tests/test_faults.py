"""Faults in the middle of a release, on a stack of its own whose S3 can be taken away (EmbeddedStack's
s3_switch): S3 lost during publish, promotion and history writes; a production Triton killed and
restarted during promotion; the gate server or perf_analyzer killed during the gate.

Each test checks the end state: nothing promoted that did not pass, the stable version served, the
desired state in S3 consistent with the replicas (or the printed command converges them), and a re-run
that completes.
"""

from __future__ import annotations

import dataclasses
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from components.release.gate.gate import gate
from components.release.promote.promote import PartialRevert, PromotionError, promote, reject
from components.release.promote.reconcile import reconcile
from components.release.publish import publish
from components.release.run_context import RunContext
from components.release.stage import stage
from components.repository import ModelRepository, candidate_name
from components.s3 import S3Error, S3Settings
from components.serving.replicas import Replica
from components.serving.triton_admin import TritonAdmin
from pipelines.live_traffic import LiveTraffic
from pipelines.processes import pid_alive
from pipelines.stack import EmbeddedStack
from tests.fault_helpers import FaultWhilePerfAnalyzerMeasures
from tests.models import mlp_folder
from tests.release_helpers import ABSOLUTE_GATE, NO_CANARY, install_stable, replicas, unique

X = {"x": np.ones((1, 16), np.float32)}


@pytest.fixture(scope="module")
def stack() -> Iterator[EmbeddedStack]:
    """This module's own stack (S3 behind a switch), so that its faults never touch the other tests."""
    with EmbeddedStack(replicas=2, gate=True, s3_switch=True) as running:
        yield running


@pytest.fixture
def impatient_s3(stack: EmbeddedStack) -> S3Settings:
    """The stack's S3 with 2 attempts instead of 5: an outage fails a step in a second, not in ten."""
    return dataclasses.replace(stack.s3, max_attempts=2)


def cut_s3_before_put(monkeypatch, stack: EmbeddedStack, when: Callable[[str], bool]) -> list[str]:
    """Take S3 away just before the first PutObject whose key satisfies `when` (boto3's own event hook
    on every client the steps create). Returns the keys put so far."""
    keys: list[str] = []
    original = S3Settings.client

    def on_put(params: dict, **_kwargs) -> None:
        keys.append(params["Key"])
        if not stack.s3_switch.is_cut and when(params["Key"]):
            stack.s3_switch.cut()

    def client(self: S3Settings):
        made = original(self)
        made.meta.events.register("before-parameter-build.s3.PutObject", on_put)
        return made

    monkeypatch.setattr(S3Settings, "client", client)
    return keys


def _served(stack: EmbeddedStack, name: str) -> list[int]:
    return [TritonAdmin(s.http_url).served_version(name, X, ["y"]) for s in stack.replicas]


def _repo(stack: EmbeddedStack) -> ModelRepository:
    return ModelRepository(f"s3://{stack.bucket}", stack.s3)


def _desired(stack: EmbeddedStack, name: str) -> int:
    return _repo(stack).desired_config(name)[0].version_policy.specific.versions[0]


def _events(stack: EmbeddedStack, name: str) -> list[tuple[str, int]]:
    return [(e["event"], e["version"]) for e in _repo(stack).history(name)]


def _published_and_gated(stack: EmbeddedStack, folder: Path, run_id: str) -> int:
    repository = f"s3://{stack.bucket}"
    version = publish(RunContext(repository, "", s3=stack.s3, run_id=run_id), folder=folder).version
    context = RunContext(repository, folder.name, version, stack.gate.replica, stack.s3, run_id)
    staged = stage(context)
    verdict = gate(context, ABSOLUTE_GATE, staged)
    assert verdict.verdict == "pass", verdict.reasons
    return version


def _mlp(tmp_path: Path, name: str, sub: str, seed: int = 0) -> Path:
    (tmp_path / sub).mkdir()
    return mlp_folder(tmp_path / sub, name, seed=seed)


# ------------------------------------------------------------------------------------------ S3 outages
def test_s3_lost_during_publish_leaves_nothing_visible_and_the_rerun_completes(
    tmp_path, stack, impatient_s3, monkeypatch
):
    name = unique()
    folder = _mlp(tmp_path, name, "v1")
    staged_files = []

    def second_file(key: str) -> bool:
        staged_files.extend([key] if "/staging/" in key or key.startswith("staging/") else [])
        return len(staged_files) == 2

    cut_s3_before_put(monkeypatch, stack, second_file)
    with pytest.raises(S3Error, match="S3 could not be reached"):
        publish(RunContext(f"s3://{stack.bucket}", "", s3=impatient_s3, run_id="run-publish"), folder=folder)
    stack.s3_switch.restore()
    monkeypatch.undo()

    repo = _repo(stack)
    assert repo.versions(name, staged=True) == []  # sealed versions only: the half-written one is invisible
    assert repo.allocation(name, 1) is not None and repo.manifest(name, 1, staged=True) is None
    assert _events(stack, name) == []
    again = publish(RunContext(f"s3://{stack.bucket}", "", s3=stack.s3, run_id="run-publish"), folder=folder)
    assert (again.version, again.resumed) == (1, True)
    assert repo.verify(name, 1, staged=True) == [] and repo.incomplete_versions(name) == []
    assert _events(stack, name) == [("published", 1)]


def test_s3_lost_at_the_publish_history_write_is_recorded_by_the_rerun(tmp_path, stack, impatient_s3, monkeypatch):
    name = unique()
    folder = _mlp(tmp_path, name, "v1")
    cut_s3_before_put(monkeypatch, stack, lambda key: key.endswith("-published.json"))
    with pytest.raises(S3Error, match="S3 could not be reached"):
        publish(RunContext(f"s3://{stack.bucket}", "", s3=impatient_s3, run_id="run-history"), folder=folder)
    stack.s3_switch.restore()
    monkeypatch.undo()

    assert _repo(stack).versions(name, staged=True) == [1]  # sealed before the history write
    assert _events(stack, name) == []
    again = publish(RunContext(f"s3://{stack.bucket}", "", s3=stack.s3, run_id="run-history"), folder=folder)
    assert (again.version, again.resumed) == (1, True)
    assert _events(stack, name) == [("published", 1)]


@pytest.mark.slow
def test_s3_lost_half_way_through_a_promotion_fails_no_request_and_reconcile_converges(tmp_path, stack, impatient_s3):
    name = unique()
    install_stable(stack, _mlp(tmp_path, name, "v1"))
    version = _published_and_gated(stack, _mlp(tmp_path, name, "v2", seed=4), "run-s3-promote")

    def s3_goes_away(what: str, replica) -> None:
        if what == "switched" and replica.name == "prod-0":  # the desired state names v2; prod-1 still serves v1
            stack.s3_switch.cut()

    with LiveTraffic([s.http_url for s in stack.replicas], name, X, ["y"]) as client:
        try:
            with pytest.raises(PartialRevert, match="failed and could not be reverted to v1") as info:
                context = RunContext(f"s3://{stack.bucket}", name, version, s3=impatient_s3, run_id="run-s3-promote")
                promote(context, NO_CANARY, replicas=replicas(stack), verdict="pass", progress=s3_goes_away)
            assert _served(stack, name) == [2, 1]  # no Triton load was tried without S3
        finally:
            stack.s3_switch.restore()
    assert client.failures == [], client.failures[:3]
    message = str(info.value)
    prod_0, prod_1 = (s.http_url for s in stack.replicas)
    assert f"{prod_0} serves v2, {prod_1} serves v1" in message
    assert f"tritonship reconcile -r s3://{stack.bucket} -m {name} --replicas {prod_0},{prod_1}" in message
    assert stack.s3.secret_access_key not in message
    assert info.value.exit_code == 4 and not info.value.result.reverted

    assert _desired(stack, name) == 2  # the state the message describes; the printed command converges it
    states = reconcile(f"s3://{stack.bucket}", replicas(stack), [name], s3=stack.s3)
    # the promotion died in its roll phase (the desired state names v2): reconcile finishes it and says so
    finished = "settled: the unfinished promotion of v2 (stopped in its roll phase) was finished"
    assert [s.action for s in states] == ["in sync", "loaded", finished]
    assert _served(stack, name) == [2, 2] and _desired(stack, name) == 2
    assert _repo(stack).promotion(name) is None and _repo(stack).history(name)[-1]["settled_by"] == "reconcile"
    TritonAdmin(stack.gate.http_url).unload(candidate_name(name))


@pytest.mark.slow
def test_s3_lost_at_the_promotion_history_write_is_recorded_by_the_rerun(tmp_path, stack, impatient_s3, monkeypatch):
    name = unique()
    install_stable(stack, _mlp(tmp_path, name, "v1"))
    version = _published_and_gated(stack, _mlp(tmp_path, name, "v2", seed=4), "run-s3-history")
    cut_s3_before_put(monkeypatch, stack, lambda key: key.endswith("-promoted.json"))
    with pytest.raises(PromotionError, match="is promoted .* re-run this promote step"):
        context = RunContext(f"s3://{stack.bucket}", name, version, s3=impatient_s3, run_id="run-s3-history")
        promote(context, NO_CANARY, replicas=replicas(stack), verdict="pass")
    stack.s3_switch.restore()
    monkeypatch.undo()
    assert _served(stack, name) == [2, 2] and _desired(stack, name) == 2  # consistent, history short of one event
    assert _events(stack, name)[-1] == ("gate", 2)

    context = RunContext(f"s3://{stack.bucket}", name, version, stack.gate.replica, stack.s3, "run-s3-history")
    again = promote(context, NO_CANARY, replicas=replicas(stack), verdict="pass")
    assert again.promoted and again.previous_version == 2  # the desired state already named it
    assert _events(stack, name)[-1] == ("promoted", 2)
    assert [e for e in _events(stack, name) if e[0] == "promoted"] == [("promoted", 1), ("promoted", 2)]


# ------------------------------------------------------------------------------------- killed servers
@pytest.mark.slow
def test_production_triton_killed_and_restarted_during_promotion(tmp_path, stack):
    name = unique()
    install_stable(stack, _mlp(tmp_path, name, "v1"))
    version = _published_and_gated(stack, _mlp(tmp_path, name, "v2", seed=6), "run-restart")

    def restart_second_replica(what: str, replica) -> None:
        if what == "switched" and replica.name == "prod-0":
            stack.triton("prod-1").process.kill()
            stack.restart_triton("prod-1", load_models=[name])  # a new pod: loads the desired state from S3

    with LiveTraffic([stack.replicas[0].http_url], name, X, ["y"]) as client:
        context = RunContext(f"s3://{stack.bucket}", name, version, stack.gate.replica, stack.s3, "run-restart")
        result = promote(context, NO_CANARY, replicas=replicas(stack), verdict="pass", progress=restart_second_replica)
    assert result.promoted and client.failures == []
    assert _served(stack, name) == [2, 2] and _desired(stack, name) == 2
    assert TritonAdmin(stack.replicas[1].http_url).ready_versions(name) == [2]


def _gate_again(stack: EmbeddedStack, name: str, version: int, run_id: str):
    repository = f"s3://{stack.bucket}"
    context = RunContext(repository, name, version, Replica("gate", stack.gate.http_url), stack.s3, run_id)
    return gate(context, ABSOLUTE_GATE)


@pytest.mark.slow
def test_gate_server_killed_during_the_gate_fails_closed_and_the_rerun_completes(tmp_path, stack):
    name = unique()
    install_stable(stack, _mlp(tmp_path, name, "v1"))
    repository = f"s3://{stack.bucket}"
    version = publish(
        RunContext(repository, "", s3=stack.s3, run_id="run-gate-kill"), folder=_mlp(tmp_path, name, "v2", seed=7)
    ).version
    stage(RunContext(repository, name, version, stack.gate.replica, stack.s3, "run-gate-kill"))
    fault = FaultWhilePerfAnalyzerMeasures(
        stack.gate.http_url, candidate_name(name), lambda _pid: stack.gate.process.kill()
    )
    fault.start()
    verdict = _gate_again(stack, name, version, "run-gate-kill")
    fault.joined()
    assert not stack.gate.process.alive()  # killed while it served perf_analyzer
    assert verdict.verdict == "fail" and verdict.reasons, verdict.reasons
    context = RunContext(repository, name, version, stack.gate.replica, stack.s3, "run-gate-kill")
    reject(context, verdict.verdict, verdict.reasons)
    assert _served(stack, name) == [1, 1] and _desired(stack, name) == 1

    stack.restart_triton("gate")  # the gate pod comes back empty (it never loads models at start)
    stage(RunContext(repository, name, version, stack.gate.replica, stack.s3, "run-gate-rerun"))
    rerun = _gate_again(stack, name, version, "run-gate-rerun")
    assert rerun.verdict == "pass", rerun.reasons
    context = RunContext(repository, name, version, stack.gate.replica, stack.s3, "run-gate-rerun")
    promote(context, NO_CANARY, replicas=replicas(stack), verdict="pass")
    assert _served(stack, name) == [2, 2]
    assert [e[0] for e in _events(stack, name)][-7:] == [
        "published",
        "staged",
        "gate",
        "rejected",
        "staged",
        "gate",
        "promoted",
    ]


@pytest.mark.slow
def test_perf_analyzer_killed_mid_run_fails_closed_and_the_rerun_completes(tmp_path, stack):
    name = unique()
    install_stable(stack, _mlp(tmp_path, name, "v1"))
    repository = f"s3://{stack.bucket}"
    version = publish(
        RunContext(repository, "", s3=stack.s3, run_id="run-perf-kill"), folder=_mlp(tmp_path, name, "v2", seed=8)
    ).version
    stage(RunContext(repository, name, version, stack.gate.replica, stack.s3, "run-perf-kill"))
    candidate = candidate_name(name)

    def kill(pid: int) -> None:
        assert pid_alive(pid), f"perf_analyzer {pid} had exited before it could be killed"
        os.kill(pid, signal.SIGKILL)

    fault = FaultWhilePerfAnalyzerMeasures(stack.gate.http_url, candidate, kill)
    fault.start()
    verdict = _gate_again(stack, name, version, "run-perf-kill")
    assert not pid_alive(fault.joined())
    attempts = [(a.round, a.attempt, a.exit_code) for a in verdict.attempts if a.model == candidate]
    assert attempts == [(1, 1, -signal.SIGKILL)], verdict.attempts  # the killed run, recorded; no other run
    assert verdict.verdict == "fail" and verdict.stopped == "a measurement failed", verdict.reasons
    assert f"perf_analyzer on {candidate} v{version} (round 1) exited -9" in verdict.reasons[0], verdict.reasons
    with pytest.raises(PromotionError, match="verdict is 'fail'"):
        context = RunContext(repository, name, version, s3=stack.s3, run_id="run-perf-kill")  # no gate: it stays
        promote(context, NO_CANARY, replicas=replicas(stack), verdict=verdict.verdict)
    assert _served(stack, name) == [1, 1]

    rerun = _gate_again(stack, name, version, "run-perf-kill")  # the candidate is still loaded on the gate
    assert rerun.verdict == "pass", rerun.reasons
    context = RunContext(repository, name, version, stack.gate.replica, stack.s3, "run-perf-kill")
    promote(context, NO_CANARY, replicas=replicas(stack), verdict="pass")
    assert _served(stack, name) == [2, 2] and _desired(stack, name) == 2
