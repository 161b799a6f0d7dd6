"""Live clients for the demo: each production replica gets unversioned BERT4Rec requests at a steady rate, as
a Service would spread them, with the histories real users send (32 to 40 positions, longer than the 8 the
gate measures at). Which version answered and every failure are counted."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter

import numpy as np

from components.serving.triton_admin import TritonAdmin
from pipelines.samples.bert4rec import DEMO

LENGTHS = (32, DEMO.length)  # the live mix's history lengths, both ends included


def live_request(rng: np.random.Generator) -> dict[str, np.ndarray]:
    length = int(rng.integers(LENGTHS[0], LENGTHS[1] + 1))
    items = rng.integers(1, DEMO.items + 1, size=(1, length)).astype(np.int64)
    items[0, -1] = DEMO.items + 1  # the mask token at the end: recommend the next item
    return {"item_ids": items, "mask_pos": np.array([[length - 1]], dtype=np.int64)}


class LiveTraffic:
    """Background clients, one per replica, at `rate_hz` each, inside a `with` block. With `cpus` (one set per
    url), each client runs on its replica's CPUs: it waits while its request is served, so on a machine whose
    replicas share the cores with the clients every replica shares its own with the same load (left to the
    scheduler, the clients settle on one core for tens of seconds, and that replica serves slower meanwhile)."""

    def __init__(
        self, urls: list[str], model: str, rate_hz: float = 30.0, cpus: list[frozenset[int] | None] | None = None
    ) -> None:
        self.model, self.period = model, 1 / rate_hz
        self.versions: Counter[int] = Counter()
        self.failures: list[str] = []
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
        with TritonAdmin(url, timeout=30, retries=1) as admin:
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    version, _ = admin.served(self.model, live_request(rng), ["topk_indices"])
                    self.versions[version] += 1
                except Exception as exc:  # every failure is counted and shown
                    self.failures.append(f"{url}: {exc}")
                self._stop.wait(max(0.0, self.period - (time.monotonic() - started)))

    def __enter__(self) -> LiveTraffic:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)

    @property
    def total(self) -> int:
        return sum(self.versions.values())
