"""Promote's canary on the embedded stack, through Triton's PyTorch backend: prod-0 is switched first and
measured against prod-1 on live traffic (a steady client sending long sequences to both, as a Service would),
then promoted everywhere or reverted. The decisions' rates are measured by benchmarks/canary_quality.py."""

from __future__ import annotations

import numpy as np
import pytest

from components.release.effects import judge
from components.release.promote import canary_report
from components.release.promote.canary import effects
from components.release.promote.canary_report import reverted_by_canary
from components.release.promote.promote import promote
from components.release.promote.records import Outcome, PromoteResult, Side
from components.release.promote.settings import CanarySettings, PromoteSettings
from components.release.publish import publish
from components.release.run_context import RunContext
from components.release.stage import stage
from components.repository import ModelRepository
from components.serving.replicas import Replica
from pipelines.live_traffic import LiveTraffic
from pipelines.stack import EmbeddedStack
from tests.models import sequence_folder
from tests.release_helpers import install_stable, replicas, repository, unique

# Short rounds and a far-off latency limit: tests of the canary's machinery, not of its statistics (which
# benchmarks/canary_quality.py and benchmarks/sequential_replay.py measure). Each replica here has one CPU of two:
# other work that the scheduler moves onto the canary's CPU after the rounds before the switch slows it by itself
# (an equal candidate read +127% in CI on a busy machine). The slow candidate below is ten times slower.
QUICK = CanarySettings(round_s=1.0, max_bake_s=20.0, min_requests=20, max_latency_regression_pct=300.0)
LIVE = {"tokens": np.random.default_rng(3).integers(1, 50, size=(1, 96)).astype(np.int64)}  # long, not the opt


def _rounds(rng: np.random.Generator, n: int, replica_bias: float, candidate: float) -> list[tuple[Side, Side]]:
    """n rounds of (canary, stable) on a machine whose canary replica is `replica_bias` times slower by itself and
    serves a candidate `candidate` times slower than stable, each round with 2% noise on each side."""
    return [
        (
            Side(100, 0, 2.0 * replica_bias * candidate * rng.lognormal(0, 0.02), None),
            Side(100, 0, 2.0 * rng.lognormal(0, 0.02), None),
        )
        for _ in range(n)
    ]


@pytest.mark.parametrize(("candidate", "decision"), [(1.0, "pass"), (1.3, "fail")])
def test_the_effects_are_what_the_switch_changed_not_what_sets_the_replicas_apart(candidate, decision):
    rng = np.random.default_rng(0)
    settings = CanarySettings(round_s=1, max_bake_s=30)
    before = _rounds(rng, 5, replica_bias=1.15, candidate=1.0)  # both replicas on stable: prod-0 is 15% slower
    found = effects(_rounds(rng, 8, replica_bias=1.15, candidate=candidate), before, settings)
    latency = next(e for e in found if e.name == "mean latency")
    assert abs(latency.estimate - (candidate - 1)) < 0.08 and judge(found) == decision
    # without the rounds before the switch the replica's own 15% would fail an equal candidate
    assert effects(_rounds(rng, 8, 1.15, 1.0), _rounds(rng, 5, 1.0, 1.0), settings)[0].low > 0.10


def test_failed_requests_compare_with_the_failures_before_the_switch():
    settings = CanarySettings(round_s=1, max_bake_s=30, max_latency_regression_pct=None)
    quiet = [(Side(100, 0, 2.0, None), Side(100, 0, 2.0, None))] * 5
    assert judge(effects(quiet, quiet, settings)) == "pass"  # no failure anywhere: exactly no change
    failing = [(Side(100, 5, 2.0, None), Side(100, 0, 2.0, None))] * 5
    assert judge(effects(failing, quiet, settings)) == "fail"


def _staged(stack: EmbeddedStack, folder) -> int:
    published = publish(RunContext(repository(stack), "", s3=stack.s3), folder=folder)
    staged = stage(RunContext(repository(stack), published.model, published.version, stack.gate.replica, stack.s3))
    assert staged.accuracy_passed, staged.load_error
    return published.version


