"""Which Triton servers to talk to: a list of URLs, or Kubernetes pods found through the kubernetes client.

    --replicas 10.0.0.5:8000,10.0.0.6:8000
    --replicas 127.0.0.1:41000:41002,127.0.0.1:42000:42002               (host:http-port:metrics-port)
    --replicas k8s://triton/app.kubernetes.io/component=production     (namespace/label-selector)

Only pods that are Running, Ready and not being deleted count; the HTTP port is the container port
named `http` (else 8000), the metrics port the one named `metrics` (else 8002). Given as host:port, a
server's metrics endpoint is on the same host at Triton's default port, 8002, unless a third part names it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from components import log
from components.errors import TritonshipError

LOG = log.get("replicas")
K8S_SCHEME = "k8s://"
DEFAULT_HTTP_PORT = 8000
DEFAULT_METRICS_PORT = 8002


class ReplicaError(TritonshipError):
    """The replicas could not be found."""


@dataclass(frozen=True)
class Replica:
    name: str
    url: str  # host:port of Triton's HTTP endpoint
    metrics_url: str = ""  # host:port of its metrics endpoint, where known


def parse_urls(spec: str) -> list[Replica]:
    replicas = []
    for entry in (u.strip().removeprefix("http://").rstrip("/") for u in spec.split(",")):
        if not entry:
            continue
        host, _, ports = entry.partition(":")
        http, _, metrics = ports.partition(":")
        url = f"{host}:{http}" if http else host
        replicas.append(Replica(url, url, f"{host}:{metrics or DEFAULT_METRICS_PORT}"))
    return replicas


def resolve(spec: str, api: Any = None) -> list[Replica]:
    """Replicas from `host:port,...` or `k8s://namespace/label-selector`."""
    if spec.startswith(K8S_SCHEME):
        namespace, _, selector = spec[len(K8S_SCHEME) :].partition("/")
        if not namespace or not selector:
            raise ReplicaError(f"{spec!r}: write Kubernetes replicas as k8s://<namespace>/<label-selector>.")
        replicas = discover_pods(namespace, selector, api)
        if not replicas:
            raise ReplicaError(f"no Ready Triton pods match '{selector}' in namespace '{namespace}'.")
        return replicas
    replicas = parse_urls(spec)
    if not replicas:
        raise ReplicaError("no replicas were given; pass host:port[,host:port...] or k8s://namespace/selector.")
    return replicas


def kubernetes_api() -> Any:
    """CoreV1Api with the in-cluster config (a pipeline step's service account), else the local kubeconfig."""
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        try:
            # The client reads $KUBECONFIG once, at import; read it now.
            config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))
        except (config.ConfigException, FileNotFoundError, TypeError) as exc:
            raise ReplicaError(f"no Kubernetes configuration was found (in-cluster or kubeconfig): {exc}.") from None
    return client.CoreV1Api()


def discover_pods(namespace: str, selector: str, api: Any = None) -> list[Replica]:
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    api = api or kubernetes_api()
    try:
        pods = api.list_namespaced_pod(namespace, label_selector=selector, _request_timeout=10).items
    except ApiException as exc:
        if exc.status == 403:
            raise ReplicaError(
                f"the service account may not list pods in namespace '{namespace}'; apply manifests/rbac/."
            ) from None
        raise ReplicaError(f"listing pods in '{namespace}' failed: {exc.status} {exc.reason}.") from None
    except HTTPError as exc:
        raise ReplicaError(f"the Kubernetes API could not be reached: {type(exc).__name__}.") from None
    replicas = []
    for pod in sorted(pods, key=lambda p: p.metadata.name):
        if not is_ready(pod):
            log.event(
                LOG, "pod skipped (not ready)", pod=pod.metadata.name, phase=pod.status.phase if pod.status else None
            )
            continue
        ip = pod.status.pod_ip
        replicas.append(Replica(pod.metadata.name, f"{ip}:{http_port(pod)}", f"{ip}:{named_port(pod, 'metrics')}"))
    return replicas


def is_ready(pod: Any) -> bool:
    status = pod.status
    if pod.metadata.deletion_timestamp is not None or status is None or status.phase != "Running" or not status.pod_ip:
        return False
    return any(c.type == "Ready" and c.status == "True" for c in status.conditions or [])


def http_port(pod: Any) -> int:
    return named_port(pod, "http")


def named_port(pod: Any, name: str) -> int:
    for container in pod.spec.containers:
        for port in container.ports or []:
            if port.name == name:
                return int(port.container_port)
    return DEFAULT_METRICS_PORT if name == "metrics" else DEFAULT_HTTP_PORT
