"""Stage, gate and promote on the embedded stack: two production Tritons and a gate Triton."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from components.release.gate.gate import gate
from components.release.promote.promote import PartialRevert, PromotionError, promote, reject
from components.release.run_context import RunContext
from components.repository import ModelRepository, candidate_name
from components.serving.replicas import Replica
from components.serving.triton_admin import TritonAdmin
from pipelines.live_traffic import LiveTraffic
from pipelines.processes import free_port
from tests.models import mlp_folder
from tests.release_helpers import (
    ABSOLUTE_GATE,
    NO_CANARY,
    TEST_GATE,
    install_stable,
    release,
    replicas,
    repository,
    stage_and_gate,
    unique,
    wait_for,
)

REPO = Path(__file__).resolve().parents[1]
X = {"x": np.ones((1, 16), np.float32)}


def _folder(tmp_path: Path, name: str, sub: str, **kwargs) -> Path:
    """The test MLP, traced, for Triton's PyTorch backend."""
    (tmp_path / sub).mkdir()
    return mlp_folder(tmp_path / sub, name, **kwargs)


def _served(stack, name: str) -> list[int]:
    return [TritonAdmin(s.http_url).served_version(name, X, ["y"]) for s in stack.replicas]


@pytest.mark.slow
def test_equal_candidate_passes_is_promoted_with_zero_failed_requests_and_survives_a_restart(tmp_path, stack):
    name = unique()
    assert release(stack, _folder(tmp_path, name, "v1"), ABSOLUTE_GATE) == 1
    assert _served(stack, name) == [1, 1]
    repo = ModelRepository(repository(stack), stack.s3)

    with LiveTraffic([s.http_url for s in stack.replicas], name, X, ["y"]) as client:
        # the product's limits, beside live clients on two shared cores: at the default 120 s budget a CI run here
        # ended inconclusive (throughput -2.6% [-11.7, +7.4]), the busy-node noise issue 61's gate work is about
        patient = dataclasses.replace(TEST_GATE, budget_s=300)
        version, staged, verdict = stage_and_gate(stack, _folder(tmp_path, name, "v2"), patient, tmp_path / "gate")
        assert staged.accuracy_passed and verdict.verdict == "pass", verdict.reasons
        promotion_started = time.monotonic()
        context = RunContext(repository(stack), name, version, stack.gate.replica, stack.s3)
        promote(context, NO_CANARY, replicas=replicas(stack), verdict=verdict.verdict)
        wait_for(lambda: client.versions[2] >= 20, 30, "20 live requests answered by v2")
    assert client.failures == [], client.failures[:5]
    assert client.total > 100
    assert client.versions_before(promotion_started) == {1}  # the candidate was dark during stage and gate
    assert _served(stack, name) == [2, 2]
    assert repo.desired_config(name)[0].version_policy.specific.versions == [2]
    assert not TritonAdmin(stack.gate.http_url).is_ready(candidate_name(name))  # unloaded from the gate
    assert {p.name for p in (tmp_path / "gate").iterdir()} >= {"verdict.json", "report.md", "report.html", "raw"}
    assert json.loads((tmp_path / "gate" / "verdict.json").read_text())["verdict"] == "pass"

    stack.restart_triton("prod-1", load_models=[name])  # as a restarted pod: explicit mode, --load-model
    assert TritonAdmin(stack.replicas[1].http_url).ready_versions(name) == [2]
    assert _served(stack, name) == [2, 2]
    events = [e["event"] for e in repo.history(name)]
    assert events == ["published", "staged", "gate", "promoted"] * 2


@pytest.mark.slow
def test_slow_candidate_fails_the_gate_is_rejected_and_stable_keeps_serving(tmp_path, stack):
    name = unique()
    install_stable(stack, _folder(tmp_path, name, "v1"))
    # About twice the stable numpy MLP's median latency here (~0.5 ms): the candidate is 3x as slow.
    slow = _folder(tmp_path, name, "slow", delay_us=1000)
    with LiveTraffic([s.http_url for s in stack.replicas], name, X, ["y"]) as client:
        version, staged, verdict = stage_and_gate(stack, slow)
        assert staged.accuracy_passed
        assert verdict.verdict == "fail", verdict.reasons
        assert any(r.startswith(("p99 +", "throughput -")) and r.endswith(": beyond") for r in verdict.reasons)
        context = RunContext(repository(stack), name, version, stack.gate.replica, stack.s3)
        reject(context, verdict.verdict, verdict.reasons)
    assert client.failures == [] and set(client.versions) == {1}
    assert _served(stack, name) == [1, 1]
    repo = ModelRepository(repository(stack), stack.s3)
    assert repo.desired_config(name)[0].version_policy.specific.versions == [1]
    assert repo.versions(name, staged=False) == [1]
    rejected = [e for e in repo.history(name) if e["event"] == "rejected"]
    assert len(rejected) == 1 and rejected[0]["version"] == version and rejected[0]["verdict"] == "fail"
    assert not TritonAdmin(stack.gate.http_url).is_ready(candidate_name(name))


