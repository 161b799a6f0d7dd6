"""The promotion's states and transitions (components/release/promote/promote.py) on fakes: a repository in memory,
replicas that switch and revert when told, a canary that decides as told (or the real one on made-up rounds and a
clock that moves only when slept on). No S3, no Triton, no waiting: each test takes milliseconds.

Every phase is recorded before it starts; every ending is a value (promoted, reverted by the canary, reverted after
a failure or a signal, partial), and `promote` turns into errors only those that are."""

from __future__ import annotations

import functools
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from components.model import model_config
from components.model.parity import Tolerance
from components.model.signature import Signature
from components.release.promote import promote as promote_step
from components.release.promote.canary import Canary, Watch
from components.release.promote.cancel import Cancelled, cancellable
from components.release.promote.plan import Plan
from components.release.promote.promote import Promotion
from components.release.promote.records import (
    CanaryResult,
    CanaryRound,
    Ending,
    Outcome,
    Phase,
    PromoteResult,
    ReplicaOutcome,
    Side,
    Stop,
)
from components.release.promote.rollout import PromotionError, Release
from components.release.promote.settings import CanarySettings
from components.release.run_context import RunContext
from components.release.stage import CandidateVersion
from components.s3 import S3Error
from components.serving.replicas import Replica
from tests.clocks import StepClock

MODEL, VERSION, STABLE = "m", 3, 2
REPLICAS = [Replica(f"prod-{i}", f"prod-{i}:8000") for i in range(3)]
CANARY = CanarySettings(round_s=1.0, max_bake_s=30.0)


def config(*versions: int) -> model_config.ModelConfig:
    text = f'name: "{MODEL}" platform: "pytorch_libtorch" max_batch_size: 8 instance_group {{ count: 1 }}'
    return model_config.pin_version(model_config.parse_pbtxt(text), *versions)


class FakeRepository:
    """The repository calls a promotion makes, in memory; `fail_on` names a call that raises an S3Error."""

    uri = "s3://bucket/repo"

    def __init__(self, fail_on: str = "") -> None:
        self.fail_on = fail_on
        self.desired: dict[str, model_config.ModelConfig] = {MODEL: config(STABLE)}
        self.records: list[dict[str, Any]] = []  # every write of the in-progress record
        self.record_now: dict[str, Any] | None = None
        self.history: list[dict[str, Any]] = []
        self.copied: list[tuple[str, int]] = []

    def _call(self, name: str) -> None:
        if name == self.fail_on:
            raise S3Error(f"{name}: S3 did not answer")

    def write_promotion(self, model: str, record: dict[str, Any]) -> None:
        self.record_now = {**record, "model": model, "updated": "now"}
        self.records.append(self.record_now)

    def promotion(self, model: str) -> dict[str, Any] | None:
        return self.record_now

    def clear_promotion(self, model: str) -> None:
        self._call("clear_promotion")
        self.record_now = None

    def copy_to_production(self, name: str, version: int) -> None:
        self._call("copy_to_production")
        self.copied.append((name, version))

    def desired_config(self, name: str) -> tuple[model_config.ModelConfig | None, str | None]:
        return self.desired.get(name), f"etag-{name}" if name in self.desired else None

    def write_desired_config(self, name: str, written: model_config.ModelConfig, etag: str | None) -> str:
        self._call("write_desired_config")
        self.desired[name] = written
        return f"etag-{name}"

    def record(self, model: str, event: str, version: int, run_id: str = "", **details: Any) -> str:
        self._call(f"record {event}")
        self.history.append({"event": event, "version": version, "run_id": run_id, **details})
        return "key"

    def desired_versions(self) -> list[int]:
        return list(self.desired[MODEL].version_policy.specific.versions)


@dataclass
class FakeFleet:
    """Replicas that switch and revert when told; `fail_at` is the replica whose switch fails, `left_behind` the
    ones a revert cannot bring back, `during_revert` runs inside the revert (a second signal)."""

    fail_at: int | None = None
    left_behind: tuple[int, ...] = ()
    during_revert: Any = None
    switched: list[int] = field(default_factory=list)
    reverted: bool = False

    def __enter__(self) -> FakeFleet:
        return self

    def __exit__(self, *_exc: object) -> None:
        pass

    def ensure_live(self) -> None:
        pass

    def switch(self, repo: FakeRepository, index: int, release: Release) -> float:
        if index == self.fail_at:
            raise PromotionError(f"{REPLICAS[index].url} serves v{VERSION} with wrong answers")
        self.switched.append(index)
        return 0.5

    def revert(self, repo: FakeRepository, release: Release, previous: Any, etags: dict, members: dict):
        if self.during_revert:
            self.during_revert()
        repo.desired[MODEL] = previous
        self.reverted = True
        outcomes = [
            ReplicaOutcome(r.url, [VERSION] if i in self.left_behind else [STABLE], i not in self.left_behind)
            for i, r in enumerate(REPLICAS)
        ]
        return outcomes, [f"revert of {REPLICAS[i].url}: it did not answer" for i in self.left_behind]


