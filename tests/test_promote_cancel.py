"""A promotion stopped in any phase, on the embedded stack with live clients on every replica: SIGTERM (a
cancelled Kubeflow run) puts every replica back on the stable version at once; SIGKILL leaves a record that
`tritonship reconcile` settles. Either way the clients lose no request and the history says why.

Each signal is sent on an event of the promotion (its progress callback, or a line its log prints), never
after a sleep."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from components.release.promote.cancel import Cancelled, cancellable, raise_pending
from components.release.promote.promote import PromotionCancelled, promote
from components.release.run_context import RunContext
from components.repository import ModelRepository
from components.serving.triton_admin import TritonAdmin
from pipelines.live_traffic import LiveTraffic
from pipelines.stack import EmbeddedStack
from tests.models import sequence_folder
from tests.release_helpers import (
    ABSOLUTE_GATE,
    NO_CANARY,
    install_stable,
    replicas,
    repository,
    stage_and_gate,
    unique,
)

LIVE = {"tokens": np.random.default_rng(3).integers(1, 50, size=(1, 96)).astype(np.int64)}


def _released_over_stable(stack: EmbeddedStack, tmp_path: Path, out: Path | None = None) -> tuple[str, int]:
    name = unique("cancel")
    install_stable(stack, sequence_folder(tmp_path, name, seed=1))
    version, _staged, verdict = stage_and_gate(stack, sequence_folder(tmp_path, name, seed=2), ABSOLUTE_GATE, out)
    assert verdict.verdict == "pass", verdict.reasons
    return name, version


def _clients(stack: EmbeddedStack, name: str) -> LiveTraffic:
    return LiveTraffic(
        [s.http_url for s in stack.replicas], name, LIVE, ["scores"], rate_hz=40, cpus=stack.replica_cpus
    )


def _served(stack: EmbeddedStack, name: str) -> list[list[int]]:
    found = []
    for server in stack.replicas:
        with TritonAdmin(server.http_url) as admin:
            found.append(admin.ready_versions(name))
    return found


def _assert_back_on_stable(stack: EmbeddedStack, name: str, client: LiveTraffic) -> dict:
    repo = ModelRepository(repository(stack), stack.s3)
    desired, _etag = repo.desired_config(name)
    assert _served(stack, name) == [[1], [1]] and list(desired.version_policy.specific.versions) == [1]
    assert repo.promotion(name) is None and repo.lease(name) is None
    assert client.failures == [] and client.total > 0
    return repo.history(name)[-1]


class _SignallingStream:
    """A log stream whose write receives SIGTERM: the moment a command's signal lands inside a log line."""

    def write(self, _text: str) -> None:
        signal.raise_signal(signal.SIGTERM)

    def flush(self) -> None:
        pass


def test_a_signal_swallowed_by_a_log_write_is_raised_at_the_next_checkpoint(capsys):
    logger = logging.getLogger("tritonship.test-cancel")
    handler = logging.StreamHandler(_SignallingStream())
    logger.addHandler(handler)
    try:
        with cancellable():
            logger.warning("a line")  # logging's handleError swallows the Cancelled that the write raised
            assert "Cancelled: stopped by SIGTERM" in capsys.readouterr().err
            with pytest.raises(Cancelled, match="stopped by SIGTERM"):
                raise_pending()
        raise_pending()  # a new block starts with nothing pending
    finally:
        logger.removeHandler(handler)


# (what the progress callback says when the signal goes, the phase then running); the canary phase is the
# command's own test below, with its bake of live rounds
MOMENTS = [
    ("copy phase", "copy"),
    ("switched prod-0", "roll"),  # the desired state names the candidate; prod-0 serves it, prod-1 not yet
    ("finish phase", "finish"),  # every replica serves the candidate
]


