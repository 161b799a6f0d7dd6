"""One measured point of a served model: perf_analyzer's throughput and latency, the GPU's and host's
utilisation, the host cores each party kept busy (perf_analyzer, tritonserver, the Python steps' stubs),
and per ensemble step Triton's queue and execution (input, execute, output); and the compiled model.pt
alone, no server, as the reference (benchmarks/gpu_bert4rec.py).

A placement says where the client runs: `0` shares every core with the server (one host, as the users
measured); `N` gives perf_analyzer the last N cores and the server the rest, which keeps the client's
threads off the server's cores as a client on another host would.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from benchmarks.compiled_speed import median_ms
from components.serving import perf, server_metrics
from components.serving.triton_admin import TritonAdmin
from components.settings import RELAXED_STABILITY_PCT

WINDOW_MS = 1000
WARM_UP_CONCURRENCY = 32  # TorchScript and CUDA pay their start at each new batch size and instance
RATE_THREADS = 128  # enough client threads for 30,000 requests/s of a few milliseconds each


def rate_load(rate: float, **settings) -> perf.LoadSettings:
    """A fixed rate: RATE_THREADS synchronous threads while one process carries it, else perf's own choice
    (several processes over HTTP, asynchronous requests over gRPC: components/serving/perf.py)."""
    threads = RATE_THREADS if rate <= perf.SYNC_RATE_PER_CLIENT else None
    return perf.LoadSettings(request_rate=rate, max_threads=threads, **settings)


def _process_ticks(pid: int) -> tuple[int, float]:
    """The parent's pid and the CPU seconds (user + system, all threads) of a live process."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if _process_ticks(int(entry))[0] == pid:
                    found.append(int(entry))
            except (FileNotFoundError, ProcessLookupError, IndexError):  # ended while listed
                pass
    return found


def _cpu_seconds(server_pid: int) -> dict[str, float]:
    children = os.times()
    stubs = 0.0
    for child in _children(server_pid):
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            stubs += _process_ticks(child)[1]
    return {
        "client": children.children_user + children.children_system,  # perf_analyzer, once it has ended
        "tritonserver": _process_ticks(server_pid)[1],
        "python_stubs": stubs,
    }


@contextlib.contextmanager
def cores_busy(server_pid: int) -> Iterator[dict]:
    """How many host cores each party kept busy while the block ran (CPU seconds over wall seconds)."""
    figures: dict = {}
    before, started = _cpu_seconds(server_pid), time.monotonic()
    yield figures
    after, wall = _cpu_seconds(server_pid), time.monotonic() - started
    figures.update({party: round((after[party] - before[party]) / wall, 2) for party in after})


def split_cores(server_pid: int, client_cores: int) -> set[int] | None:
    """Pin tritonserver and its stubs (every thread) to all cores but the last `client_cores`, or to all of
    them for 0; returns the client's cores (None: shared)."""
    every = sorted(os.sched_getaffinity(0) | os.sched_getaffinity(server_pid))
    if client_cores >= len(every):
        raise ValueError(f"--client-cpus {client_cores} leaves the server no core of {len(every)}")
    server, client = (every, None) if client_cores == 0 else (every[:-client_cores], set(every[-client_cores:]))
    for pid in [server_pid, *_children(server_pid)]:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(int(tid), server)
    return client


@contextlib.contextmanager
def client_on(cores: set[int] | None) -> Iterator[None]:
    """Processes started inside the block (perf_analyzer) run on `cores`; None: anywhere."""
    if cores is None:
        yield
        return
    own = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)  # this thread's; a child inherits it
    try:
        yield
    finally:
        os.sched_setaffinity(0, own)


@contextlib.contextmanager
def gpu_sampler(metrics_url: str) -> Iterator[dict]:
    """Triton's metrics while the block runs; the GPU's own figures (NVML) beside them when Triton has none."""
    figures: dict = {}
    nvml_samples: list[tuple[float, float]] = []
    stop = threading.Event()

    def nvml() -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:  # no NVML here (a CPU machine)
            return
        while not stop.wait(0.25):
            nvml_samples.append(
                (pynvml.nvmlDeviceGetUtilizationRates(handle).gpu, pynvml.nvmlDeviceGetMemoryInfo(handle).used)
            )

    thread = threading.Thread(target=nvml, daemon=True)
    thread.start()
    with server_metrics.Sampler(metrics_url) as sampler:
        yield figures
    stop.set()
    thread.join(timeout=2)
    figures.update(sampler.summary())
    if "gpu_util_pct_mean" not in figures and nvml_samples:
        figures["nvml_gpu_util_pct_mean"] = statistics.mean(u for u, _ in nvml_samples)
        figures["nvml_gpu_memory_gib_max"] = max(m for _, m in nvml_samples) / 2**30


def step_breakdown(before: dict, after: dict) -> dict:
    """Per model, from two readings of Triton's statistics: requests, mean batch size, and in microseconds
    the mean queue of a request and the mean execution (input, infer, output) a request was in."""
    old = {m["name"]: m for m in before.get("model_stats", [])}
    out = {}
    for now in after.get("model_stats", []):
        was = old.get(now["name"], {})

        def delta(stat: str, key: str = "ns", now: dict = now, was: dict = was) -> float:
            return float(now.get("inference_stats", {}).get(stat, {}).get(key, 0)) - float(
                was.get("inference_stats", {}).get(stat, {}).get(key, 0)
            )

        count = delta("success", "count")
        executions = float(now.get("execution_count", 0)) - float(was.get("execution_count", 0))
        if count > 0:
            # Triton adds a batch's whole duration to each request in it, not a share of it
            parts = {part: delta(f"compute_{part}") / count / 1000 for part in ("input", "infer", "output")}
            out[now["name"]] = {
                "requests": int(count),
                "mean_batch": round(count / executions, 2) if executions else None,
                "queue_us": round(delta("queue") / count / 1000, 1),
                "compute_us": round(sum(parts.values()), 1),
                **{f"compute_{part}_us": round(us, 1) for part, us in parts.items()},
            }
    return out


