"""The embedded stack: a real S3 server (moto), real tritonservers and a real perf_analyzer on one machine.

Used by the demo, the CLI (`tritonship stack up|down`) and the tests. No Docker: the servers are the
binaries shipped in PyPI wheels and Triton's PyTorch backend built from Triton's sources (docs/design.md
section 5), installed into `.tools/` by scripts/setup.sh.

    with EmbeddedStack(replicas=2, gate=True) as stack:
        stack.s3.client().put_object(...)
        stack.triton("prod-0").http_url
"""

from __future__ import annotations

import importlib.metadata
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import requests

from components import log
from components.repository.store import PRODUCTION as PRODUCTION_PREFIX
from components.repository.store import STAGING as STAGING_PREFIX
from components.s3 import S3Settings
from components.serving import admin_key
from components.serving.replicas import Replica
from components.serving.tools import find_perf_analyzer, tools_dir
from components.serving.triton_admin import AOTI_BACKEND_ENV
from pipelines import s3_principals
from pipelines.outage import TcpSwitch
from pipelines.processes import ManagedProcess, StackError, free_port, port_is_open, wait_until
from pipelines.triton_install import AOTI_BACKEND, backend_directory, triton_env

LOG = log.get("stack")
# Latency quantiles per model and version, which promote's canary compares (components/release/promote/canary.py). The
# production replicas keep them, the gate does not: on an H200 they held a replica near 10,000 infer/s
# (benchmarks/README.md, "Triton's latency summaries").
LATENCY_SUMMARIES = ("summary_latencies=true", "summary_quantiles=0.99:0.001")  # as the chart's production pods
# Where the stack is, in the environment variables the `tritonship` options read (pipelines/cli/): `stack env`
# exports them, so the steps run here with no address given.
REPOSITORY_ENV, GATE_ENV, GATE_METRICS_ENV = "TRITONSHIP_REPOSITORY", "TRITONSHIP_GATE", "TRITONSHIP_GATE_METRICS"
REPLICAS_ENV, SERVING_TORCH_ENV = "TRITONSHIP_REPLICAS", "TRITONSHIP_SERVING_TORCH"


def gpu_visible() -> bool:
    """An NVIDIA driver is installed (its nvidia-smi is): Triton may then report GPU metrics."""
    return shutil.which("nvidia-smi") is not None


@dataclass
class TritonServer:
    """One tritonserver in EXPLICIT model-control mode, its repositories on the embedded S3."""

    name: str
    repositories: list[str]
    http_port: int
    grpc_port: int
    metrics_port: int
    process: ManagedProcess

    @property
    def http_url(self) -> str:
        """host:port, the form tritonclient and perf_analyzer take."""
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def replica_spec(self) -> str:
        """host:http-port:metrics-port, as `--replicas` takes it (components/serving/replicas.py)."""
        return f"{self.http_url}:{self.metrics_port}"

    @property
    def replica(self) -> Replica:
        return Replica(self.name, self.http_url, f"127.0.0.1:{self.metrics_port}")

    def ready(self) -> bool:
        try:
            return requests.get(f"http://{self.http_url}/v2/health/ready", timeout=1).status_code == 200
        except requests.RequestException:
            return False

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.process.alive():
                raise StackError(
                    f"tritonserver '{self.name}' exited while starting; its log ends with:\n{self.process.log_tail()}"
                )
            if self.ready():
                return
            time.sleep(0.2)
        raise StackError(
            f"tritonserver '{self.name}' was not ready within {timeout:.0f} s; its log ends with:\n"
            f"{self.process.log_tail()}"
        )

    def ports(self) -> list[int]:
        return [self.http_port, self.grpc_port, self.metrics_port]


@dataclass
class S3Server:
    settings: S3Settings
    port: int
    process: ManagedProcess