@pytest.mark.slow
@pytest.mark.parametrize(("moment", "phase"), MOMENTS, ids=[p for _, p in MOMENTS])
def test_sigterm_in_each_phase_puts_every_replica_back_on_stable(moment, phase, tmp_path, stack):
    name, version = _released_over_stable(stack, tmp_path)
    sent: list[str] = []

    def signal_at(what: str, replica) -> None:
        said = f"{what} {replica.name}" if what in ("switching", "switched") else what
        if said == moment and not sent:
            sent.append(said)
            os.kill(os.getpid(), signal.SIGTERM)

    context = RunContext(repository(stack), name, version, stack.gate.replica, stack.s3)
    with _clients(stack, name) as client, pytest.raises(PromotionCancelled) as info:
        promote(context, NO_CANARY, replicas=replicas(stack), verdict="pass", progress=signal_at)
    assert sent and f"stopped by SIGTERM in its {phase} phase" in str(info.value)
    assert info.value.exit_code == 130 and info.value.result.reverted
    event = _assert_back_on_stable(stack, name, client)
    assert (event["event"], event["version"], event["phase"]) == ("reverted", version, phase)
    assert event["problems"][0] == f"stopped by SIGTERM in its {phase} phase"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # promote gave the process its handler back


def _cli_promote(stack: EmbeddedStack, verdict: Path, *extra: str) -> subprocess.Popen:
    """`tritonship -v promote` with the stack's environment; its log lines come on stderr."""
    targets = ",".join(s.replica_spec for s in stack.replicas)
    argv = [sys.executable, "-m", "pipelines.cli", "-v", "promote", "-r", repository(stack), "--verdict", str(verdict)]
    argv += ["--replicas", targets, "--canary-round-s", "1", "--canary-max-bake-s", "20"]
    argv += ["--canary-max-latency-regression-pct", "100", *extra]
    env = {**os.environ, **stack.env(), "AWS_ENDPOINT_URL_S3": stack.s3.endpoint_url, "COLUMNS": "200"}
    return subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _signal_on_line(process: subprocess.Popen, needle: str, signum: int) -> list[str]:
    """Read the process's log until a line holds `needle`, then send `signum`; the lines read, and the rest."""
    lines = []
    for line in process.stderr:
        lines.append(line)
        if needle in line:
            process.send_signal(signum)
            break
    out, err = process.communicate(timeout=120)
    return lines + err.splitlines(keepends=True) + [out]


@pytest.mark.slow
def test_sigterm_to_the_promote_command_in_its_canary_reverts_and_says_so(tmp_path, stack):
    name, version = _released_over_stable(stack, tmp_path, tmp_path / "gate")
    with _clients(stack, name) as client:
        process = _cli_promote(stack, tmp_path / "gate" / "verdict.json")
        canary = f"replica switched replica={stack.replicas[0].replica.url}"
        said = " ".join("".join(_signal_on_line(process, canary, signal.SIGTERM)).split())
    assert process.returncode == 130, said
    assert f"{name} v{version} was stopped by SIGTERM in its canary phase; every replica was reverted to v1" in said
    assert "Traceback" not in said and stack.s3.secret_access_key not in said
    event = _assert_back_on_stable(stack, name, client)
    assert (event["event"], event["phase"]) == ("reverted", "canary")


@pytest.mark.slow
def test_sigkill_in_the_canary_then_reconcile_puts_every_replica_back_on_stable(tmp_path, stack):
    name, version = _released_over_stable(stack, tmp_path, tmp_path / "gate")
    repo = ModelRepository(repository(stack), stack.s3)
    with _clients(stack, name) as client:
        process = _cli_promote(stack, tmp_path / "gate" / "verdict.json")
        _signal_on_line(process, f"replica switched replica={stack.replicas[0].replica.url}", signal.SIGKILL)
        assert process.returncode == -signal.SIGKILL
        assert _served(stack, name)[0] == [version]  # the canary replica was left on the candidate
        record = repo.promotion(name)
        assert (record["phase"], record["version"]) == ("canary", version)
        targets = ",".join(r.url for r in replicas(stack))
        env = {**os.environ, **stack.env(), "AWS_ENDPOINT_URL_S3": stack.s3.endpoint_url, "COLUMNS": "200"}
        argv = [sys.executable, "-m", "pipelines.cli", "reconcile", "-r", repository(stack), "-m", name]
        done = subprocess.run([*argv, "--replicas", targets], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"settled: the unfinished promotion of v{version} (stopped in its canary phase) was reverted" in done.stdout
    event = _assert_back_on_stable(stack, name, client)
    assert (event["event"], event["phase"], event["settled_by"]) == ("reverted", "canary", "reconcile")
    assert "never finished" in json.dumps(event["problems"])
