"""Per-site execution: worker threads, a rate limit, and retries for transient errors.

Each site gets its own ``SiteRunner``: ``max_in_flight`` worker threads for launch and
terminate calls, one more thread for polls and reconciliation (so a backlog of launches
never delays seeing the cloud), and one token bucket that every API call of the site goes
through. A slow or failing site fills only its own threads (issue 4, item 4).

Retries: ``call`` retries transient errors with exponential backoff and full jitter
(tenacity), each attempt taking a fresh rate-limit token; capacity and permanent errors
are raised at once for the caller to report.

``InlineRunner`` is the same contract without threads: tasks and observations are handed to
a scheduler the caller owns (the simulator's event queue), retries wait on an injected
``sleep`` (none in virtual time), and there is no token bucket (the simulator models API
latency as the delay before a task runs). Deterministic, so a simulated run replays exactly.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from epu.services.provisioner.errors import classify
from epu.services.provisioner.ratelimit import TokenBucket
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

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

        def attempt() -> T:
            self.bucket.acquire()
            return _observed(self.name, self.on_call, fn, what)

        return _with_retries(self.name, self.retry, self._sleep, attempt, what)

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


def _observed(site: str, on_call: CallObserver | None, fn: Callable[[], T], what: str) -> T:
    if on_call is None:
        return fn()
    started, outcome = time.monotonic(), "ok"
    try:
        return fn()
    except Exception as exc:
        outcome = classify(exc)
        raise
    finally:
        on_call(site, what, time.monotonic() - started, outcome)


def _with_retries(site: str, r: RetryPolicy, sleep: Callable[[float], None], attempt: Callable[[], T],
                  what: str) -> T:
    retrying = Retrying(
        retry=retry_if_exception(lambda e: classify(e) == "transient"),
        wait=wait_exponential_jitter(multiplier=r.initial, max=r.maximum, jitter=r.jitter),
        stop=stop_after_attempt(r.attempts), reraise=True, sleep=sleep,
        before_sleep=lambda rs: log.warning(
            "transient cloud error, retrying", extra={"site": site, "call": what,
                                                      "attempt": rs.attempt_number,
                                                      "error": str(rs.outcome.exception())[:200]}),
    )
    return retrying(attempt)


Scheduler = Callable[[Callable[[], None], str], None]
"""(task, what) → run ``task`` later on the caller's own loop; ``what`` is ``task`` or an
observation kind (``poll``, ``reconcile``)."""


class InlineRunner:
    """``SiteRunner``'s contract, deterministic and without threads (see the module docstring)."""

    def __init__(self, name: str, schedule: Scheduler, retry: RetryPolicy | None = None,
                 sleep: Callable[[float], None] | None = None, on_call: CallObserver | None = None) -> None:
        self.name = name
        self.schedule = schedule
        self.retry = retry or RetryPolicy()
        self._sleep = sleep or (lambda _s: None)
        self.on_call = on_call
        self._observing: set[str] = set()
        self.in_flight = 0
        self.closed = False

    def call(self, fn: Callable[[], T], what: str = "call") -> T:
        try:  # the common case without building a Retrying
            return _observed(self.name, self.on_call, fn, what)
        except Exception as exc:
            if classify(exc) != "transient" or self.retry.attempts <= 1:
                raise
        self._sleep(self.retry.initial)
        r = self.retry
        rest = RetryPolicy(attempts=r.attempts - 1, initial=r.initial, maximum=r.maximum, jitter=r.jitter)
        return _with_retries(self.name, rest, self._sleep, lambda: _observed(self.name, self.on_call, fn, what),
                             what)

    def submit(self, fn: Callable[[], None]) -> None:
        self.in_flight += 1

        def run() -> None:
            try:
                if not self.closed:
                    fn()
            except Exception:
                log.exception("site task failed", extra={"site": self.name})
            finally:
                self.in_flight -= 1

        self.schedule(run, "task")

    def observe(self, kind: str, fn: Callable[[], None]) -> bool:
        if kind in self._observing:
            return False
        self._observing.add(kind)

        def run() -> None:
            try:
                if not self.closed:
                    fn()
            except Exception:
                log.exception("site observation failed", extra={"site": self.name, "task": kind})
            finally:
                self._observing.discard(kind)

        self.schedule(run, kind)
        return True

    def shutdown(self, wait: bool = True) -> None:
        self.closed = True
