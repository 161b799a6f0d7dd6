"""Soak: 6 consecutive releases of one model, passing and failing candidates mixed, while a client sends
unversioned requests to both production replicas the whole time."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import pytest

from components.release.gate.gate import gate
from components.release.promote.promote import promote, reject
from components.release.publish import publish
from components.release.run_context import RunContext
from components.release.stage import stage
from components.repository import ModelRepository
from components.serving.triton_admin import TritonAdmin
from components.settings import GateSettings, Thresholds
from pipelines.live_traffic import LiveTraffic
from tests.models import mlp_folder
from tests.release_helpers import NO_CANARY, replicas, unique

RELEASES = 6
KEEP = 3
X = {"x": np.ones((1, 16), np.float32)}
# Absolute limits only, short windows: this test is about the release machinery, not the gate's statistics
# (benchmarks/gate_quality.py measures those). The slow candidates sleep 20 ms per request.
SOAK_GATE = GateSettings(
    load=dataclasses.replace(GateSettings().load, window_ms=250),
    thresholds=Thresholds(max_p99_ms=10, max_p99_regression_pct=None, max_throughput_regression_pct=None),
)


def _candidate(tmp_path: Path, name: str, i: int) -> tuple[Path, str]:
    """Every fifth candidate answers wrongly, every fifth (offset) is 20 ms slower (busy work inside its
    TorchScript), the rest pass. Triton's PyTorch backend loads the traced MLP in well under a second."""
    where = tmp_path / f"c{i}"
    where.mkdir()
    if i % 5 == 2:
        return mlp_folder(where, name, seed=i, weights_seed=99), "rejected"
    if i % 5 == 4:
        return mlp_folder(where, name, seed=i, delay_us=20_000), "rejected"
    return mlp_folder(where, name, seed=i), "promoted"


def _processes_under(pid: int) -> list[tuple[int, str]]:
    """(pid, executable name) of every descendant of `pid`, read from /proc."""
    children: dict[int, list[int]] = {}
    names: dict[int, str] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        name, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()
        names[int(entry)] = name
        children.setdefault(int(rest[1]), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append((child, names[child]))
            todo.append(child)
    return found


@pytest.mark.slow
@pytest.mark.timeout(600)  # 6 releases, each gated for at least 5 rounds: about a minute here
def test_six_releases_with_clients_running(tmp_path, stack):
    """A first release gives the client a stable version to call; then 6 releases under load."""
    name = unique("soak")
    repository = f"s3://{stack.bucket}"
    repo = ModelRepository(repository, stack.s3)
    expected_history: list[tuple[str, int]] = []
    last_promoted = None

    def release(i: int) -> None:
        nonlocal last_promoted
        folder, outcome = _candidate(tmp_path, name, i)
        run_id = f"soak-{i}"
        version = publish(RunContext(repository, "", s3=stack.s3, run_id=run_id), folder=folder).version
        context = RunContext(repository, name, version, stack.gate.replica, stack.s3, run_id)
        staged = stage(context)
        verdict = gate(context, SOAK_GATE, staged)
        assert (verdict.verdict == "pass") == (outcome == "promoted"), (i, verdict.reasons)
        if verdict.verdict == "pass":
            promote(context, NO_CANARY, replicas=replicas(stack), verdict="pass")
            last_promoted = version
        else:
            reject(context, verdict.verdict, verdict.reasons)
        expected_history.extend([("published", version), ("staged", version), ("gate", version), (outcome, version)])

    release(0)  # the stable version the client starts on
    with LiveTraffic([s.http_url for s in stack.replicas], name, X, ["y"], rate_hz=50) as client:
        for i in range(1, RELEASES + 1):
            release(i)
            if i % 3 == 0:  # retention under load: Triton downloads every version folder on each load
                assert repo.gc(model=name, keep=KEEP)

    assert client.failures == [], client.failures[:5]
    assert client.total > RELEASES * 10
    # Every answer came from a promoted version: no candidate, rejected or not, was ever served.
    promoted = [v for event, v in expected_history if event == "promoted"]
    assert set(client.versions) <= set(promoted)
    served = [TritonAdmin(s.http_url).served_version(name, X, ["y"]) for s in stack.replicas]
    assert served == [last_promoted] * 2
    assert repo.desired_config(name)[0].version_policy.specific.versions == [last_promoted]

    # The history: complete and in order, one event per step of every release.
    assert [(e["event"], e["version"]) for e in repo.history(name)] == expected_history

    # Nothing left loaded or running: the gate's candidates and the stable it measured were unloaded, each
    # replica serves the one promoted version, no perf_analyzer is left.
    for server in stack.servers.values():
        ready = [
            (m["name"], m["version"])
            for m in TritonAdmin(server.http_url).repository_index()
            if m.get("state") == "READY" and m["name"].startswith(name)
        ]
        assert ready == ([] if server.name == "gate" else [(name, str(last_promoted))]), (server.name, ready)
    assert not [p for p in _processes_under(os.getpid()) if p[1] == "perf_analyzer"]

    # No orphans: nothing incomplete for gc to remove, no lease left; retention kept the newest versions
    # and the served one, and nothing else.
    assert repo.gc(grace_seconds=0, model=name) == []
    assert repo.incomplete_versions(name) == []
    repo.gc(grace_seconds=0, model=name, keep=KEEP)
    newest = list(range(RELEASES + 2 - KEEP, RELEASES + 2))
    assert repo.versions(name, staged=True) == newest
    assert repo.versions(name, staged=False) == promoted[-KEEP:]  # the newest promoted, the served one among them
    assert all(repo.verify(name, v, staged=False) == [] for v in repo.versions(name, staged=False))
    leases = stack.s3.client().list_objects_v2(Bucket=stack.bucket, Prefix="leases/").get("Contents", [])
    assert f"leases/{name}.json" not in [o["Key"] for o in leases]
