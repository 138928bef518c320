"""Work queued or running in this provisioner process, by key: at most one task per key.

Why a module of its own: the launch path (``Provisioner``) and the terminate path
(``terminations``) both schedule work on the sites' runners and both ask what the other has in
flight — a terminate waits for a create in flight (``launch:<id>``), reconciliation re-drives
neither a launch nor a terminate that is still running (``terminate:<id>``). One set, one lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class InFlight:
    """Keys of the tasks queued or running here (``launch:<id>``, ``terminate:<id>``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: set[str] = set()

    def claim(self, key: str) -> bool:
        """Take ``key``; False if a task under it is queued or running."""
        with self._lock:
            if key in self._keys:
                return False
            self._keys.add(key)
            return True

    def release(self, key: str) -> None:
        with self._lock:
            self._keys.discard(key)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._keys

    def snapshot(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._keys)

    def busy(self) -> bool:
        with self._lock:
            return bool(self._keys)

    def run(self, key: str, runner: Any, work: Callable[[], None]) -> None:
        """Submit ``work`` to ``runner`` (a site's ``SiteRunner`` or ``InlineRunner``) unless a
        task under ``key`` is queued or running; the key is released when it ends."""
        if not self.claim(key):
            return

        def task() -> None:
            try:
                work()
            finally:
                self.release(key)

        runner.submit(task)


__all__ = ["InFlight"]
