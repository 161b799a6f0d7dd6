"""A clock for tests (components/clock.py's Clock): it moves only when slept on."""

from __future__ import annotations

from collections.abc import Callable


class StepClock:
    """Moves only when slept on; `on_sleep(n)` runs at the nth sleep (another release finishing, say)."""

    def __init__(self, on_sleep: Callable[[int], object] = lambda n: None) -> None:
        self.seconds, self.sleeps, self.on_sleep = 0.0, 0, on_sleep

    def now(self) -> float:
        return self.seconds

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        self.seconds += seconds
        self.on_sleep(self.sleeps)
