"""Replica discovery through the real kubernetes client, against a stand-in API server on loopback.

No Kubernetes API server can run here (docs/design.md section 5). The stand-in serves the pod list in
tests/fixtures/k8s_pods.json (its origin is stated in the file) over HTTP, filtering by label selector
as the API does; the kubernetes client does the rest for real: kubeconfig, request, deserialisation.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar
from urllib.parse import parse_qs, urlparse

import pytest
import yaml

from components.serving.replicas import Replica, ReplicaError, resolve

PODS = json.loads((Path(__file__).parent / "fixtures" / "k8s_pods.json").read_text())


class StandInApi(BaseHTTPRequestHandler):
    requests: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        url = urlparse(self.path)
        StandInApi.requests.append(self.path)
        parts = url.path.strip("/").split("/")
        if parts[:3] != ["api", "v1", "namespaces"] or parts[4:] != ["pods"]:
            return self._send(404, {"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404})
        if parts[3] == "forbidden":
            return self._send(403, {"kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403})
        wanted = dict(
            term.split("=", 1) for term in parse_qs(url.query).get("labelSelector", [""])[0].split(",") if term
        )
        items = [
            p
            for p in PODS["items"]
            if p["metadata"]["namespace"] == parts[3] and wanted.items() <= p["metadata"]["labels"].items()
        ]
        self._send(200, {"apiVersion": "v1", "kind": "PodList", "metadata": PODS["metadata"], "items": items})

    def _send(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def kubeconfig(tmp_path, monkeypatch):
    server = ThreadingHTTPServer(("127.0.0.1", 0), StandInApi)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}],
        "users": [{"name": "u", "user": {"token": "test-token"}}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u", "namespace": "triton"}}],
        "current-context": "ctx",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    monkeypatch.setenv("KUBECONFIG", str(path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)  # not in a cluster: use the kubeconfig
    StandInApi.requests = []
    yield path
    server.shutdown()


def test_only_ready_running_pods_count_and_their_http_and_metrics_ports_are_used(kubeconfig):
    replicas = resolve("k8s://triton/app.kubernetes.io/component=production")
    assert replicas == [
        Replica("triton-prod-7d9f-abcde", "10.1.0.11:8000", "10.1.0.11:8002"),
        Replica("triton-prod-7d9f-fghij", "10.1.0.12:9000", "10.1.0.12:8002"),  # port named http
        Replica("triton-prod-7d9f-zzzzz", "10.1.0.16:8000", "10.1.0.16:8002"),  # no port named http: Triton's default
    ]  # not Ready, Pending and terminating pods are left out
    assert "labelSelector=app.kubernetes.io%2Fcomponent%3Dproduction" in StandInApi.requests[0]


def test_gate_is_found_the_same_way(kubeconfig):
    assert resolve("k8s://triton/app.kubernetes.io/component=gate") == [
        Replica("triton-gate-5c6b-abcde", "10.1.0.21:8000", "10.1.0.21:8002")  # metrics: the gate's GPU figures
    ]


def test_no_ready_pods_or_no_permission_are_clear_errors(kubeconfig):
    with pytest.raises(ReplicaError, match="no Ready Triton pods match 'app=none' in namespace 'triton'"):
        resolve("k8s://triton/app=none")
    with pytest.raises(ReplicaError, match="may not list pods in namespace 'forbidden'; apply manifests/rbac/"):
        resolve("k8s://forbidden/app=x")
    with pytest.raises(ReplicaError, match="k8s://<namespace>/<label-selector>"):
        resolve("k8s://triton")


def test_url_lists():
    assert resolve("http://127.0.0.1:8000/, 127.0.0.1:8001, 10.0.0.5:9000:9002") == [
        Replica("127.0.0.1:8000", "127.0.0.1:8000", "127.0.0.1:8002"),  # metrics at Triton's default port
        Replica("127.0.0.1:8001", "127.0.0.1:8001", "127.0.0.1:8002"),
        Replica("10.0.0.5:9000", "10.0.0.5:9000", "10.0.0.5:9002"),  # a third part names the metrics port
    ]
    with pytest.raises(ReplicaError, match="no replicas were given"):
        resolve(" , ")