class FakeCanary:
    """Decides as told: `comparable` says whether the rounds before the switch let promote switch."""

    def __init__(self, decision: str, comparable: bool, fleet: FakeFleet, seen: list[str]) -> None:
        self.decision, self.comparable, self.fleet, self.seen = decision, comparable, fleet, seen

    def __call__(self, watch: Watch, canary: list[Replica], baseline: list[Replica], settings, progress) -> FakeCanary:
        self.result = CanaryResult(watch.model, watch.candidate, watch.stable, "inconclusive", [])
        self.result.canary_replicas, self.result.baseline_replicas = (
            [r.name for r in canary],
            [r.name for r in baseline],
        )
        return self

    def before_switch(self) -> bool:
        self.seen.append(f"before the switch, switched {self.fleet.switched}")
        if not self.comparable:
            self.result.reasons = ["too few live requests before the switch"]
        return self.comparable

    def after_switch(self) -> CanaryResult:
        self.seen.append(f"after the switch, switched {self.fleet.switched}")
        self.result.decision, self.result.reasons = self.decision, [f"mean latency: {self.decision}"]
        return self.result


def candidate() -> CandidateVersion:
    return CandidateVersion(MODEL, VERSION, config(1), Signature((), ()), {}, {}, Tolerance(0.0, 0.0, 0.0))


def promotion(
    repo: FakeRepository,
    fleet: FakeFleet,
    canary: Any = None,
    settings: CanarySettings | None = CANARY,
    progress: Any = None,
) -> Promotion:
    plan = Plan(repo, candidate(), REPLICAS, repo.desired.get(MODEL), "etag-m", "run")
    new_canary = canary or FakeCanary("pass", True, fleet, [])
    return Promotion(plan, fleet, settings, new_canary=new_canary, progress=progress)  # type: ignore[arg-type]


def phases(repo: FakeRepository) -> list[str]:
    return [r["phase"] for r in repo.records]


def test_a_promotion_records_each_phase_before_it_starts_and_ends_promoted():
    repo, fleet, seen = FakeRepository(), FakeFleet(), []
    ending = promotion(repo, fleet, FakeCanary("pass", True, fleet, seen)).run()
    assert ending == Ending(ending.result) and ending.result.outcome is Outcome.PROMOTED
    assert phases(repo) == ["copy", "canary", "roll", "finish"]
    assert all(r["run_id"] == "run" and r["previous_version"] == STABLE for r in repo.records)
    assert seen == ["before the switch, switched []", "after the switch, switched [0]"]  # promote switched
    assert fleet.switched == [0, 1, 2] and repo.desired_versions() == [VERSION] and repo.copied == [(MODEL, VERSION)]
    assert repo.record_now is None and [e["event"] for e in repo.history] == ["promoted"]
    assert repo.history[0]["canary"]["decision"] == "pass" and ending.result.canary.outcome == "promoted"


def test_with_no_canary_copy_goes_on_to_roll_and_a_first_release_says_why():
    repo, fleet = FakeRepository(), FakeFleet()
    assert promotion(repo, fleet, settings=None).run().result.outcome is Outcome.PROMOTED
    assert phases(repo) == ["copy", "roll", "finish"] and fleet.switched == [0, 1, 2]
    first, fleet = FakeRepository(), FakeFleet()
    del first.desired[MODEL]
    result = promotion(first, fleet).run().result
    assert phases(first) == ["copy", "roll", "finish"] and result.outcome is Outcome.PROMOTED
    assert result.canary.decision == "skipped" and "a first release" in result.canary.reasons[0]


@pytest.mark.parametrize(("decision", "comparable"), [("fail", True), ("inconclusive", True), ("inconclusive", False)])
def test_a_canary_that_does_not_hold_reverts_as_an_outcome_not_an_error(decision, comparable):
    repo, fleet = FakeRepository(), FakeFleet()
    ending = promotion(repo, fleet, FakeCanary(decision, comparable, fleet, [])).run()
    result = ending.result
    assert ending.stopped_by is Stop.CANARY and result.outcome is Outcome.REVERTED and result.reverted
    assert phases(repo) == ["copy", "canary"] and fleet.switched == ([0] if comparable else []) and fleet.reverted
    what = "failed on live traffic" if decision == "fail" else "was inconclusive"
    assert result.problems[0].startswith(f"the canary of {MODEL} v{VERSION} {what}: ")
    assert ending.said == f"{result.problems[0]} Every replica was reverted to v{STABLE}."  # the command's error
    assert result.canary.decision == decision and result.canary.outcome == "reverted"
    assert repo.desired_versions() == [STABLE] and repo.record_now is None
    assert [(e["event"], e["phase"], e["complete"]) for e in repo.history] == [("reverted", "canary", True)]