def test_candidate_with_wrong_answers_fails_the_accuracy_gate(tmp_path, stack):
    name = unique()
    install_stable(stack, _folder(tmp_path, name, "v1"))
    version, staged, verdict = stage_and_gate(stack, _folder(tmp_path, name, "bad", weights_seed=99))
    assert not staged.accuracy_passed and not all(r.passed for r in staged.accuracy)
    assert verdict.verdict == "fail"
    assert verdict.reasons[0].startswith("the accuracy check failed for output(s) y")
    assert len(verdict.candidate) == 0 and verdict.attempts == []  # not even measured
    with pytest.raises(PromotionError, match="verdict is 'fail'"):
        context = RunContext(repository(stack), name, version, s3=stack.s3)  # no gate: the candidate stays there
        promote(context, NO_CANARY, replicas=replicas(stack), verdict=verdict.verdict)
    assert _served(stack, name) == [1, 1]
    TritonAdmin(stack.gate.http_url).unload(candidate_name(name))


def test_candidate_that_triton_cannot_load_fails_the_gate_and_production_is_untouched(tmp_path, stack):
    name = unique()
    install_stable(stack, _folder(tmp_path, name, "v1"))
    broken = _folder(tmp_path, name, "v2")
    model_pt = broken / "1" / "model.pt"
    model_pt.write_bytes(model_pt.read_bytes()[: model_pt.stat().st_size // 2])  # a truncated upload
    version, staged, verdict = stage_and_gate(stack, broken)
    assert not staged.accuracy_passed and "istream reader failed" in staged.load_error
    assert verdict.verdict == "fail" and verdict.reasons[0].startswith("the gate server could not load the candidate")
    assert _served(stack, name) == [1, 1]
    staged_event = [e for e in ModelRepository(repository(stack), stack.s3).history(name) if e["event"] == "staged"][-1]
    assert staged_event["version"] == version and "istream reader failed" in staged_event["load_error"]


def test_a_second_release_of_the_same_model_waits_for_the_first(tmp_path, stack):
    from components.release.publish import publish
    from components.release.run_context import RunContext
    from components.release.stage import stage
    from components.repository import LeaseHeld

    name = unique()
    first = publish(RunContext(repository(stack), "", s3=stack.s3), folder=_folder(tmp_path, name, "a")).version
    second = publish(
        RunContext(repository(stack), "", s3=stack.s3), folder=_folder(tmp_path, name, "b", seed=3)
    ).version
    stage(RunContext(repository(stack), name, first, stack.gate.replica, stack.s3, "run-first"))
    with pytest.raises(LeaseHeld, match="being released by run run-first"):
        stage(RunContext(repository(stack), name, second, stack.gate.replica, stack.s3, "run-second"))
    assert TritonAdmin(stack.gate.http_url).ready_versions(candidate_name(name)) == [first]  # untouched
    reject(RunContext(repository(stack), name, first, stack.gate.replica, stack.s3, "run-first"), "fail", ["test"])
    stage(RunContext(repository(stack), name, second, stack.gate.replica, stack.s3, "run-second"))
    assert TritonAdmin(stack.gate.http_url).ready_versions(candidate_name(name)) == [second]
    reject(RunContext(repository(stack), name, second, stack.gate.replica, stack.s3, "run-second"), "fail", ["test"])


@pytest.mark.slow
def test_replica_killed_during_promotion_is_reported_as_not_reverted_and_reconcile_converges(tmp_path, stack):
    from components.release.promote.reconcile import reconcile

    name = unique()
    install_stable(stack, _folder(tmp_path, name, "v1"))
    version, _staged, verdict = stage_and_gate(stack, _folder(tmp_path, name, "v2", seed=5), ABSOLUTE_GATE)
    assert verdict.verdict == "pass", verdict.reasons

    def kill_second_replica(what: str, replica) -> None:
        if what == "switched" and replica.name == "prod-0":
            stack.triton("prod-1").process.kill()

    dead = stack.replicas[1].http_url
    try:
        with pytest.raises(PartialRevert, match=f"could not be reverted to v1 .*{dead} did not answer") as info:
            promote(
                RunContext(repository(stack), name, version, stack.gate.replica, stack.s3),
                NO_CANARY,
                replicas=replicas(stack),
                verdict="pass",
                progress=kill_second_replica,
            )
        assert info.value.exit_code == 4 and "did not answer" in str(info.value)
        assert f"tritonship reconcile -r {repository(stack)} -m {name}" in str(info.value)
        # The result says what each replica serves, as each answered: prod-0 back on v1, prod-1 silent.
        states = [(s.url, s.serving, s.reverted) for s in info.value.result.after_revert]
        assert states == [(stack.replicas[0].http_url, [1], True), (dead, None, False)]
        assert not info.value.result.reverted
        survivor = TritonAdmin(stack.replicas[0].http_url)
        assert survivor.served_version(name, X, ["y"]) == 1 and survivor.ready_versions(name) == [1]
        repo = ModelRepository(repository(stack), stack.s3)
        assert repo.desired_config(name)[0].version_policy.specific.versions == [1]
        last = repo.history(name)[-1]
        assert (last["event"], last["complete"]) == ("reverted", False)
    finally:
        stack.restart_triton("prod-1")  # a pod restarted without --load-model: serves nothing
    assert TritonAdmin(dead).ready_versions(name) == []
    fixed = reconcile(repository(stack), replicas(stack), [name], s3=stack.s3)
    # S3 was reverted before prod-1 died: the unfinished promotion is settled as a revert
    reverted = "settled: the unfinished promotion of v2 (stopped in its roll phase) was reverted"
    assert [s.action for s in fixed] == ["in sync", "loaded", reverted]
    assert _served(stack, name) == [1, 1] and repo.history(name)[-1]["settled_by"] == "reconcile"
    TritonAdmin(stack.gate.http_url).unload(candidate_name(name))


def test_missing_perf_analyzer_makes_the_verdict_fail(tmp_path, stack, monkeypatch):
    name = unique()
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setenv("TRITONSHIP_TOOLS", str(tmp_path / "no-tools"))
    _version, _staged, verdict = stage_and_gate(stack, _folder(tmp_path, name, "v1"))
    assert verdict.verdict == "fail" and "perf_analyzer was not found" in verdict.reasons[0]
    TritonAdmin(stack.gate.http_url).unload(candidate_name(name))


def test_unreachable_gate_server_makes_the_verdict_fail(tmp_path, stack):
    name = unique()
    from components.release.publish import publish
    from components.release.run_context import RunContext

    published = publish(RunContext(repository(stack), "", s3=stack.s3), folder=_folder(tmp_path, name, "v1"))
    nowhere = f"127.0.0.1:{free_port()}"
    context = RunContext(repository(stack), name, published.version, Replica(nowhere, nowhere), stack.s3)
    verdict = gate(context, TEST_GATE)
    assert verdict.verdict == "fail" and "did not answer" in verdict.reasons[0]
    events = ModelRepository(repository(stack), stack.s3).history(name)
    assert events[-1]["event"] == "gate" and events[-1]["verdict"] == "fail"


def test_cli_gate_exit_code_and_promote_refuses_a_failed_verdict(tmp_path, stack):
    env = {**os.environ, **stack.s3.env()}
    verdict = {"model": "m", "version": 3, "verdict": "inconclusive", "reasons": ["noisy"]}
    (tmp_path / "verdict.json").write_text(json.dumps(verdict))
    cli = [sys.executable, "-m", "pipelines.cli"]
    promote_run = subprocess.run(
        [
            *cli,
            "promote",
            "-r",
            repository(stack),
            "--verdict",
            str(tmp_path / "verdict.json"),
            "--replicas",
            stack.replicas[0].http_url,
        ],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert promote_run.returncode == 1 and "verdict is 'inconclusive', not 'pass'" in promote_run.stderr
    gate_run = subprocess.run(
        [
            *cli,
            "gate",
            "-r",
            repository(stack),
            "-m",
            "never_published",
            "--version",
            "1",
            "--gate",
            stack.gate.http_url,
            "--out",
            str(tmp_path / "g"),
        ],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert gate_run.returncode == 1 and "verdict: fail" in gate_run.stdout
    assert json.loads((tmp_path / "g" / "verdict.json").read_text())["verdict"] == "fail"


def test_reconcile_brings_every_replica_to_the_desired_state(tmp_path, stack):
    from components.release.promote.reconcile import reconcile

    name = unique()
    install_stable(stack, _folder(tmp_path, name, "v1"))
    # An incident: one replica restarted without --load-model, the other had a version unloaded by hand.
    stack.restart_triton("prod-0")
    TritonAdmin(stack.replicas[1].http_url).unload(name)
    report = reconcile(repository(stack), replicas(stack), [name], dry_run=True, s3=stack.s3)
    assert [(s.serving, s.action) for s in report] == [((), "would load"), ((), "would load")]
    assert TritonAdmin(stack.replicas[0].http_url).ready_versions(name) == []  # a dry run changes nothing
    fixed = reconcile(repository(stack), replicas(stack), [name], s3=stack.s3)
    assert [s.action for s in fixed] == ["loaded", "loaded"] and all(s.ok for s in fixed)
    assert _served(stack, name) == [1, 1]
    assert all(s.action == "in sync" for s in reconcile(repository(stack), replicas(stack), [name], s3=stack.s3))