def _served(stack: EmbeddedStack, name: str) -> list[int]:
    from components.serving.triton_admin import TritonAdmin

    return [TritonAdmin(s.http_url).served_version(name, LIVE, ["scores"]) for s in stack.replicas]


def _promote(stack: EmbeddedStack, name: str, version: int, settings: CanarySettings = QUICK, **kwargs):
    targets = kwargs.pop("targets", None) or replicas(stack)
    context = RunContext(repository(stack), name, version, stack.gate.replica, stack.s3)
    return promote(context, PromoteSettings(canary=settings), replicas=targets, verdict="pass", **kwargs)


def _reverted(result: PromoteResult) -> str:
    """What `tritonship promote` says when the canary reverted the promotion (exit 1)."""
    assert result.outcome is Outcome.REVERTED and result.canary and result.canary.outcome == "reverted", result
    return reverted_by_canary(result)


def _history(stack: EmbeddedStack, name: str) -> list[dict]:
    return ModelRepository(repository(stack), stack.s3).history(name)


def _means(canary) -> list[str]:
    """Each round's mean latency (ms) on the canary and the baseline replicas: what a failed assertion shows."""
    return [f"{r.canary.mean_ms}/{r.baseline.mean_ms}" for r in canary.calibration + canary.rounds]


def _release(stack, tmp_path, candidate: dict, client_hz: float = 40):
    """v1 stable everywhere, the candidate (sequence_folder's options) staged; promote with live traffic."""
    name = unique("canary")
    install_stable(stack, sequence_folder(tmp_path, name, seed=1))
    version = _staged(stack, sequence_folder(tmp_path, name, **candidate))
    urls = [s.http_url for s in stack.replicas] if client_hz else []
    with LiveTraffic(
        urls, name, LIVE, ["scores"], rate_hz=client_hz or 1, cpus=stack.replica_cpus[: len(urls)]
    ) as client:
        result = _promote(stack, name, version)
    error = _reverted(result) if result.outcome is Outcome.REVERTED else None
    return name, version, result, error, client


@pytest.mark.slow
def test_an_equal_candidate_passes_the_canary_and_reaches_every_replica_with_no_failed_request(tmp_path, stack):
    name, version, result, error, client = _release(stack, tmp_path, {"seed": 1})
    assert error is None and result.promoted, (error, _means(result.canary))
    canary = result.canary
    assert canary.decision == "pass" and canary.outcome == "promoted"
    assert canary.canary_replicas == ["prod-0"] and canary.baseline_replicas == ["prod-1"]
    assert len(canary.calibration) >= QUICK.min_rounds and all(r.counted for r in canary.calibration[-5:])
    assert canary.counted_rounds >= QUICK.min_rounds and len(canary.rounds) > canary.counted_rounds
    assert canary.rounds[0].note.startswith("warm-up")
    assert {e["name"] for e in canary.effects} == {"mean latency", "failed requests"}  # 1 s rounds: p99 reported only
    assert all(r.canary.requests >= 20 and r.baseline.requests >= 20 for r in canary.rounds if r.counted)
    assert client.failures == [] and client.total > 0
    assert _served(stack, name) == [version, version]
    promoted = next(e for e in _history(stack, name) if e["event"] == "promoted" and e["version"] == version)
    assert promoted["canary"]["decision"] == "pass"
    canary_report.write(canary, tmp_path / "report")  # what the KFP promote task shows
    markdown = (tmp_path / "report" / "report.md").read_text()
    assert (
        markdown.startswith(f"# Canary: {name} v{version} against v1 — **PASS**") and "| before 1 | yes |" in markdown
    )
    assert "<img" in (tmp_path / "report" / "report.html").read_text()  # each limit's interval, plotted


