"""Running perf_analyzer and reading what it measured.

perf_analyzer's exit code alone never means "fast enough" (docs/design.md section 4): 0 success (also a
sweep cut short by --latency-threshold), 2 unstable measurement, 3 no valid requests, 99 server
unreachable or usage error. A run is usable only with exit 0 and a CSV row for every load asked for.
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from components import log
from components.serving import admin_key
from components.serving.perf_output import LoadPoint, Requests, parse_csv, parse_profile_export
from components.serving.tools import find_perf_analyzer
from components.settings import LoadSettings

LOG = log.get("perf")

EXIT_REASONS = {
    0: "success",
    1: "generic failure",
    2: "the measurement did not stabilise within the allowed trials",
    3: "no valid requests were completed",
    99: "the server was unreachable or the arguments were rejected",
}


@dataclass
class PerfRun:
    """One perf_analyzer invocation."""

    model: str
    version: str
    exit_code: int
    points: list[LoadPoint] = field(default_factory=list)
    csv_text: str = ""
    stderr_tail: str = ""
    seconds: float = 0.0
    # every request of the measured windows, from the profile export
    requests: Requests = field(default_factory=Requests.empty, repr=False)

    @property
    def latencies_us(self) -> np.ndarray:
        return self.requests.latency_us

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and bool(self.points)

    @property
    def reason(self) -> str:
        if self.exit_code == 0 and not self.points:
            return "perf_analyzer exited 0 but wrote no measurement"
        return EXIT_REASONS.get(self.exit_code, f"perf_analyzer exited {self.exit_code}")

    def to_dict(self) -> dict[str, object]:
        return {
            "model": self.model,
            "version": self.version,
            "exit_code": self.exit_code,
            "ok": self.ok,
            "reason": self.reason,
            "seconds": round(self.seconds, 3),
            "requests": int(self.latencies_us.size),
            "points": [asdict(p) for p in self.points],
            "stderr_tail": self.stderr_tail if not self.ok else "",
        }


def write_input_data(samples: Mapping[str, np.ndarray], path: Path, batched: bool, limit: int = 64) -> Path:
    """perf_analyzer's --input-data JSON from real samples: one entry per sample (batch dimension dropped)."""
    count = min(len(next(iter(samples.values()))), limit)
    entries = []
    for i in range(count):
        entry = {}
        for name, array in samples.items():
            value = array[i] if batched else array
            entry[name] = {"content": value.reshape(-1).tolist(), "shape": list(value.shape)}
        entries.append(entry)
        if not batched:
            break
    path.write_text(json.dumps({"data": entries}))
    return path


# A synchronous perf_analyzer thread has one request in flight: at up to 10 ms a request it sends 100/s, and one
# process runs at most 256 such threads. Past what they carry, a fixed rate is not offered: the threads fall behind
# the schedule and the run turns into a closed loop whose throughput is threads / latency (on an H200 tune's
# trials at 50,000/s served 26,322-29,885/s, benchmarks/README.md). Asynchronous requests keep the schedule, but
# only over gRPC: perf_analyzer's HTTP client (2.51) adds an asynchronous request only while its transfer thread is
# not waiting for a response, so a thread sends about one request per response received.
SYNC_RATE_PER_THREAD = 100
SYNC_THREADS_MAX = 256
SYNC_RATE_PER_CLIENT = SYNC_RATE_PER_THREAD * SYNC_THREADS_MAX  # 25,600/s per perf_analyzer process
ASYNC_RATE_PER_THREAD = 5_000  # an asynchronous thread only builds and sends its requests
ASYNC_RATE_PER_CLIENT = 50_000
# the client's CPU time per request at a fixed rate, for how many CPUs pinned clients need (client_cpus_for)
CLIENT_US_PER_REQUEST = {False: 130.0, True: 40.0}  # synchronous, asynchronous


def rate_threads(rate: float) -> int:
    """Client threads for a fixed request rate: each synchronous thread has one request in flight, so at up
    to 10 ms a request it sends 100/s; 16 at least, 256 at most."""
    return min(SYNC_THREADS_MAX, max(16, math.ceil(rate / SYNC_RATE_PER_THREAD)))


def async_threads(rate: float) -> int:
    """Client threads for a fixed request rate sent asynchronously: 4 at least (perf_analyzer's default), 32 at
    most."""
    return min(32, max(4, math.ceil(rate / ASYNC_RATE_PER_THREAD)))