def test_an_inconclusive_canary_goes_on_when_its_settings_say_promote():
    repo, fleet = FakeRepository(), FakeFleet()
    settings = CanarySettings(round_s=1.0, max_bake_s=30.0, on_inconclusive="promote")
    ending = promotion(repo, fleet, FakeCanary("inconclusive", False, fleet, []), settings).run()
    assert ending.result.outcome is Outcome.PROMOTED and ending.result.canary.outcome == "promoted"
    assert phases(repo) == ["copy", "canary", "roll", "finish"] and fleet.switched == [0, 1, 2]


# the call that fails, and the phase it fails in
FAILURES = {
    "copy": ("copy_to_production", None),
    "canary": ("", 0),  # the canary replica's switch
    "roll": ("", 2),  # the last replica's switch, after the desired state names the new version
}


@pytest.mark.parametrize("phase", FAILURES)
def test_a_failure_in_each_phase_reverts_every_replica_and_is_an_error(phase):
    fail_on, fail_at = FAILURES[phase]
    repo, fleet = FakeRepository(fail_on), FakeFleet(fail_at=fail_at)
    ending = promotion(repo, fleet).run()
    result = ending.result
    assert ending.stopped_by is Stop.FAILURE and result.outcome is Outcome.REVERTED
    assert phases(repo)[-1] == phase and repo.history[-1]["phase"] == phase
    assert fleet.reverted == (phase != "copy")  # stopped while copying, nothing a replica reads had changed
    assert repo.desired_versions() == [STABLE] and repo.record_now is None
    assert ending.said.startswith(f"promotion of {MODEL} v{VERSION} failed and every replica was reverted to v{STABLE}")


def test_s3_failing_in_the_finish_leaves_it_promoted_and_says_to_run_promote_again():
    repo, fleet = FakeRepository("record promoted"), FakeFleet()
    ending = promotion(repo, fleet).run()
    assert ending.stopped_by is Stop.FAILURE and ending.result.outcome is Outcome.PROMOTED and not fleet.reverted
    assert phases(repo)[-1] == "finish" and repo.record_now is not None  # for reconcile, which finishes it
    assert "re-run this promote step to finish it" in ending.said


def test_a_revert_that_leaves_a_replica_behind_is_partial_and_keeps_its_record_for_reconcile():
    repo, fleet = FakeRepository(), FakeFleet(fail_at=2, left_behind=(1,))
    ending = promotion(repo, fleet).run()
    assert ending.result.outcome is Outcome.PARTIAL and not ending.result.reverted
    assert repo.record_now is not None and repo.record_now["phase"] == "roll"
    assert repo.history[-1]["complete"] is False
    assert "prod-1:8000 serves v3" in ending.said and f"tritonship reconcile -r {repo.uri} -m {MODEL}" in ending.said


@pytest.mark.parametrize("phase", list(Phase))
def test_a_signal_in_each_phase_reverts_and_says_which_phase_and_a_second_one_is_ignored(phase):
    repo = FakeRepository()
    fleet = FakeFleet(during_revert=lambda: signal.raise_signal(signal.SIGTERM))  # shielded: dropped

    def signal_at(what: str, _replica: Replica) -> None:
        if what == f"{phase} phase":
            signal.raise_signal(signal.SIGTERM)

    with cancellable():
        ending = promotion(repo, fleet, progress=signal_at).run()
    assert ending.stopped_by is Stop.SIGNAL and ending.result.outcome is Outcome.REVERTED
    assert ending.result.problems == [f"stopped by SIGTERM in its {phase} phase"]
    assert repo.history[-1]["phase"] == phase and repo.desired_versions() == [STABLE] and repo.record_now is None
    assert ending.said == f"the promotion of {MODEL} v{VERSION} was stopped by SIGTERM in its {phase} phase; " + (
        f"every replica was reverted to v{STABLE}."
    )


def made_up_rounds(clock: StepClock, slower: float) -> Any:
    """Rounds of a second, the canary side `slower` times the stable's mean latency once it serves the candidate."""

    def source(watch: Watch) -> Iterator[CanaryRound]:
        factor = 1.0 if watch.candidate == watch.stable else slower
        for i in range(10_000):
            clock.sleep(1.0)
            mean_ms = 2.0 * factor * (1 + 0.01 * np.sin(i))
            yield CanaryRound(True, "", Side(200, 0, mean_ms, None), Side(200, 0, 2.0, None))

    return source


