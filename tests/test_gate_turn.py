"""One measurement at a time on a gate server: its lease in the real S3, waited for on a clock that moves only
when slept on, and two releases of different models gated at once through the one gate server."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from components.model import model_config
from components.release.gate_turn import GateBusy, gate_turn
from components.release.publish import publish
from components.release.results import StageResult, TuneResult
from components.release.run_context import RunContext
from components.release.stage import unload_candidate
from components.release.step_settings import PIPELINE_STEPS
from components.release.tune.tune import default_settings
from components.repository import ModelRepository, lease_owner
from components.repository.store import STAGING as STAGING_PREFIX
from components.serving.triton_admin import TritonAdmin
from components.settings import DEFAULT_GATE_LEASE_S, DEFAULT_GATE_POLL_S
from pipelines.kfp_components import gate_op, stage_op
from pipelines.stack import PRODUCTION_PREFIX
from tests.clocks import StepClock
from tests.models import mlp_folder
from tests.release_helpers import ABSOLUTE_GATE, quick_gate_settings, repository, stage_and_gate, unique


def test_a_second_measurement_waits_for_the_first_and_says_for_whom(stack):
    repo, gate = ModelRepository(repository(stack), stack.s3), f"http://{unique('gate')}:8000"
    seen: list[str] = []
    with gate_turn(repo, gate, "run-a", clock=StepClock()) as waited:
        assert waited == 0.0 and repo.gate_holder(gate)["owner"] == "run-a"
        # run-a finishes while run-b is on its third poll
        clock = StepClock(lambda n: n == 3 and repo.release_gate(gate, "run-a"))
        with gate_turn(repo, gate, "run-b", progress=seen.append, clock=clock) as second_waited:
            assert repo.gate_holder(gate)["owner"] == "run-b"
    assert second_waited == 3 * DEFAULT_GATE_POLL_S and clock.sleeps == 3
    assert seen[0] == f"waiting for the gate server {gate}: measuring for run-a (0 s)" and len(seen) == 3
    assert repo.gate_holder(gate) is None  # given back after the body


def test_a_gate_busy_for_the_whole_wait_is_one_sentence_and_the_holder_keeps_it(stack):
    repo, gate = ModelRepository(repository(stack), stack.s3), f"http://{unique('gate')}:8000"
    repo.acquire_gate(gate, "run-a", DEFAULT_GATE_LEASE_S)
    with pytest.raises(GateBusy) as refused, gate_turn(repo, gate, "run-b", wait_s=10, clock=StepClock()):
        raise AssertionError("measured while another release held the gate")
    assert str(refused.value) == (
        f"the gate server {gate} was measuring for run-a for the whole 10 s wait; run the release again when it is free."
    )
    assert repo.gate_holder(gate)["owner"] == "run-a"


def test_a_dead_runs_gate_lease_is_taken_over_once_it_expires(stack):
    repo, gate = ModelRepository(repository(stack), stack.s3), f"http://{unique('gate')}:8000"
    repo.acquire_gate(gate, "run-that-died", seconds=-1)
    with gate_turn(repo, gate, "run-b", clock=StepClock()) as waited:
        assert waited == 0.0 and repo.gate_holder(gate)["owner"] == "run-b"


def test_a_failing_body_gives_the_gate_back(stack):
    repo, gate = ModelRepository(repository(stack), stack.s3), f"http://{unique('gate')}:8000"
    with pytest.raises(RuntimeError), gate_turn(repo, gate, "run-a"):
        raise RuntimeError("the measurement failed")
    assert repo.gate_holder(gate) is None


@pytest.mark.slow
def test_two_models_gated_at_once_take_turns_on_the_one_gate_server(tmp_path, stack):
    names = [unique("turn"), unique("turn")]
    for name in names:
        (tmp_path / name).mkdir()
    folders = [mlp_folder(tmp_path / name, name) for name in names]
    verdicts: dict[int, object] = {}

    def release(i: int) -> None:
        verdicts[i] = stage_and_gate(stack, folders[i], ABSOLUTE_GATE)[2]

    threads = [threading.Thread(target=release, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    assert [v.verdict for v in verdicts.values()] == ["pass", "pass"], [v.reasons for v in verdicts.values()]
    first, second = sorted(verdicts.values(), key=lambda v: v.gate_wait_s)
    # the second waited out the first's whole measurement (which its lease covered), and the first did not wait
    assert first.gate_wait_s < DEFAULT_GATE_POLL_S and second.gate_wait_s >= first.measurement_seconds
    assert ModelRepository(repository(stack), stack.s3).gate_holder(stack.gate.http_url) is None


@pytest.mark.slow
def test_with_several_gate_servers_each_release_stages_on_a_free_one_and_measures_there(tmp_path, stack, monkeypatch):
    """The stack's gate and a second one stand for the chart's gate replicas; releases are staged through the
    pipeline's own stage task."""
    for key, value in stack.s3.env().items():  # a task reads its S3 credentials from the environment
        monkeypatch.setenv(key, value)
    gate2 = stack.add_triton("gate2", [PRODUCTION_PREFIX, STAGING_PREFIX], metrics_config=())
    first, second = stack.gate.http_url, gate2.http_url
    for server in (first, second):  # other tests' candidates may be dark on the stack's gate: none here
        with TritonAdmin(server) as admin:
            for name in [m for m in admin.ready_models() if m.endswith("__candidate")]:
                admin.unload(name)
    gates = f"{first},{second}"
    names = [unique("gates") for _ in range(3)]
    repo = ModelRepository(repository(stack), stack.s3)

    def staged_on(name: str, spec: str = gates) -> StageResult:
        (tmp_path / name).mkdir()
        version = publish(
            RunContext(repository(stack), "", s3=stack.s3), folder=mlp_folder(tmp_path / name, name)
        ).version
        settings = PIPELINE_STEPS.settings({})["load"]
        return StageResult.from_json(
            stage_op.python_func(repository(stack), name, version, spec, stack.s3.endpoint_url, "", settings)
        )

    try:
        one = staged_on(names[0])
        assert one.gate_url == first and one.accuracy_passed  # both free: the first
        two = staged_on(names[1])
        assert two.gate_url == second  # the first holds a release's candidate
        repo.acquire_gate(second, "a-release-measuring", DEFAULT_GATE_LEASE_S)
        try:
            assert staged_on(names[2], f"127.0.0.1:9,{gates}").gate_url == first  # measuring; unreachable
        finally:
            repo.release_gate(second, "a-release-measuring")
        # the gate step measures where the release staged, whichever server the spec names first
        artifacts = {k: SimpleNamespace(path=str(tmp_path / k), log_metric=lambda *a: None) for k in ("m", "md", "h")}
        config = model_config.parse_pbtxt((tmp_path / names[1] / names[1] / "config.pbtxt").read_text())
        untuned = TuneResult(names[1], two.version, default_settings(config), default_settings(config), None, 0)
        gated = gate_op.python_func(
            repository(stack), names[1], two.version, gates, two.to_json(), untuned.to_json(), "", stack.s3.endpoint_url, "",
            quick_gate_settings(), artifacts["m"], artifacts["md"], artifacts["h"],
        )  # fmt: skip
        assert '"gate_url": "' + second + '"' in gated.verdict_json
    finally:
        for name in names:
            unload_candidate(first, name)
            repo.release_lease(name, lease_owner("", name, 1))
        stack.servers.pop("gate2").process.stop()  # the session's stack as the other tests know it