def asynchronous(load: LoadSettings) -> bool:
    """Whether requests at the load's fixed rate are sent asynchronously: as the load says, else over gRPC once
    the rate is beyond what one process's synchronous threads carry (SYNC_RATE_PER_CLIENT)."""
    if not load.request_rate:
        return False
    if load.async_requests is not None:
        return load.async_requests
    return load.protocol == "grpc" and load.request_rate > SYNC_RATE_PER_CLIENT


def rate_clients(load: LoadSettings) -> int:
    """perf_analyzer processes per model that share the load's fixed rate: as the load says, else as many as
    the rate needs at SYNC_RATE_PER_CLIENT (ASYNC_RATE_PER_CLIENT asynchronously) each; one at a concurrency."""
    if not load.request_rate:
        return 1
    if load.clients:
        return load.clients
    per_client = ASYNC_RATE_PER_CLIENT if asynchronous(load) else SYNC_RATE_PER_CLIENT
    return max(1, math.ceil(load.request_rate / per_client))


def per_client(load: LoadSettings) -> LoadSettings:
    """One perf_analyzer process's share of the load (the whole of it at a concurrency)."""
    if not load.request_rate:
        return load
    clients = rate_clients(load)
    return dataclasses.replace(
        load, request_rate=load.request_rate / clients, clients=1, async_requests=asynchronous(load)
    )


def client_cpus_for(load: LoadSettings, targets: int, cpus: set[int] | None) -> set[int] | None:
    """The CPUs the clients of `targets` models run on: `cpus`, unless their requests need more than that many
    CPUs (CLIENT_US_PER_REQUEST at the load's rate); then wherever the scheduler puts them. A group sized for the
    gate's duet at a concurrency (a quarter of the CPUs) would otherwise cap what a fixed rate offers."""
    if not cpus or not load.request_rate:
        return cpus
    needed = targets * load.request_rate * CLIENT_US_PER_REQUEST[asynchronous(load)] / 1e6
    return cpus if needed <= len(cpus) else None


def _arguments(url: str, model: str, input_data: Path, load: LoadSettings, version: str, out: Path) -> list[str]:
    args = [
        "-m",
        model,
        "-u",
        url,
        "-i",
        load.protocol,
        "-b",
        str(load.batch_size),
        "--input-data",
        str(input_data),
        "-p",
        str(load.window_ms),
        "-s",
        str(load.stability_pct),
        "-r",
        str(load.max_trials),
        "-f",
        str(out / "perf.csv"),
        "--profile-export-file",
        str(out / "profile.json"),
        "--measurement-mode",
        "time_windows",
    ]
    if version:
        args += ["-x", version]
    key = admin_key.from_env()
    if key:  # perf_analyzer reads the model's config, an admin API on a locked server
        args += ["-H", f"{admin_key.HEADER}:{key}"]
    if load.percentile:
        args += ["--percentile", str(load.percentile)]
    if load.request_rate:
        if asynchronous(load):
            threads = load.max_threads or async_threads(load.request_rate)
            args += ["--async"]
        else:
            threads = load.max_threads or rate_threads(load.request_rate)
        args += ["--request-rate-range", str(load.request_rate), "--max-threads", str(threads)]
    else:
        args += ["--concurrency-range", str(load.concurrency)]
    return args


@dataclass(frozen=True)
class Target:
    """One model (and version) to measure."""

    model: str
    version: str = ""


