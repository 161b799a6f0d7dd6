"""SIGTERM and SIGINT as an exception, so that a step's clean-up runs.

Kubernetes sends SIGTERM to a pod whose Kubeflow run is cancelled (SIGKILL follows after the grace period),
and a person stops a command with Ctrl-C. Left to Python, SIGTERM ends the process where it stands and SIGINT
raises KeyboardInterrupt, which no step's clean-up catches. TFX's infra validator turns SIGTERM into an
exception for the same reason. While a clean-up runs (`shielded`), a further signal is logged and dropped:
the clean-up is what the signal asked for.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from components import log
from components.errors import TritonshipError

LOG = log.get("cancel")
SIGNALS = (signal.SIGTERM, signal.SIGINT)
_shield_depth = 0


class Cancelled(TritonshipError):
    """The process was asked to stop (SIGTERM or SIGINT)."""

    exit_code = 130

    def __init__(self, signum: int) -> None:
        self.signal_name = signal.Signals(signum).name
        super().__init__(f"stopped by {self.signal_name}")


def _raise(signum: int, _frame: FrameType | None) -> None:
    if _shield_depth:
        log.event(LOG, "signal ignored during clean-up", signal=signal.Signals(signum).name, level=30)
        return
    raise Cancelled(signum)


@contextmanager
def cancellable() -> Iterator[None]:
    """Within the block, SIGTERM and SIGINT raise Cancelled in the main thread. Elsewhere (a step run in a
    worker thread) the process's own handling stays: only the main thread can set handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _raise) for s in SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@contextmanager
def shielded() -> Iterator[None]:
    """A clean-up that a signal must not interrupt (putting replicas back on the stable version)."""
    global _shield_depth
    _shield_depth += 1
    try:
        yield
    finally:
        _shield_depth -= 1
