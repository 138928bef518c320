"""Per-site execution: worker threads, a rate limit, and retries for transient errors.

Each site gets its own ``SiteRunner``: ``max_in_flight`` worker threads for launch and
terminate calls, one more thread for polls and reconciliation (so a backlog of launches
never delays seeing the cloud), and one token bucket that every API call of the site goes
through. A slow or failing site fills only its own threads (issue 4, item 4).

Retries: ``call`` retries transient errors with exponential backoff and full jitter
(tenacity), each attempt taking a fresh rate-limit token; capacity and permanent errors
are raised at once for the caller to report.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from services.provisioner.errors import classify
from services.provisioner.ratelimit import TokenBucket

T = TypeVar("T")
log = logging.getLogger("epu.provisioner")


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 6
    initial: float = 0.5
    maximum: float = 20.0
    jitter: float = 1.0


CallObserver = Callable[[str, str, float, str], None]
"""(site, call, seconds, outcome) after every cloud API attempt; outcome is ``ok`` or the
error class (transient, capacity, permanent). The service turns it into a latency histogram."""


class SiteRunner:
    def __init__(self, name: str, rate: float, max_in_flight: int, retry: RetryPolicy | None = None,
                 sleep: Callable[[float], None] | None = None, on_call: CallObserver | None = None) -> None:
        self.name = name
        self.on_call = on_call
        self.retry = retry or RetryPolicy()
        self._sleep = sleep or time.sleep
        self.bucket = TokenBucket(rate, burst=max(1.0, min(rate, float(max_in_flight))), sleep=self._sleep)
        self.workers = ThreadPoolExecutor(max_workers=max_in_flight, thread_name_prefix=f"site-{name}")
        self.observer = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"poll-{name}")
        self._busy_lock = threading.Lock()
        self._observing: set[str] = set()
        self.in_flight = 0

    def call(self, fn: Callable[[], T], what: str = "call") -> T:
        """One API call: rate-limited, transient errors retried with backoff and jitter."""
        r = self.retry

        def attempt() -> T:
            self.bucket.acquire()
            if self.on_call is None:
                return fn()
            started, outcome = time.monotonic(), "ok"
            try:
                return fn()
            except Exception as exc:
                outcome = classify(exc)
                raise
            finally:
                self.on_call(self.name, what, time.monotonic() - started, outcome)

        retrying = Retrying(
            retry=retry_if_exception(lambda e: classify(e) == "transient"),
            wait=wait_exponential_jitter(multiplier=r.initial, max=r.maximum, jitter=r.jitter),
            stop=stop_after_attempt(r.attempts), reraise=True, sleep=self._sleep,
            before_sleep=lambda rs: log.warning(
                "transient cloud error, retrying", extra={"site": self.name, "call": what,
                                                          "attempt": rs.attempt_number,
                                                          "error": str(rs.outcome.exception())[:200]}),
        )
        return retrying(attempt)

    def submit(self, fn: Callable[[], None]) -> Future[None]:
        def run() -> None:
            with self._busy_lock:
                self.in_flight += 1
            try:
                fn()
            except Exception:
                log.exception("site task failed", extra={"site": self.name})
            finally:
                with self._busy_lock:
                    self.in_flight -= 1

        return self.workers.submit(run)

    def observe(self, kind: str, fn: Callable[[], None]) -> bool:
        """Run a poll or reconciliation on the site's observer thread, unless one of that
        kind is already queued or running (a slow cloud must not pile up polls)."""
        with self._busy_lock:
            if kind in self._observing:
                return False
            self._observing.add(kind)

        def run() -> None:
            try:
                fn()
            except Exception:
                log.exception("site observation failed", extra={"site": self.name, "task": kind})
            finally:
                with self._busy_lock:
                    self._observing.discard(kind)

        self.observer.submit(run)
        return True

    def shutdown(self, wait: bool = True) -> None:
        self.workers.shutdown(wait=wait, cancel_futures=not wait)
        self.observer.shutdown(wait=wait, cancel_futures=not wait)
