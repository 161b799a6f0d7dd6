"""Placing a fault inside a gate's measurement: on the event that perf_analyzer measures, never after a delay."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from components.serving.triton_admin import TritonAdmin
from pipelines.processes import pid_alive


def _perf_analyzer(gate_url: str, model: str) -> int | None:
    """The pid of a live perf_analyzer sending `model` requests to `gate_url`, from /proc; None if there is none."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ours = (
            argv[0].endswith(b"perf_analyzer") and gate_url.encode() in argv and _after(argv, b"-m") == model.encode()
        )
        if ours and pid_alive(int(pid)):
            return int(pid)
    return None


def _after(argv: list[bytes], flag: bytes) -> bytes | None:
    return argv[argv.index(flag) + 1] if flag in argv[:-1] else None


def _inference_count(admin: TritonAdmin, model: str) -> int:
    return sum(s["inference_count"] for s in admin.statistics(model)["model_stats"])


class FaultWhilePerfAnalyzerMeasures(threading.Thread):
    """Runs `action(pid)` once a perf_analyzer of `model` runs against `gate_url` and the gate server has answered
    at least one of its requests: `model`'s inference count in Triton's statistics grew after the process was seen
    (the gate's own warm-up requests come before it starts). Placed on that event, not after a delay, the fault
    lands inside a round however slowly the machine starts perf_analyzer. After join(): `pid`, the perf_analyzer
    the action was run for (None if it did not run), and `error`, what stopped the watch or the action."""

    def __init__(self, gate_url: str, model: str, action: Callable[[int], None], timeout_s: float = 120.0) -> None:
        super().__init__(daemon=True)
        self.gate_url, self.model, self.action, self.timeout_s = gate_url, model, action, timeout_s
        self.pid: int | None = None
        self.error: Exception | None = None
        self.cancelled = threading.Event()

    def run(self) -> None:
        try:
            deadline = time.monotonic() + self.timeout_s
            pid = self._until(lambda: _perf_analyzer(self.gate_url, self.model), deadline, "no perf_analyzer started")
            with TritonAdmin(self.gate_url, timeout=5, retries=1) as admin:
                before = _inference_count(admin, self.model)
                self._until(
                    lambda: _inference_count(admin, self.model) > before, deadline, "perf_analyzer sent no request"
                )
            self.action(pid)
            self.pid = pid
        except Exception as exc:  # read by joined(): a thread's exception would only be printed
            self.error = exc

    def _until(self, found: Callable[[], Any], deadline: float, missing: str) -> Any:
        while time.monotonic() < deadline and not self.cancelled.is_set():
            value = found()
            if value:
                return value
            time.sleep(0.02)
        raise TimeoutError(f"{missing} for {self.model} on {self.gate_url} while the watch lasted")

    def joined(self, timeout_s: float = 10.0) -> int:
        """End the watch (a fault not placed yet must not land in a later gate); the pid the action was run for,
        or the watch's failure raised."""
        self.cancelled.set()
        self.join(timeout_s)
        assert not self.is_alive(), f"the fault's action did not end within {timeout_s:g} s"
        if self.error is not None:
            raise AssertionError(f"the fault was not placed: {self.error!r}") from self.error
        assert self.pid is not None
        return self.pid
