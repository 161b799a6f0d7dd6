"""The Helm chart: rendered by a real helm, validated against the Kubernetes schemas, and the Triton
arguments it renders started for real on the embedded stack."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from components.model import model_config
from components.release.publish import publish
from components.release.run_context import RunContext
from components.repository import ModelRepository
from components.serving.tools import tools_dir
from components.serving.triton_admin import TritonAdmin, TritonError
from pipelines.processes import free_port
from tests.models import mlp_folder
from tests.release_helpers import unique

CHART = Path(__file__).resolve().parents[1] / "manifests" / "helm" / "tritonship-triton"
EXAMPLES = CHART.parent / "examples"
K8S_VERSION = "1.33"


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(tools_dir() / "bin" / "helm"), *args], capture_output=True, text=True, timeout=60)


def render(*values: str, sets: tuple[str, ...] = ()) -> list[dict]:
    args = ["template", "rel", str(CHART)]
    for v in values:
        args += ["-f", v]
    for s in sets:
        args += ["--set", s]
    result = helm(*args)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def by_kind(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def test_helm_lint_passes():
    result = helm("lint", "--strict", str(CHART))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    "values",
    [(), (str(EXAMPLES / "aws-irsa.yaml"),), (str(EXAMPLES / "minio-no-gate.yaml"),)],
    ids=["defaults", "aws-irsa", "minio-no-gate"],
)
def test_every_rendered_object_validates_against_the_kubernetes_schemas(values):
    objects = render(*values)
    assert by_kind(objects, "Deployment") and by_kind(objects, "Service")
    for obj in objects:
        if obj["kind"] == "ServiceMonitor":  # a CRD (Prometheus Operator): no schema in Kubernetes itself
            assert obj["spec"]["endpoints"][0]["port"] == "metrics"
            continue
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_production_service_never_selects_the_gate():
    objects = render()
    service = by_kind(objects, "Service")[0]
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "production"
    deployments = {d["metadata"]["labels"]["app.kubernetes.io/component"]: d for d in by_kind(objects, "Deployment")}
    assert set(deployments) == {"production", "gate"}
    gate_labels = deployments["gate"]["spec"]["template"]["metadata"]["labels"]
    assert not set(service["spec"]["selector"].items()) <= set(gate_labels.items())
    gate_args = deployments["gate"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--model-repository=s3://models/tritonship/staging" in gate_args
    prod = deployments["production"]["spec"]["template"]["spec"]
    assert not any("staging" in a for a in prod["containers"][0]["args"])
    assert prod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert prod["terminationGracePeriodSeconds"] > int(
        next(a for a in prod["containers"][0]["args"] if a.startswith("--exit-timeout-secs=")).split("=")[1]
    )
    assert by_kind(objects, "PodDisruptionBudget")[0]["spec"]["minAvailable"] == 1


def test_irsa_values_use_the_role_and_no_secret():
    objects = render(str(EXAMPLES / "aws-irsa.yaml"))
    account = by_kind(objects, "ServiceAccount")[0]
    assert account["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].endswith(":role/triton-s3-read")
    prod = next(d for d in by_kind(objects, "Deployment") if d["metadata"]["name"].endswith("production"))
    assert "replicas" not in prod["spec"]  # the HPA owns it
    env = prod["spec"]["template"]["spec"]["containers"][0]["env"]
    assert [e["name"] for e in env] == ["AWS_DEFAULT_REGION", "TRITONSHIP_ADMIN_KEY"]  # no S3 keys
    assert by_kind(objects, "HorizontalPodAutoscaler")


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("repository.uri=http://not-s3", "/repository/uri"),
        ("image.tag=latest", "/image/tag"),
        ("models[0]=../escape", "/models/0"),
        ("ports.http=0", "/ports/http"),
    ],
)
def test_a_wrong_value_fails_at_install(bad, message):
    result = helm("template", "rel", str(CHART), "--set", bad)
    assert result.returncode != 0 and message in result.stderr


def _container(objects: list[dict], component: str) -> dict:
    deployment = next(d for d in by_kind(objects, "Deployment") if d["metadata"]["name"].endswith(component))
    return deployment["spec"]["template"]["spec"]["containers"][0]


def _container_args(objects: list[dict], component: str, env: dict[str, str]) -> list[str]:
    """The arguments as the kubelet passes them: $(VAR) expanded from the container's environment."""
    container = _container(objects, component)
    assert container["command"] == ["tritonserver"]
    return [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in container["args"]]