def plain_model_ms(model_file: Path, inputs: dict[str, np.ndarray], device: str, batches: list[int]) -> list[dict]:
    """The compiled model.pt run in this process, no server: the median milliseconds of one batch (inputs
    already on the device, outputs back on the host) at each batch size, the reference for the backend's."""
    model = torch.jit.load(str(model_file), map_location=device).eval()
    rows = []
    for batch in batches:
        args = [torch.from_numpy(np.resize(a, (batch, *a.shape[1:]))).to(device) for a in inputs.values()]
        ms = median_ms(model, args, device, repeats=50, warmup=10)
        rows.append({"batch": batch, "ms": round(ms, 3), "infer_per_s": round(batch / ms * 1000)})
        print(f"  plain model.pt, batch {batch:>3}: {ms:6.3f} ms ({batch / ms * 1000:,.0f} infer/s)", flush=True)
    return rows


def measure_point(server, name: str, data: Path, load: perf.LoadSettings, client_cores: set[int] | None) -> dict:
    admin = TritonAdmin(server.http_url)
    before = admin.statistics()
    url = server.grpc_url if load.protocol == "grpc" else server.http_url
    with gpu_sampler(server.metrics_url) as gpu, cores_busy(server.process.pid) as cores, client_on(client_cores):
        run = perf.measure(url, name, data, load, timeout=120)
    after = admin.statistics()
    point = run.points[0] if run.ok else None
    return {
        "protocol": load.protocol,
        "client_cores": len(client_cores) if client_cores else 0,
        "concurrency": None if load.request_rate else load.concurrency,
        "request_rate": load.request_rate,
        "ok": run.ok,
        "reason": "" if run.ok else run.reason,
        "throughput": point.throughput if point else None,
        "p50_ms": float(np.percentile(run.latencies_us, 50)) / 1000 if run.latencies_us.size else None,
        "p99_ms": float(np.percentile(run.latencies_us, 99)) / 1000 if run.latencies_us.size else None,
        "server_queue_us": point.server_queue_us if point else None,
        "server_compute_us": point.server_compute_us if point else None,
        "gpu": gpu,
        "cores_busy": cores,
        "steps": step_breakdown(before, after),
    }


def sweep(
    server,
    name: str,
    data: Path,
    protocols: list[str],
    rates: list[float],
    concurrency: list[int],
    client_cores: int = 0,
) -> list[dict]:
    """A warm-up that is not recorded, then each request rate and each concurrency over each protocol, the
    client placed as `client_cores` says (module docstring)."""
    steady = {"window_ms": WINDOW_MS, "stability_pct": RELAXED_STABILITY_PCT}
    cores = split_cores(server.process.pid, client_cores)
    try:
        # The warm-up, unrecorded: every instance batching, then the highest rate's batch sizes, whose first
        # executions are slow (likely CUDA's caching allocator growing): a first point at 20,000/s after a
        # warm-up at concurrency 32 had p99 about twice the next ones'.
        warm_ups = [perf.LoadSettings(concurrency=max(*concurrency, WARM_UP_CONCURRENCY), **steady)]
        warm_ups += [rate_load(max(rates), **steady)] if rates else []
        with client_on(cores):
            for warm_up in warm_ups:
                perf.measure(server.http_url, name, data, warm_up)
        points = []
        for protocol in protocols:
            over = steady | {"protocol": protocol}
            loads = [rate_load(r, **over) for r in rates]
            loads += [perf.LoadSettings(concurrency=c, **over) for c in concurrency]
            for load in loads:
                points.append(measure_point(server, name, data, load, cores))
                p = points[-1]
                at = f"rate {p['request_rate']:g}" if p["request_rate"] else f"conc {p['concurrency']}"
                steps = " ".join(
                    f"{step}:q{s['queue_us']:.0f}/c{s['compute_us']:.0f}/b{s['mean_batch']}"
                    f"/i{s['compute_input_us']:.0f}+x{s['compute_infer_us']:.0f}+o{s['compute_output_us']:.0f}"
                    for step, s in p["steps"].items()
                )
                busy = " ".join(f"{party}:{n:.1f}" for party, n in p["cores_busy"].items())
                print(
                    f"    {protocol:<4} {at:<11} {p['throughput'] or 0:>9,.0f} infer/s  p50 {p['p50_ms'] or 0:6.2f} "
                    f"p99 {p['p99_ms'] or 0:7.2f} ms {steps} cores busy {busy} {p['reason']}",
                    flush=True,
                )
    finally:
        split_cores(server.process.pid, 0)
    return points


def best_within(points: list[dict], max_p99_ms: float) -> dict | None:
    within = [p for p in points if p["ok"] and p["p99_ms"] is not None and p["p99_ms"] <= max_p99_ms]
    return max(within, key=lambda p: p["throughput"], default=None)
