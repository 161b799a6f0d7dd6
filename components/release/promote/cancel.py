"""SIGTERM and SIGINT as an exception, so that a step's clean-up runs.

Kubernetes sends SIGTERM to a pod whose Kubeflow run is cancelled (SIGKILL follows after the grace period),
and a person stops a command with Ctrl-C. Left to Python, SIGTERM ends the process where it stands and SIGINT
raises KeyboardInterrupt, which no step's clean-up catches. TFX's infra validator turns SIGTERM into an
exception for the same reason. While a clean-up runs (`shielded`), a further signal is logged and dropped:
the clean-up is what the signal asked for.

A library may swallow the exception: logging's handlers catch whatever a write raises, so a signal that lands
while a line is written is lost there. The signal stays pending, and the promotion's checkpoints (each phase,
each replica, each canary round) raise it again with `raise_pending`.
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
_pending: int | None = None  # the signal received in this `cancellable` block


class Cancelled(TritonshipError):
    """The process was asked to stop (SIGTERM or SIGINT)."""

    exit_code = 130

    def __init__(self, signum: int) -> None:
        self.signal_name = signal.Signals(signum).name
        super().__init__(f"stopped by {self.signal_name}")


def _raise(signum: int, _frame: FrameType | None) -> None:
    global _pending
    if _shield_depth:
        log.event(LOG, "signal ignored during clean-up", signal=signal.Signals(signum).name, level=30)
        return
    _pending = signum
    raise Cancelled(signum)


def raise_pending() -> None:
    """Raise Cancelled again for a signal received in this block, in case a library swallowed it."""
    if _pending is not None and not _shield_depth:
        raise Cancelled(_pending)


@contextmanager
def cancellable() -> Iterator[None]:
    """Within the block, SIGTERM and SIGINT raise Cancelled in the main thread. Elsewhere (a step run in a
    worker thread) the process's own handling stays: only the main thread can set handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    global _pending
    _pending = None
    previous = {s: signal.signal(s, _raise) for s in SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _pending = None


@contextmanager
def shielded() -> Iterator[None]:
    """A clean-up that a signal must not interrupt (putting replicas back on the stable version)."""
    global _shield_depth
    _shield_depth += 1
    try:
        yield
    finally:
        _shield_depth -= 1