def test_admin_apis_are_locked_with_the_secret_and_only_the_pipeline_reaches_the_gate():
    objects = render(sets=("networkPolicy.pipelineNamespaces={kubeflow,ml-releases}",))
    for component in ("production", "gate"):
        container = _container(objects, component)
        key_env = next(e for e in container["env"] if e["name"] == "TRITONSHIP_ADMIN_KEY")
        assert key_env["valueFrom"]["secretKeyRef"] == {"name": "tritonship-triton-admin", "key": "admin-key"}
        locked = [a for a in container["args"] if "restricted" in a]
        assert locked == [
            "--http-restricted-api=model-repository,model-config:tritonship-admin-key=$(TRITONSHIP_ADMIN_KEY)",
            "--grpc-restricted-protocol=model-repository,model-config:tritonship-admin-key=$(TRITONSHIP_ADMIN_KEY)",
        ]
    (policy,) = by_kind(objects, "NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "gate"
    namespaces = [
        f["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
        for f in policy["spec"]["ingress"][0]["from"]
    ]
    assert namespaces == ["kubeflow", "ml-releases"]

    open_chart = render(sets=("adminKey.existingSecret=", "networkPolicy.enabled=false"))
    assert not by_kind(open_chart, "NetworkPolicy")
    assert not any("restricted" in a for a in _container(open_chart, "production")["args"])


def test_latency_summaries_are_kept_on_production_pods_only_with_the_p99_alone_and_can_be_turned_off():
    summaries, p99 = "--metrics-config=summary_latencies=true", "--metrics-config=summary_quantiles=0.99:0.001"
    objects = render()
    assert {summaries, p99} <= set(_container(objects, "production")["args"])
    assert not {summaries, p99} & set(_container(objects, "gate")["args"])
    assert not {summaries, p99} & set(_container(render(sets=("latencySummaries=false",)), "production")["args"])
    every_quantile = _container(render(sets=("latencyQuantiles=",)), "production")["args"]
    assert summaries in every_quantile and not any("summary_quantiles" in a for a in every_quantile)


def test_latency_histograms_are_asked_for_on_production_pods_only_when_turned_on():
    histograms = "--metrics-config=histogram_latencies=true"
    assert histograms not in _container(render(), "production")["args"]
    objects = render(sets=("latencyHistograms=true",))
    assert histograms in _container(objects, "production")["args"]
    assert histograms not in _container(objects, "gate")["args"]


def test_rendered_triton_arguments_come_up_ready_on_the_embedded_stack(tmp_path, stack):
    name = unique("chart")
    folder = mlp_folder(tmp_path, name)
    repo = ModelRepository(f"s3://{stack.bucket}", stack.s3)
    version = publish(RunContext(repo.uri, "", s3=stack.s3), folder=folder).version
    repo.copy_to_production(name, version)
    config = model_config.pin_version(model_config.parse_pbtxt((folder / "config.pbtxt").read_text()), version)
    repo.write_desired_config(name, config, None)

    started = []
    try:
        for component in ("production", "gate"):
            ports = [str(free_port()) for _ in range(3)]
            objects = render(
                sets=(
                    f"repository.uri=s3://{stack.bucket}",
                    f"repository.endpoint={stack.s3.endpoint_url}",
                    f"models={{{name}}}",
                    f"ports.http={ports[0]}",
                    f"ports.grpc={ports[1]}",
                    f"ports.metrics={ports[2]}",
                )
            )
            args = _container_args(objects, component, {"TRITONSHIP_ADMIN_KEY": stack.admin_key})
            server = stack.launch_triton(f"chart-{component}-{name}", args)
            started.append(server)
        production, gate = started
        with TritonAdmin(production.http_url) as admin:
            assert admin.ready_versions(name) == [version]  # --load-model brought the desired state from S3
        with TritonAdmin(gate.http_url) as admin:
            assert admin.ready_versions(name) == []  # the gate loads nothing by itself
            candidate = model_config.pin_version(model_config.renamed(config, f"{name}__candidate"), version)
            admin.load(f"{name}__candidate", candidate)  # the staging repository is mounted
            assert admin.ready_versions(f"{name}__candidate") == [version]
        for server in started:  # the admin API is locked as rendered: without the key nothing is loaded
            with TritonAdmin(server.http_url, key="") as anonymous, pytest.raises(TritonError, match="admin key"):
                anonymous.load(name, config)
    finally:
        for server in started:
            server.process.stop()
            stack.servers.pop(server.name, None)
