"""The embedded stack is real: S3 -> tritonserver (explicit model control) -> perf_analyzer."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import requests

from components.model import model_config
from components.model.model_folder import load_golden
from components.s3 import S3Settings
from components.serving import admin_key, perf
from components.serving.replicas import resolve
from components.serving.triton_admin import AOTI_BACKEND_ENV, TritonAdmin, TritonError, TritonUnreachable
from components.settings import RELAXED_STABILITY_PCT, LoadSettings
from pipelines.processes import ManagedProcess, pid_alive, port_is_open
from pipelines.stack import GATE_METRICS_ENV, REPLICAS_ENV, EmbeddedStack, S3Server, TritonServer
from tests.models import mlp_folder, upload_folder
from tests.release_helpers import wait_for

REPO = Path(__file__).resolve().parents[1]


def test_model_put_in_s3_is_loaded_answers_and_is_measured(stack, s3, tmp_path):
    folder = mlp_folder(tmp_path, "stack_mlp")
    upload_folder(s3, stack.bucket, folder, "models/stack_mlp")
    golden_in, golden_out = load_golden(folder / "1" / "golden.npz")
    server = stack.replicas[0]
    with TritonAdmin(server.http_url) as admin:
        assert not admin.is_ready("stack_mlp")  # explicit mode: nothing loads by itself
        admin.load("stack_mlp")
        assert admin.is_ready("stack_mlp", 1)
        answer = admin.infer("stack_mlp", golden_in, ["y"])
        np.testing.assert_allclose(answer["y"], golden_out["y"], rtol=1e-5, atol=1e-6)
        # The other replica has not loaded it: model control is per server.
        assert not TritonAdmin(stack.replicas[1].http_url).is_ready("stack_mlp")

        data = perf.write_input_data(golden_in, tmp_path / "input.json", batched=True)
        run = perf.measure(
            server.http_url,
            "stack_mlp",
            data,
            LoadSettings(concurrency=1, window_ms=1000, stability_pct=RELAXED_STABILITY_PCT),
        )
        assert run.exit_code == 0, run.stderr_tail
        assert run.ok and len(run.points) == 1
        point = run.points[0]
        assert point.concurrency == 1 and point.throughput > 10
        assert 0 < point.p50_us <= point.p90_us <= point.p99_us
        served = admin.statistics("stack_mlp")["model_stats"][0]["inference_count"]
        assert served >= point.throughput  # the requests really reached the server

        # two versions at once: the READY ones read from the statistics are the repository index's
        upload_folder(s3, stack.bucket, folder / "1", "models/stack_mlp/2")
        config = model_config.parse_pbtxt((folder / "config.pbtxt").read_text())
        admin.load("stack_mlp", model_config.pin_version(config, 1, 2))
        admin.wait_ready("stack_mlp", 2)
        indexed = [(e["name"], int(e["version"])) for e in admin.repository_index() if e.get("state") == "READY"]
        assert [e for e in indexed if e[0] == "stack_mlp"] == [("stack_mlp", 1), ("stack_mlp", 2)]
        assert admin.ready_models() == {name: [v for n, v in indexed if n == name] for name, _ in indexed}
        admin.unload("stack_mlp")
        assert "stack_mlp" not in admin.ready_models() and admin.ready_versions("stack_mlp") == []


def test_input_data_file_is_perf_analyzer_format(tmp_path):
    samples = {"a": np.arange(6, dtype=np.int64).reshape(2, 3), "b": np.ones((2, 1), np.float32)}
    path = perf.write_input_data(samples, tmp_path / "in.json", batched=True)
    data = json.loads(path.read_text())["data"]
    assert data[1]["a"] == {"content": [3, 4, 5], "shape": [3]}
    assert data[0]["b"] == {"content": [1.0], "shape": [1]}


def test_load_of_model_missing_from_s3_surfaces_tritons_error(stack):
    with TritonAdmin(stack.replicas[0].http_url) as admin, pytest.raises(TritonError) as info:
        admin.load("no_such_model")
    assert "no_such_model" in str(info.value)
    assert "failed to poll from model repository" in str(info.value)


def test_unreachable_server_is_a_clear_error():
    port = _closed_port()
    with pytest.raises(TritonUnreachable, match="did not answer"):
        TritonAdmin(f"127.0.0.1:{port}", timeout=2, retries=1).load("m")


def test_perf_analyzer_against_unreachable_server_is_not_ok(tmp_path):
    data = perf.write_input_data({"x": np.ones((1, 16), np.float32)}, tmp_path / "in.json", batched=True)
    run = perf.measure(f"127.0.0.1:{_closed_port()}", "m", data, LoadSettings(window_ms=500), timeout=60)
    assert run.exit_code == 99
    assert not run.ok and "unreachable" in run.reason


def test_two_stacks_at_once_get_their_own_ports_and_leave_nothing_behind():
    stacks = [EmbeddedStack(replicas=1), EmbeddedStack(replicas=1)]
    errors: list[BaseException] = []

    def start(s: EmbeddedStack) -> None:
        try:
            s.start()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(s,)) for s in stacks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert not errors, errors
        ports = [p for s in stacks for p in [s.s3_server.port, *s.replicas[0].ports()]]
        assert len(set(ports)) == len(ports)
        assert all(s.replicas[0].ready() for s in stacks)
        pids = [s.s3_server.process.pid for s in stacks] + [s.replicas[0].process.pid for s in stacks]
    finally:
        for s in stacks:
            s.stop()
    assert not any(pid_alive(p) for p in pids)
    assert not any(port_is_open(p) for p in ports)
    assert not any(s.workdir.exists() for s in stacks)


def test_killed_owner_leaves_no_server_behind(tmp_path):
    """A test process that dies by SIGKILL takes its servers with it (PR_SET_PDEATHSIG)."""
    script = (
        "import json, sys, time\n"
        "from pipelines.stack import EmbeddedStack\n"
        "s = EmbeddedStack(replicas=1).start()\n"
        "print(json.dumps([s.s3_server.process.pid, s.replicas[0].process.pid, s.replicas[0].http_port]), flush=True)\n"
        "time.sleep(120)\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        s3_pid, triton_pid, http_port = json.loads(owner.stdout.readline())
        assert pid_alive(triton_pid) and port_is_open(http_port)
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    wait_for(lambda: not pid_alive(s3_pid) and not pid_alive(triton_pid), 15, "the owner's S3 and Triton ended")
    wait_for(lambda: not port_is_open(http_port), 15, "the owner's Triton port closed")


def test_stack_up_prints_endpoints_and_stack_down_stops_everything(tmp_path):
    cli = [sys.executable, "-m", "pipelines.cli"]
    state = tmp_path / "state"
    up = subprocess.run(
        [*cli, "stack", "up", "--replicas", "1", "--no-gate", "--state-dir", str(state)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=180,
    )
    assert up.returncode == 0, up.stderr
    assert "S3 endpoint   http://127.0.0.1:" in up.stdout and "bucket tritonship" in up.stdout
    assert "triton prod-0" in up.stdout
    saved = json.loads((state / "state.json").read_text())
    assert oct((state / "state.json").stat().st_mode)[-3:] == "600"
    http = saved["servers"]["prod-0"]["http"]
    assert TritonAdmin(http).is_live()
    again = subprocess.run([*cli, "stack", "up", "--state-dir", str(state)], capture_output=True, text=True, cwd=REPO)
    assert again.returncode != 0 and "already up" in again.stderr

    assert f"replicas      {saved['replicas']}" in up.stdout and 'eval "$(tritonship stack env' in up.stdout
    env = subprocess.run([*cli, "stack", "env", "--state-dir", str(state)], capture_output=True, text=True, cwd=REPO)
    assert "export AWS_ENDPOINT_URL_S3=http://127.0.0.1:" in env.stdout
    assert f"export TRITONSHIP_REPLICAS={saved['replicas']}" in env.stdout

    down = subprocess.run([*cli, "stack", "down", "--state-dir", str(state)], capture_output=True, text=True, cwd=REPO)
    assert down.returncode == 0, down.stderr
    assert not any(pid_alive(p) for p in saved["pgids"])
    assert not TritonAdmin(http, timeout=1, retries=1).is_live()
    assert not (state / "state.json").exists()


def test_the_stacks_env_names_its_replicas_with_metrics_ports_as_the_options_read_them(tmp_path, monkeypatch):
    """No server is started: the stack is given the ports it would have. What `stack env` exports from the
    state file resolves back to the replicas' own urls and metrics urls, and every address it exports is
    read by a `tritonship` option."""
    import typer.main
    from typer.testing import CliRunner

    from pipelines.cli import app

    for name in (admin_key.ENV, AOTI_BACKEND_ENV):  # the constructor sets them in this process; restored after
        monkeypatch.setenv(name, "test")
    stack = EmbeddedStack(replicas=2, gate=True, workdir=tmp_path)
    idle = ManagedProcess("idle", [], {}, tmp_path / "idle.log")  # never started
    stack.s3_server = S3Server(S3Settings("http://127.0.0.1:9000", "us-east-1", "AKIA0", "secret"), 9000, idle)
    for i, name in enumerate(["prod-0", "prod-1", "gate"]):
        stack.servers[name] = TritonServer(name, [], 41000 + 10 * i, 41001 + 10 * i, 41002 + 10 * i, idle)
    (tmp_path / "state.json").write_text(json.dumps({"env": stack.env()}))

    printed = CliRunner().invoke(app, ["stack", "env", "--state-dir", str(tmp_path)])
    assert printed.exit_code == 0, printed.output
    exported = dict(shlex.split(line)[1].split("=", 1) for line in printed.output.splitlines())
    assert exported == stack.env()
    found = resolve(exported[REPLICAS_ENV])
    assert [(r.url, r.metrics_url) for r in found] == [(s.replica.url, s.replica.metrics_url) for s in stack.replicas]
    assert found[1].metrics_url == "127.0.0.1:41012" and exported[GATE_METRICS_ENV] == "127.0.0.1:41022"
    assert exported["TRITONSHIP_SERVING_TORCH"] == stack.serving_torch

    click_app = typer.main.get_command(app)
    read = {
        p.envvar
        for c in ("publish", "stage", "tune", "gate", "promote", "reconcile")
        for p in click_app.commands[c].params
    }
    assert set(stack.addresses()) <= read


def test_the_running_stacks_env_gives_replicas_whose_metrics_answer(stack):
    from pipelines.cli.common import gate_server

    env = stack.env()
    replicas = resolve(env[REPLICAS_ENV])
    assert [r.url for r in replicas] == [s.http_url for s in stack.replicas]
    gate_metrics = gate_server(env["TRITONSHIP_GATE"], env[GATE_METRICS_ENV]).metrics_url
    for metrics in [*(r.metrics_url for r in replicas), gate_metrics]:
        answer = requests.get(f"http://{metrics}/metrics", timeout=5)
        assert answer.status_code == 200, metrics


def _closed_port() -> int:
    from pipelines.processes import free_port

    return free_port()


@pytest.mark.skipif(os.geteuid() != 0 and sys.platform != "linux", reason="needs /proc")
def test_process_group_check_sees_children():
    from pipelines.processes import group_members

    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        assert proc.pid in group_members(proc.pid)
    finally:
        proc.kill()
        proc.wait()
