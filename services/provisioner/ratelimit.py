"""A token bucket: at most ``rate`` calls per second per site, with a small burst.

Why per site and not global: a slow or throttled cloud must never hold back another
(issue 4, item 4); each site gets its own bucket and its own worker threads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class TokenBucket:
    def __init__(self, rate: float, burst: float | None = None,
                 monotonic: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if rate <= 0:
            raise ValueError("rate must be > 0")
        self.rate = rate
        self.burst = max(1.0, burst if burst is not None else rate)
        self._tokens = self.burst
        self._monotonic = monotonic
        self._sleep = sleep
        self._last = monotonic()
        self._lock = threading.Lock()

    def _refill(self) -> None:
        now = self._monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
        self._last = now

    def try_acquire(self) -> float:
        """Take a token and return 0, or return how long to wait for one."""
        with self._lock:
            self._refill()
            if self._tokens >= 1 - 1e-9:  # tolerance: float refill must not leave us spinning
                self._tokens = max(0.0, self._tokens - 1)
                return 0.0
            return max((1 - self._tokens) / self.rate, 1e-4)

    def acquire(self) -> None:
        while (wait := self.try_acquire()) > 0:
            self._sleep(wait)
