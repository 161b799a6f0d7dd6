"""What perf_analyzer writes, read: a load level's row of its CSV (`-f`) and the requests of its measured windows
(`--profile-export-file`)."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np


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
