"""Injected time (design rule 6).

Every loop takes a ``Clock`` so the same policy code runs in real time inside a service and
in virtual time inside a simulator or a test, where ``ManualClock.advance`` moves time
forward without waiting.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Wall-clock seconds since the epoch (what gets recorded)."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (what timers use)."""

    def sleep(self, seconds: float) -> None: ...


class RealClock:
    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class ManualClock:
    """Virtual time: starts at ``start`` and moves only when told (or when something sleeps)."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._t = start
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._t

    def monotonic(self) -> float:
        return self.now()

    def advance(self, seconds: float) -> float:
        with self._lock:
            self._t += seconds
            return self._t

    def sleep(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))


class ScaledClock:
    """Real time running ``factor`` times faster: the demo's boot times and job lengths pass
    in minutes of simulated time while the terminal shows seconds."""

    def __init__(self, factor: float = 1.0, start: float | None = None) -> None:
        self.factor = factor
        self._t0_real = time.monotonic()
        self._t0 = time.time() if start is None else start

    def now(self) -> float:
        return self._t0 + (time.monotonic() - self._t0_real) * self.factor

    def monotonic(self) -> float:
        return self.now()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds / self.factor)