@pytest.mark.slow
def test_a_candidate_slow_only_on_the_live_mix_is_reverted_with_no_failed_request(tmp_path, stack):
    # at the golden inputs' length (8) it costs the same; at the clients' 96 several times more
    name, _version, result, error, client = _release(stack, tmp_path, {"seed": 1, "cubic_work": 8})
    assert error and "failed on live traffic" in error, error
    assert "mean latency" in error and "every replica was reverted to v1" in error.lower()
    assert result.canary.decision == "fail" and result.canary.outcome == "reverted" and result.reverted
    latency = next(e for e in result.canary.effects if e["name"] == "mean latency")
    assert latency["status"] == "beyond" and latency["estimate"] > 3.0, latency
    assert client.failures == [] and _served(stack, name) == [1, 1]
    assert ModelRepository(repository(stack), stack.s3).desired_config(name)[0].version_policy.specific.versions == [1]
    reverted = next(e for e in _history(stack, name) if e["event"] == "reverted")
    assert reverted["canary"]["decision"] == "fail"


@pytest.mark.slow
def test_a_candidate_that_fails_some_live_requests_is_reverted(tmp_path, stack):
    name, _version, result, error, client = _release(stack, tmp_path, {"seed": 1, "fails_when_long": True})
    assert error and "failed requests" in error, error
    failed = next(e for e in result.canary.effects if e["name"] == "failed requests")
    assert failed["status"] == "beyond" and failed["estimate"] == pytest.approx(1.0)  # every long request failed
    assert all(r.canary.failures == r.canary.requests for r in result.canary.rounds[1:])
    assert _served(stack, name) == [1, 1]
    # the client saw the canary's failures, and none once prod-0 was back on v1
    assert client.failures and all(stack.replicas[0].http_url in f for f in client.failures)


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["revert", "promote"])
def test_no_live_traffic_is_inconclusive_and_the_policy_decides(tmp_path, stack, policy):
    name = unique("quiet")
    install_stable(stack, sequence_folder(tmp_path, name, seed=1))
    version = _staged(stack, sequence_folder(tmp_path, name, seed=1))
    settings = CanarySettings(round_s=1.0, max_bake_s=6.0, on_inconclusive=policy)
    if policy == "revert":
        result = _promote(stack, name, version, settings)
        assert "was inconclusive: too few live requests" in _reverted(result)
        assert _served(stack, name) == [1, 1]
    else:
        result = _promote(stack, name, version, settings)
        assert result.promoted and _served(stack, name) == [version, version]
    assert result.canary.decision == "inconclusive" and result.canary.counted_rounds == 0
    assert result.canary.rounds == [] and "nothing was switched" in result.canary.stopped
    assert result.canary.outcome == ("reverted" if policy == "revert" else "promoted")


def test_an_unreachable_metrics_endpoint_fails_the_canary_and_reverts(tmp_path, stack):
    name = unique("nometrics")
    install_stable(stack, sequence_folder(tmp_path, name, seed=1))
    version = _staged(stack, sequence_folder(tmp_path, name, seed=1))
    prod_0, prod_1 = stack.replicas
    silent = [Replica("prod-0", prod_0.http_url, "127.0.0.1:9"), prod_1.replica]  # nothing listens on port 9
    result = _promote(stack, name, version, targets=silent)
    assert "prod-0: the metrics endpoint http://127.0.0.1:9/metrics did not answer" in _reverted(result)
    assert _served(stack, name) == [1, 1]


@pytest.mark.slow
def test_a_canary_replica_killed_mid_bake_fails_the_canary_and_every_replica_serves_stable(tmp_path, stack):
    name = unique("killed")
    install_stable(stack, sequence_folder(tmp_path, name, seed=1))
    version = _staged(stack, sequence_folder(tmp_path, name, seed=1))

    def kill_the_canary(what: str, _replica) -> None:
        if what.startswith("canary round 2:"):
            stack.triton("prod-0").process.kill()
            stack.restart_triton("prod-0", load_models=[name])  # a new pod: the desired state still names v1

    with LiveTraffic(
        [s.http_url for s in stack.replicas], name, LIVE, ["scores"], rate_hz=40, cpus=stack.replica_cpus
    ) as client:
        result = _promote(stack, name, version, progress=kill_the_canary)
    assert "the canary prod-0 no longer serves" in _reverted(result)
    assert result.reverted and _served(stack, name) == [1, 1]
    assert not [f for f in client.failures if stack.replicas[1].http_url in f]  # the stable replica served throughout