class EmbeddedStack:
    """S3 + tritonservers + perf_analyzer on loopback ports, torn down completely on exit.

    `replicas` production servers named prod-0, prod-1, ... mount the production prefix; the
    `gate` server also mounts the staging prefix (docs/design.md section 3: the candidate is dark).
    Every tritonserver locks its admin APIs behind this process's admin key (components/serving/admin_key.py):
    the one in the environment, else a new one put there, so this process's own clients send it.
    `locked_apis` narrows which groups are locked; only a benchmark that measures over gRPC opens
    `model-config` (perf_analyzer reads the config and sends its `-H` header over HTTP only).
    """

    def __init__(
        self,
        replicas: int = 1,
        gate: bool = False,
        workdir: Path | None = None,
        bucket: str = "tritonship",
        detach: bool = False,
        start_timeout: float = 90.0,
        s3_switch: bool = False,
        locked_apis: Sequence[str] = admin_key.RESTRICTED_APIS,
    ) -> None:
        self.replica_count = replicas
        self.locked_apis = tuple(locked_apis)
        self.with_gate = gate
        self.bucket = bucket
        self.detach = detach
        self.start_timeout = start_timeout
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="tritonship-stack-"))
        self.s3_server: S3Server | None = None
        self.s3_switch: TcpSwitch | None = None
        self._with_s3_switch = s3_switch
        self.servers: dict[str, TritonServer] = {}
        self.principals: dict[str, S3Settings] = {}  # S3 credentials per principal (pipelines/s3_principals.py)
        self.admin_key = _process_admin_key()
        os.environ[AOTI_BACKEND_ENV] = AOTI_BACKEND  # this process's own loads (components/serving/triton_admin.py)

    def env(self) -> dict[str, str]:
        """What a step run against this stack needs in its environment: S3 credentials, the admin key and
        where the stack is (`addresses`)."""
        return {**self.s3.env(), admin_key.ENV: self.admin_key, AOTI_BACKEND_ENV: AOTI_BACKEND, **self.addresses()}

    def addresses(self) -> dict[str, str]:
        """The repository root, the production replicas as host:http-port:metrics-port (what `--replicas` and
        components/serving/replicas.py `resolve` take), the gate and its metrics, and the torch served."""
        found = {REPOSITORY_ENV: f"s3://{self.bucket}", SERVING_TORCH_ENV: self.serving_torch}
        if self.replicas:
            found[REPLICAS_ENV] = ",".join(s.replica_spec for s in self.replicas)
        if "gate" in self.servers:
            found |= {GATE_ENV: self.gate.http_url, GATE_METRICS_ENV: self.gate.replica.metrics_url}
        return found

    # ----------------------------------------------------------------------------------- lifecycle
    def __enter__(self) -> EmbeddedStack:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> EmbeddedStack:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.start_s3()
        for i in range(self.replica_count):
            self.add_triton(f"prod-{i}", [PRODUCTION_PREFIX])
        if self.with_gate:
            self.add_triton("gate", [PRODUCTION_PREFIX, STAGING_PREFIX], metrics_config=())
        return self

    def stop(self) -> None:
        for server in self.servers.values():
            server.process.stop()
        if self.s3_server is not None:
            self.s3_server.process.stop()
        if self.s3_switch is not None:
            self.s3_switch.close()
        if self._own_workdir and not self.detach:
            shutil.rmtree(self.workdir, ignore_errors=True)

    @property
    def s3(self) -> S3Settings:
        if self.s3_server is None:
            raise StackError("the embedded S3 server is not running")
        return self.s3_server.settings

    def triton(self, name: str) -> TritonServer:
        return self.servers[name]

    @property
    def replicas(self) -> list[TritonServer]:
        return [s for n, s in self.servers.items() if n.startswith("prod-")]

    @property
    def serving_torch(self) -> str:
        """The torch its PyTorch backends were built against: .venv's (scripts/build_pytorch_backend.sh)."""
        return importlib.metadata.version("torch")

    @property
    def replica_cpus(self) -> list[frozenset[int] | None]:
        """Each replica's CPUs, for a client that must run beside its replica (pipelines/live_traffic.py)."""
        return [s.process.cpus for s in self.replicas]

    @property
    def gate(self) -> TritonServer:
        return self.servers["gate"]

    def repository_uri(self, prefix: str = PRODUCTION_PREFIX) -> str:
        return f"s3://{self.bucket}/{prefix}"

    # ------------------------------------------------------------------------------------------ S3
    def start_s3(self) -> S3Settings:
        """moto on a free port; the bucket and the three principals (pipelines/s3_principals.py) are made
        before IAM is enforced, and the stack's own S3 settings are then the pipeline's."""
        for _attempt in range(3):
            port = free_port()
            endpoint_port = free_port() if self._with_s3_switch else port
            setup = S3Settings(
                endpoint_url=f"http://127.0.0.1:{endpoint_port}",
                region="us-east-1",
                access_key_id="AKIA" + secrets.token_hex(8).upper(),
                secret_access_key=secrets.token_urlsafe(30),
            )
            proc = ManagedProcess(
                "s3",
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                {**os.environ, "PYTHONUNBUFFERED": "1"},
                self.workdir / "logs" / "s3.log",
                detach=self.detach,
            )
            proc.start()
            if wait_until(lambda port=port: port_is_open(port), proc, 30):
                if self._with_s3_switch:
                    self.s3_switch = TcpSwitch(port, endpoint_port)
                self._create_bucket(setup)
                self.principals = s3_principals.create(setup, self.bucket)
                s3_principals.enforce(f"http://127.0.0.1:{port}")
                self.s3_server = S3Server(self.principals["pipeline"], port, proc)
                log.event(LOG, "s3 ready", endpoint=setup.endpoint_url, bucket=self.bucket)
                return self.s3
            proc.stop()
        raise StackError(f"the embedded S3 server did not start; its log ends with:\n{proc.log_tail()}")

    def _create_bucket(self, setup: S3Settings) -> None:
        client = setup.client()
        client.create_bucket(Bucket=self.bucket)
        # S3 has no directories: Triton needs at least one object under a repository prefix to
        # accept it as a model repository.
        for prefix in (PRODUCTION_PREFIX, STAGING_PREFIX):
            client.put_object(Bucket=self.bucket, Key=f"{prefix}/.tritonship-repository", Body=b"")

    # -------------------------------------------------------------------------------------- Triton
    def add_triton(
        self, name: str, prefixes: Sequence[str], metrics_config: Sequence[str] = LATENCY_SUMMARIES
    ) -> TritonServer:
        """Start one more tritonserver mounting `prefixes` of the bucket, and wait until it is ready;
        `metrics_config` gives its `--metrics-config` settings."""
        last_error: StackError | None = None
        for _attempt in range(3):
            ports = [free_port(), free_port(), free_port()]
            args = [
                *[f"--model-repository={self.s3.triton_uri(self.bucket, p)}" for p in prefixes],
                "--model-control-mode=explicit",
                "--strict-model-config=false",
                f"--http-port={ports[0]}",
                f"--grpc-port={ports[1]}",
                f"--metrics-port={ports[2]}",
                "--http-address=127.0.0.1",
                "--grpc-address=127.0.0.1",
                f"--allow-gpu-metrics={'true' if gpu_visible() else 'false'}",  # nv_gpu_* for the reports
                "--allow-cpu-metrics=true",
                *[f"--metrics-config={setting}" for setting in metrics_config],
                "--exit-timeout-secs=5",
                "--log-verbose=0",
                *admin_key.triton_args(self.admin_key, self.locked_apis),
            ]
            try:
                return self.launch_triton(name, args, prefixes)
            except StackError as exc:
                last_error = exc
                if "Address already in use" not in str(exc):
                    raise
        assert last_error is not None
        raise last_error

    def launch_triton(self, name: str, args: Sequence[str], prefixes: Sequence[str] = ()) -> TritonServer:
        """Start the embedded tritonserver with `args` as given (for example as the Helm chart renders
        them), adding only the embedded backends' directory, and wait until it is ready. It reads S3
        as the gate principal if it mounts the staging repository, else as a production replica."""
        if name in self.servers:
            raise StackError(f"a server named {name!r} already exists")
        flags = dict(a.removeprefix("--").split("=", 1) for a in args if a.startswith("--") and "=" in a)
        ports = [
            int(flags.get(f"{kind}-port", default))
            for kind, default in (("http", 8000), ("grpc", 8001), ("metrics", 8002))
        ]
        binary = tools_dir() / "pytriton" / "tritonserver" / "bin" / "tritonserver"
        argv = [str(binary), *args, f"--backend-directory={backend_directory(self.workdir)}"]
        principal = "gate" if any(a.rstrip("/").endswith(f"/{STAGING_PREFIX}") for a in args) else "production"
        env = triton_env(self.principals[principal])
        proc = ManagedProcess(name, argv, env, self.workdir / "logs" / f"{name}.log", self.detach, _replica_cpus(name))
        server = TritonServer(name, list(prefixes), *ports, proc)
        proc.start()
        try:
            server.wait_ready(self.start_timeout)
        except StackError:
            proc.stop()
            raise
        self.servers[name] = server
        log.event(LOG, "triton ready", name=name, http=server.http_url, grpc=server.grpc_url)
        return server

    def restart_triton(self, name: str, load_models: Sequence[str] = ()) -> TritonServer:
        """Start a stopped or killed server again on the same ports, as a restarted pod would: with
        `--load-model` for each model the Helm chart lists, so it loads their desired state from S3."""
        server = self.servers[name]
        server.process.stop()
        server.process.argv = [a for a in server.process.argv if not a.startswith("--load-model=")]
        server.process.argv += [f"--load-model={m}" for m in load_models]
        server.process.start()
        server.wait_ready(self.start_timeout)
        return server

    # ------------------------------------------------------------------------------------ describe
    def describe(self) -> dict[str, object]:
        return {
            "workdir": str(self.workdir),
            "s3": {"endpoint_url": self.s3.endpoint_url, "region": self.s3.region, "bucket": self.bucket},
            "production_repository": self.repository_uri(PRODUCTION_PREFIX),
            "staging_repository": self.repository_uri(STAGING_PREFIX),
            "replicas": ",".join(s.replica_spec for s in self.replicas),
            "servers": {
                name: {
                    "http": s.http_url,
                    "grpc": s.grpc_url,
                    "metrics": s.metrics_url,
                    "repositories": [self.s3.triton_uri(self.bucket, p) for p in s.repositories],
                    "pid": s.process.pid,
                    "log": str(s.process.log_path),
                }
                for name, s in self.servers.items()
            },
            "perf_analyzer": str(find_perf_analyzer().path),
        }


def _replica_cpus(name: str) -> frozenset[int] | None:
    """Production replica i runs on CPU i (mod the CPUs allowed), as replicas run on nodes of their own: left to
    the scheduler, two replicas on a 2-core machine take turns sharing a core for 10-20 s at a time, and one
    replica serves 20-30% slower than the other for that long (what promote's canary compares)."""
    if not name.startswith("prod-"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    return frozenset({allowed[int(name.removeprefix("prod-")) % len(allowed)]})


def _process_admin_key() -> str:
    key = admin_key.from_env()
    if not key:
        key = secrets.token_urlsafe(24)
        os.environ[admin_key.ENV] = key
    return key
