"""What the server itself reports while it is measured: GPU utilisation and memory (`nv_gpu_utilization`,
`nv_gpu_memory_used_bytes`, Triton's GPU metrics) and CPU utilisation and memory (`nv_cpu_*`), sampled from
its metrics endpoint (Prometheus text) in the background while perf_analyzer runs.

A server without GPU metrics (a CPU build, or `--allow-gpu-metrics=false`) reports only the CPU figures;
a metrics endpoint that does not answer gives no figures at all, never a failed measurement."""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from typing import Any

import requests

from components import log

LOG = log.get("metrics")
SAMPLE_SECONDS = 0.5
_LINE = re.compile(r"^(nv_(?:gpu|cpu)_(?:utilization|memory_used_bytes))(?:\{[^}]*\})?\s+([-+0-9.eE]+|NaN)\s*$")


def read(metrics_url: str, timeout: float = 2.0) -> dict[str, float] | None:
    """One sample: GPU utilisation (0-1, mean over the GPUs), GPU memory used (bytes, summed), CPU utilisation
    (0-1) and CPU memory used (bytes); None when the endpoint does not answer."""
    url = metrics_url if metrics_url.startswith("http") else f"http://{metrics_url}/metrics"
    try:
        text = requests.get(url, timeout=timeout).text
    except requests.RequestException:
        return None
    values: dict[str, list[float]] = {}
    for line in text.splitlines():
        match = _LINE.match(line)
        if match and match.group(2) != "NaN":
            values.setdefault(match.group(1), []).append(float(match.group(2)))
    sample = {}
    for name, combine, key in (
        ("nv_gpu_utilization", lambda v: sum(v) / len(v), "gpu_util"),
        ("nv_gpu_memory_used_bytes", sum, "gpu_memory_bytes"),
        ("nv_cpu_utilization", lambda v: sum(v) / len(v), "cpu_util"),
        ("nv_cpu_memory_used_bytes", sum, "cpu_memory_bytes"),
    ):
        if values.get(name):
            sample[key] = combine(values[name])
    return sample


@dataclass
class Sampler:
    """Samples the endpoint every SAMPLE_SECONDS inside a `with` block; `summary()` after it."""

    metrics_url: str
    samples: list[dict[str, float]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    def __enter__(self) -> Sampler:
        self._thread = threading.Thread(target=self._run, name="metrics-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            sample = read(self.metrics_url)
            if sample:
                self.samples.append(sample)
            self._stop.wait(SAMPLE_SECONDS)

    def summary(self) -> dict[str, Any]:
        """Mean and peak utilisation in percent, peak memory in GiB, over the samples (empty without any)."""
        out: dict[str, Any] = {"samples": len(self.samples)} if self.samples else {}
        for key, label in (("gpu_util", "gpu_util_pct"), ("cpu_util", "cpu_util_pct")):
            seen = [s[key] * 100 for s in self.samples if key in s]
            if seen:
                out[f"{label}_mean"], out[f"{label}_max"] = sum(seen) / len(seen), max(seen)
        for key, label in (("gpu_memory_bytes", "gpu_memory_gib_max"), ("cpu_memory_bytes", "cpu_memory_gib_max")):
            seen = [s[key] / 2**30 for s in self.samples if key in s]
            if seen:
                out[label] = max(seen)
        return out


def describe(summary: dict[str, Any]) -> str:
    """One line for a report: what the server said about its GPU and CPU while it was measured."""
    if not summary:
        return "no server metrics (the metrics endpoint was not given or did not answer)"
    parts = []
    if "gpu_util_pct_mean" in summary:
        parts.append(
            f"GPU {summary['gpu_util_pct_mean']:.0f}% busy (peak {summary['gpu_util_pct_max']:.0f}%), "
            f"{summary['gpu_memory_gib_max']:.2f} GiB used"
        )
    else:
        parts.append("no GPU metrics (a CPU server)")
    if "cpu_util_pct_mean" in summary:
        parts.append(f"CPU {summary['cpu_util_pct_mean']:.0f}% busy (peak {summary['cpu_util_pct_max']:.0f}%)")
    return "; ".join(parts) + f" over {summary['samples']} samples"
