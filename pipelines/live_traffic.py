"""Live clients: each production replica gets unversioned requests at a steady rate, as a Service would spread
them, and which version answered, when, and every failure are counted. The demo and the canary benchmark send
the BERT4Rec histories real users send (`live_request`: 32 to 40 positions, longer than the 8 the gate
measures at); the tests and the gate benchmarks send one fixed request, with the answers each version must give."""

from __future__ import annotations

import math
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping

import numpy as np

from components.serving.triton_admin import TritonAdmin
from pipelines.samples.bert4rec import DEMO

LENGTHS = (32, DEMO.length)  # the live mix's history lengths, both ends included
LIVE_OUTPUTS = ["topk_indices"]  # what the live mix asks for

Request = Mapping[str, np.ndarray]


def live_request(rng: np.random.Generator) -> dict[str, np.ndarray]:
    length = int(rng.integers(LENGTHS[0], LENGTHS[1] + 1))
    items = rng.integers(1, DEMO.items + 1, size=(1, length)).astype(np.int64)
    items[0, -1] = DEMO.items + 1  # the mask token at the end: recommend the next item
    return {"item_ids": items, "mask_pos": np.array([[length - 1]], dtype=np.int64)}


class LiveTraffic:
    """Background clients, one per url, each at `rate_hz`, inside a `with` block.

    `request` is the inputs of every request, or a function that makes each request from the client's random
    generator (seeded with the client's index, so every run sends the same requests). With `expected`
    (version -> outputs), every answer must be exactly its version's; others go into `mismatches` (an ensemble
    mixing old and new members would answer neither). With `cpus` (one set per url), each client runs on its
    replica's CPUs: it waits while its request is served, so on a machine whose replicas share the cores with
    the clients every replica shares its own with the same load (left to the scheduler, the clients settle on
    one core for tens of seconds, and that replica serves slower meanwhile)."""

    def __init__(
        self,
        urls: list[str],
        model: str,
        request: Request | Callable[[np.random.Generator], Request],
        outputs: list[str],
        rate_hz: float = 100.0,
        expected: dict[int, dict[str, np.ndarray]] | None = None,
        cpus: list[frozenset[int] | None] | None = None,
    ) -> None:
        self.model, self.request, self.outputs = model, request, outputs
        self.period = 1 / rate_hz
        self.expected = expected
        self.versions: Counter[int] = Counter()
        self.failures: list[str] = []
        self.mismatches: list[tuple[str, int]] = []
        self._first_answered: dict[int, float] = {}  # version -> time.monotonic() of its first answer
        self._lock = threading.Lock()
        self._stop = threading.Event()
        pinned = cpus or [None] * len(urls)
        self._threads = [
            threading.Thread(target=self._run, args=(u, i, c), daemon=True)
            for i, (u, c) in enumerate(zip(urls, pinned, strict=True))
        ]

    def _run(self, url: str, seed: int, cpus: frozenset[int] | None) -> None:
        if cpus:
            os.sched_setaffinity(0, cpus)  # on Linux, 0 is the calling thread
        rng = np.random.default_rng(seed)
        # 30 s: on this 2-core machine the gate's perf_analyzers and backends share the cores with the
        # production replicas (in a cluster they do not); a request still unanswered then has failed.
        with TritonAdmin(url, timeout=30, retries=1) as admin:
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    inputs = self.request(rng) if callable(self.request) else self.request
                    version, answer = admin.served(self.model, inputs, self.outputs)
                    self._record(url, version, answer)
                except Exception as exc:  # every failure is counted and shown
                    self.failures.append(f"{url}: {exc}")
                self._stop.wait(max(0.0, self.period - (time.monotonic() - started)))

    def _record(self, url: str, version: int, answer: dict[str, np.ndarray]) -> None:
        now = time.monotonic()
        with self._lock:
            self.versions[version] += 1
            self._first_answered[version] = min(now, self._first_answered.get(version, math.inf))
        if self.expected is not None and not _same(answer, self.expected.get(version)):
            self.mismatches.append((url, version))

    def __enter__(self) -> LiveTraffic:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)

    def versions_before(self, moment: float) -> set[int]:
        """The versions that answered some request before `moment` (a time.monotonic() value)."""
        with self._lock:
            return {v for v, first in self._first_answered.items() if first < moment}

    @property
    def total(self) -> int:
        with self._lock:
            return sum(self.versions.values())


def _same(answer: dict[str, np.ndarray], expected: dict[str, np.ndarray] | None) -> bool:
    return expected is not None and all(np.array_equal(answer[k], v) for k, v in expected.items())