@pytest.mark.parametrize(("slower", "outcome"), [(1.0, Outcome.PROMOTED), (2.0, Outcome.REVERTED)])
def test_the_real_canary_on_made_up_rounds_decides_and_promote_switches(slower, outcome):
    repo, fleet, clock = FakeRepository(), FakeFleet(), StepClock()
    canary = functools.partial(Canary, clock=clock, rounds=made_up_rounds(clock, slower))
    result = promotion(repo, fleet, canary).run().result
    assert result.outcome is outcome and result.canary.decision == ("pass" if slower == 1.0 else "fail")
    assert fleet.switched[:1] == [0] and result.canary.seconds == clock.seconds <= CANARY.max_bake_s * 2


@pytest.mark.parametrize(
    ("stopped_by", "reverted", "raised"),
    [
        (None, False, None),  # promoted
        (Stop.CANARY, True, None),
        (Stop.FAILURE, True, PromotionError),
        (Stop.SIGNAL, True, promote_step.PromotionCancelled),
        (Stop.SIGNAL, False, promote_step.PartialRevert),
        (Stop.CANARY, False, promote_step.PartialRevert),
    ],
)
def test_promote_returns_an_outcome_and_raises_only_for_an_error(monkeypatch, stopped_by, reverted, raised):
    result = PromoteResult(MODEL, VERSION, STABLE, [r.url for r in REPLICAS], stopped_by is None, reverted)
    unloaded = []

    class Leased(FakeRepository):
        def __init__(self, *_args: Any) -> None:
            super().__init__()

        def acquire_lease(self, model: str, owner: str) -> None: ...

        def release_lease(self, model: str, owner: str) -> None: ...

    monkeypatch.setattr(RunContext, "repo", lambda self: Leased())
    plan = classmethod(lambda cls, repo, *_args: Plan(repo, candidate(), REPLICAS, config(STABLE), "etag-m"))
    monkeypatch.setattr(promote_step.Plan, "read", plan)
    monkeypatch.setattr(promote_step, "Fleet", lambda *_args: FakeFleet())
    monkeypatch.setattr(promote_step.Promotion, "run", lambda self: Ending(result, stopped_by, "said"))
    monkeypatch.setattr(promote_step, "unload_candidate", lambda gate, model: unloaded.append(gate))
    context = RunContext("s3://bucket/repo", MODEL, VERSION, Replica("gate", "gate:8000"))
    call = functools.partial(promote_step.promote, context, replicas=REPLICAS, verdict="pass")
    if raised is None:
        assert call() is result and unloaded == (["gate:8000"] if result.promoted else [])
        return
    with pytest.raises(raised, match="said") as info:
        call()
    assert (
        info.value.result is result
        and info.value.exit_code
        == {
            PromotionError: 1,
            promote_step.PromotionCancelled: Cancelled.exit_code,
            promote_step.PartialRevert: 4,
        }[raised]
    )


@pytest.mark.parametrize("reverted", [True, False], ids=["reverted by the canary", "promoted"])
def test_the_promote_command_reads_the_outcome_exit_code_and_report_as_before(tmp_path, monkeypatch, reverted):
    from typer.testing import CliRunner

    from components.release.results import Verdict
    from pipelines.cli import app

    canary = CanaryResult(MODEL, VERSION, STABLE, "fail" if reverted else "pass", ["mean latency +25%"])
    problems = [f"the canary of {MODEL} v{VERSION} failed on live traffic: mean latency +25%."] if reverted else []
    urls = [r.url for r in REPLICAS]
    ended = PromoteResult(MODEL, VERSION, STABLE, urls, not reverted, reverted, problems, canary=canary)
    monkeypatch.setattr(promote_step, "promote", lambda *_args, **_kwargs: ended)
    verdict = tmp_path / "verdict.json"
    verdict.write_text(Verdict(MODEL, VERSION, "pass", []).to_json())
    argv = ["promote", "-r", "s3://bucket/repo", "--verdict", str(verdict), "--replicas", ",".join(urls)]
    shown = CliRunner().invoke(app, [*argv, "--out", str(tmp_path / "canary")], env={"COLUMNS": "200"})
    said = " ".join(shown.output.split())
    assert (tmp_path / "canary" / "report.md").exists() and (tmp_path / "canary" / "report.html").exists()
    if reverted:
        assert shown.exit_code == 1, said
        assert f"error: {problems[0]} Every replica was reverted to v{STABLE}." in said
    else:
        assert shown.exit_code == 0 and f"promoted {MODEL} v{VERSION} (was {STABLE}) on 3 replicas" in said, said