def merged(runs: list[PerfRun]) -> PerfRun:
    """One model's run from the perf_analyzer processes that shared its rate: their throughputs added, the
    percentiles of all their requests together, the span all of them measured, exit 0 only if every process
    exited 0."""
    if len(runs) == 1:
        return runs[0]
    first = runs[0]
    broken = next((r for r in runs if not r.ok), None)
    seconds = max(r.seconds for r in runs)
    if broken is not None:
        return PerfRun(
            first.model, first.version, broken.exit_code or 1, [], broken.csv_text, broken.stderr_tail, seconds
        )
    order = np.argsort(np.concatenate([r.requests.start_ns for r in runs]), kind="stable")
    # the seconds every process measured, where each sent its share (the gate counts requests over a span)
    span = (max(r.requests.span_ns[0] for r in runs), min(r.requests.span_ns[1] for r in runs))
    if span[1] <= span[0]:
        span = (min(r.requests.span_ns[0] for r in runs), max(r.requests.span_ns[1] for r in runs))
    requests = Requests(
        np.concatenate([r.requests.start_ns for r in runs])[order],
        np.concatenate([r.requests.latency_us for r in runs])[order],
        span,
    )
    points = [r.points[0] for r in runs]
    throughput = sum(p.throughput for p in points)

    def weighted(name: str) -> float:
        return sum(getattr(p, name) * p.throughput for p in points) / throughput if throughput else 0.0

    def percentile(q: float, name: str) -> float:
        return float(np.percentile(requests.latency_us, q)) if requests.latency_us.size else weighted(name)

    point = LoadPoint(
        concurrency=sum(p.concurrency for p in points),
        throughput=throughput,
        p50_us=percentile(50, "p50_us"),
        p90_us=percentile(90, "p90_us"),
        p95_us=percentile(95, "p95_us"),
        p99_us=percentile(99, "p99_us"),
        server_queue_us=weighted("server_queue_us"),
        server_compute_us=weighted("server_compute_us"),
    )
    return PerfRun(first.model, first.version, 0, [point], first.csv_text, "", seconds, requests)


def measure_together(
    url: str,
    targets: list[Target],
    input_data: Path,
    load: LoadSettings,
    timeout: float = 300.0,
    client_cpus: set[int] | None = None,
) -> list[PerfRun]:
    """Start one perf_analyzer per target at the same moment, each at the full `load`, and wait for all.

    Run together, they see the same seconds of the machine: the gate's duet design. With `client_cpus`,
    all of them run on those CPUs only (tools.client_cpu_groups says why), unless the load's fixed rate needs
    more CPUs than that (client_cpus_for). At a fixed rate beyond one process's reach each target's rate is
    shared by several processes (rate_clients), whose requests make up its one run (merged)."""
    tool = find_perf_analyzer()
    clients = rate_clients(load)
    share = per_client(load)
    cpus = client_cpus_for(load, len(targets), client_cpus)
    with tempfile.TemporaryDirectory(prefix="tritonship-perf-") as tmp:
        jobs = [(target, Path(tmp) / f"{t}-{c}") for t, target in enumerate(targets) for c in range(clients)]
        started = time.monotonic()
        procs = []
        for target, out in jobs:
            out.mkdir()
            procs.append(tool.start(_arguments(url, target.model, input_data, share, target.version, out), cpus))
        results = []
        for proc in procs:
            try:
                remaining = max(1.0, timeout - (time.monotonic() - started))
                stdout, _ = proc.communicate(timeout=remaining)
                results.append((proc.returncode, stdout, time.monotonic() - started))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                results.append((-1, f"perf_analyzer did not finish within {timeout:.0f} s", time.monotonic() - started))
        each = []
        for (target, out), (exit_code, output, seconds) in zip(jobs, results, strict=True):
            csv_text = (out / "perf.csv").read_text() if (out / "perf.csv").exists() else ""
            each.append(
                PerfRun(
                    model=target.model,
                    version=target.version,
                    exit_code=exit_code,
                    points=parse_csv(csv_text) if csv_text else [],
                    csv_text=csv_text,
                    stderr_tail="\n".join(output.strip().splitlines()[-15:]),
                    seconds=seconds,
                    requests=parse_profile_export(out / "profile.json") if exit_code == 0 else Requests.empty(),
                )
            )
    runs = []
    for t, target in enumerate(targets):
        run = merged(each[t * clients : (t + 1) * clients])
        log.event(
            LOG,
            "perf_analyzer",
            model=target.model,
            version=target.version or "latest",
            exit=run.exit_code,
            seconds=f"{run.seconds:.1f}",
            requests=run.latencies_us.size,
            throughput=run.points[0].throughput if run.points else None,
            **({"clients": clients, "asynchronous": asynchronous(load)} if load.request_rate else {}),
        )
        runs.append(run)
    return runs


def measure(
    url: str,
    model: str,
    input_data: Path,
    load: LoadSettings,
    version: str = "",
    timeout: float = 300.0,
) -> PerfRun:
    """Run perf_analyzer once against `model` on the server at `url` (host:port)."""
    return measure_together(url, [Target(model, version)], input_data, load, timeout)[0]
