"""Who may change what production serves: every Triton of the stack answers load, unload, the repository index
and model configs only with the admin key (components/serving/admin_key.py); inference, health and metadata stay open.
The release itself, run with the key, is every other test of the suite."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from components.repository import ModelRepository
from components.serving import admin_key, perf
from components.serving.triton_admin import TritonAdmin, TritonError
from components.settings import RELAXED_STABILITY_PCT, LoadSettings
from pipelines.stack import EmbeddedStack
from tests.models import mlp_folder
from tests.release_helpers import ABSOLUTE_GATE, install_stable, repository, stage_and_gate, unique

X = {"x": np.ones((1, 16), np.float32)}


def _folder(tmp_path: Path, name: str, sub: str, **kwargs) -> Path:
    (tmp_path / sub).mkdir()
    return mlp_folder(tmp_path / sub, name, **kwargs)


def test_without_the_key_admin_calls_are_refused_and_the_stable_model_serves_on(tmp_path, stack):
    name = unique("lock")
    install_stable(stack, _folder(tmp_path, name, "v1"))
    config, _ = ModelRepository(repository(stack), stack.s3).desired_config(name)
    for server, key in itertools.product((stack.replicas[0], stack.gate), ("", "not-the-key")):
        with TritonAdmin(server.http_url, key=key) as outsider:
            for refused in (
                lambda: outsider.unload(name),
                lambda: outsider.load(name, config),
                outsider.repository_index,
                lambda: outsider.model_config(name),
            ):
                with pytest.raises(TritonError, match="admin key"):
                    refused()
            assert outsider.is_live()  # health stays open
        headers = {admin_key.HEADER: key} if key else {}
        raw = requests.post(f"http://{server.http_url}/v2/repository/models/{name}/unload", headers=headers, timeout=10)
        assert raw.status_code == 403, raw.text
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        with pytest.raises(InferenceServerException) as refused_grpc:
            grpc.unload_model(name, headers=headers)
        assert "PERMISSION_DENIED" in str(refused_grpc.value.status()) or "restricted" in refused_grpc.value.message()
        if server is not stack.gate:
            assert grpc.get_model_metadata(name).name == name  # metadata stays open
        grpc.close()
    for replica in stack.replicas:  # nothing was unloaded: the stable version still answers
        assert TritonAdmin(replica.http_url).served_version(name, X, ["y"]) == 1


def test_the_admin_key_appears_in_no_report_log_or_error(tmp_path, stack):
    name = unique("lock")
    _version, _staged, verdict = stage_and_gate(stack, _folder(tmp_path, name, "v1"), ABSOLUTE_GATE, tmp_path / "gate")
    assert verdict.verdict == "pass", verdict.reasons
    with TritonAdmin(stack.gate.http_url, key="wrong") as outsider, pytest.raises(TritonError) as refused:
        outsider.repository_index()
    written = [p for p in (tmp_path / "gate").rglob("*") if p.is_file()]
    logs = list((stack.workdir / "logs").glob("*.log"))
    assert written and logs
    for path in [*written, *logs]:
        assert stack.admin_key.encode() not in path.read_bytes(), path
    assert stack.admin_key not in str(refused.value)


@pytest.mark.slow
def test_a_stack_with_model_config_open_is_measured_over_grpc_and_still_refuses_unload(tmp_path):
    """benchmarks/gpu_bert4rec.py --protocols grpc: perf_analyzer reads the model's config and sends its `-H`
    header over HTTP only, so that benchmark's stack leaves the model-config group open; load and unload stay
    locked."""
    name = unique("grpc")
    with EmbeddedStack(replicas=1, gate=True, locked_apis=["model-repository"]) as bench:
        install_stable(bench, _folder(tmp_path, name, "v1"))
        server = bench.replicas[0]
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        assert grpc.get_model_config(name).config.name == name  # no key needed
        with pytest.raises(InferenceServerException):
            grpc.unload_model(name)
        grpc.close()
        data = perf.write_input_data(X, tmp_path / "in.json", batched=True)
        load = LoadSettings(window_ms=1000, stability_pct=RELAXED_STABILITY_PCT, protocol="grpc")
        run = perf.measure(server.grpc_url, name, data, load, timeout=120)
        assert run.ok and run.points[0].throughput > 10, run.stderr_tail
        assert TritonAdmin(server.http_url).served_version(name, X, ["y"]) == 1  # still loaded and answering
