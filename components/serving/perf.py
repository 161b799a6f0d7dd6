"""Running perf_analyzer and reading what it measured.

perf_analyzer's exit code alone never means "fast enough" (docs/design.md section 4): 0 success (also a
sweep cut short by --latency-threshold), 2 unstable measurement, 3 no valid requests, 99 server
unreachable or usage error. A run is usable only with exit 0 and a CSV row for every load asked for.
"""

from __future__ import annotations

import csv
import io
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


@dataclass(frozen=True)
class LoadPoint:
    """One row of perf_analyzer's CSV: a load level and what it achieved. Latencies in microseconds."""

    concurrency: float
    throughput: float
    p50_us: float
    p90_us: float
    p95_us: float
    p99_us: float
    server_queue_us: float
    server_compute_us: float


@dataclass(frozen=True)
class Requests:
    """The requests perf_analyzer sent inside its measured windows: start times (ns, the host's clock,
    comparable between processes) and latencies (us), and the measured span [start_ns, end_ns]."""

    start_ns: np.ndarray
    latency_us: np.ndarray
    span_ns: tuple[int, int] = (0, 0)

    @classmethod
    def empty(cls) -> Requests:
        return cls(np.empty(0, np.int64), np.empty(0))


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


def parse_profile_export(path: Path) -> Requests:
    """The requests of the measured windows, from perf_analyzer's --profile-export-file."""
    try:
        experiment = json.loads(path.read_text())["experiments"][-1]
    except (OSError, ValueError, KeyError, IndexError):
        return Requests.empty()
    done = [r for r in experiment.get("requests", []) if r.get("response_timestamps")]
    bounds = experiment.get("window_boundaries") or []
    if len(bounds) >= 2:
        start, end = int(bounds[0]), int(bounds[-1])
    elif done:
        start, end = min(r["timestamp"] for r in done), max(r["timestamp"] for r in done)
    else:
        return Requests.empty()
    inside = [r for r in done if start <= r["timestamp"] <= end]
    return Requests(
        np.asarray([r["timestamp"] for r in inside], dtype=np.int64),
        np.asarray([(r["response_timestamps"][0] - r["timestamp"]) / 1000 for r in inside], dtype=np.float64),
        (start, end),
    )


def parse_csv(text: str) -> list[LoadPoint]:
    """perf_analyzer's `-f` CSV: one row per load level."""
    rows = list(csv.DictReader(io.StringIO(text)))
    points = []
    for row in rows:
        load = row.get("Concurrency") or row.get("Request Rate")
        if not load:
            continue
        points.append(
            LoadPoint(
                concurrency=float(load),
                throughput=float(row["Inferences/Second"]),
                p50_us=float(row["p50 latency"]),
                p90_us=float(row["p90 latency"]),
                p95_us=float(row["p95 latency"]),
                p99_us=float(row["p99 latency"]),
                server_queue_us=float(row.get("Server Queue", 0) or 0),
                server_compute_us=float(row.get("Server Compute Infer", 0) or 0),
            )
        )
    return points


def rate_threads(rate: float) -> int:
    """Client threads for a fixed request rate: each synchronous thread has one request in flight, so at up
    to 10 ms a request it sends 100/s; 16 at least, 256 at most."""
    return min(256, max(16, math.ceil(rate / 100)))


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
    all of them run on those CPUs only (tools.client_cpu_groups says why)."""
    tool = find_perf_analyzer()
    with tempfile.TemporaryDirectory(prefix="tritonship-perf-") as tmp:
        outs = [Path(tmp) / str(i) for i in range(len(targets))]
        started = time.monotonic()
        procs = []
        for target, out in zip(targets, outs, strict=True):
            out.mkdir()
            procs.append(tool.start(_arguments(url, target.model, input_data, load, target.version, out), client_cpus))
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
        runs = []
        for target, out, (exit_code, output, seconds) in zip(targets, outs, results, strict=True):
            csv_text = (out / "perf.csv").read_text() if (out / "perf.csv").exists() else ""
            run = PerfRun(
                model=target.model,
                version=target.version,
                exit_code=exit_code,
                points=parse_csv(csv_text) if csv_text else [],
                csv_text=csv_text,
                stderr_tail="\n".join(output.strip().splitlines()[-15:]),
                seconds=seconds,
                requests=parse_profile_export(out / "profile.json") if exit_code == 0 else Requests.empty(),
            )
            log.event(
                LOG,
                "perf_analyzer",
                model=target.model,
                version=target.version or "latest",
                exit=exit_code,
                seconds=f"{seconds:.1f}",
                requests=run.latencies_us.size,
                throughput=run.points[0].throughput if run.points else None,
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
