"""How any EPU service runs: consumers, periodic timers, shutdown, reconnects, health.

A service is a ``Service`` with handlers registered on queues (``consume``) and periodic
tasks (``every``). ``run()`` serves until stopped. Two threads:

* the *connection thread* (the caller of ``run()``) owns the broker connection: it connects
  (failing over across the broker URLs), declares, consumes, reads frames and services
  heartbeats — also while a handler or timer is busy, so a 60 s node command or a slow batch
  poll never makes the broker drop the connection for missed heartbeats. It settles
  (acks) deliveries;
* one *work thread* runs handlers and timers, one at a time, so handlers and timers never
  race each other and need no locks of their own. Services that must do slow I/O
  concurrently (cloud calls) use their own worker threads and ``publish`` (thread-safe, its
  own connection).

Acknowledgement contract (design rule 5): a message is acked only after its handler
returned, i.e. after its effect is stored. What a failure does depends on whether it can
ever succeed:

* the message cannot be used — undecodable, invalid, of a type the queue does not take, too
  large, hostile (``common.inbound``), from a sender not allowed to send it (``common.senders``)
  — or the handler raises ``Reject``: dead-lettered (``dead_letter``): a note of why goes to
  ``epu.notes``, then the message is rejected and the broker moves it, as it was sent, to the
  dead-letter queue (the runtime never writes the dead-letter exchange: ``common.deadletters``);
* the handler hit infrastructure — its database or the broker is away (``is_transient``):
  retried in place with backoff (capped at ``retry_max_seconds``) for as long as it takes,
  nothing dead-lettered, nothing reordered (later messages wait behind it);
* the handler hit infrastructure that no wait cures — a schema that does not match the code
  after an upgrade (``no such column``), a read-only or missing database, a refused login, a
  missing binary (``common.failures``: ``permanent``): the message goes back to its queue
  (nothing lost), that queue's consumer stops, one error line says why, and ``/healthz``
  answers 503 with the reason until the service is restarted (after the fix). A periodic task
  that fails so stops the same way;
* any other exception (a bug, a case the handler cannot take): retried ``max_attempts``
  times with backoff, then dead-lettered with the exception as the reason.

Broker loss, at start or later, any number of times: the service stays up, reports "waiting
for broker" / "reconnecting" on /healthz (HTTP 503), reconnects with exponential backoff and
jitter (trying every URL of the list), redeclares and resumes. A refusal that retrying cannot
mend — a wrong password, a user without permission on the vhost or a queue, a vhost that does
not exist, a TLS certificate that cannot be read (``common.broker.permanent_reason``) — is
retried ``permanent_attempts`` times in a row and ``permanent_seconds`` long (a password being
changed, definitions being loaded), then ``run()`` raises ``BrokerRefused``: the process exits 1 and its supervisor
(systemd's ``Restart=``) sees it, instead of a unit that stays active forever while logging
"waiting for broker". /healthz says which kind each failure is (``error_kind``).

A broker that keeps the connection open but stops answering (RabbitMQ out of file handles:
a declare never returns, issue 34) is not waited on: the connection's setup and the cancel of its
consumers have a deadline (``Broker.call_timeout``, ``common.stall``), after which the connection
is broken, counted (``epu_broker_stalls_total``), named on /healthz and replaced like a lost one.

Shutdown (SIGTERM/SIGINT, or ``stop()``): the message in hand is finished and acked, then the
connection closes; prefetched but unhandled messages return to the queue via the broker.

Timers fire on real (monotonic) time, only while connected: they pace I/O loops. What the
periodic tasks compute uses the injected ``clock``, so virtual-time tests call the cores
directly (e.g. an engine's ``iterate()``) instead of waiting on timers.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from epu.common.broker import (
    PERMANENT_HINTS,
    Broker,
    BrokerRefused,
    BrokerUnavailable,
    Publisher,
    PublishError,
    PublishRefused,
    permanent_reason,
)
from epu.common.clock import Clock, RealClock
from epu.common.consuming import Inbound, RawConsumer
from epu.common.deadletters import NOTE_TYPE, SENDER_NOT_ALLOWED, DeathNote, body_sha256
from epu.common.failures import classify, describe
from epu.common.inbound import allow_deep_headers, open_delivery, safe_headers
from epu.common.messages import DecodeError, Envelope, Message
from epu.common.observability import HealthServer, ServiceMetrics
from epu.common.stall import bounded
from epu.common.topology import (
    ATTEMPTS_HEADER,
    DEAD_AT_HEADER,
    DEATH_NOTES_EXCHANGE,
    ORIGINAL_EXCHANGE_HEADER,
    ORIGINAL_QUEUE_HEADER,
    ORIGINAL_ROUTING_KEY_HEADER,
    REASON_HEADER,
    QueueSpec,
)
from kombu import Queue

Handler = Callable[[Message, Envelope], None]

#: A connection that served this long before it was lost is retried at once (the next node of a
#: cluster is likely up); one that keeps failing sooner backs off (no reconnect storm).
STABLE_SECONDS = 5.0

#: Deliveries handed to the work thread at once (one thread hand-off, not one per message).
MAX_BATCH = 64


class Reject(Exception):
    """Raised by a handler for a message that can never succeed: dead-letter it with this reason."""


class ConsumerLost(ConnectionError):
    """The broker cancelled one of our consumers (queue deleted, node lost): re-establish them."""


#: Errors that say "the infrastructure is away", beside what ``common.failures`` judges by its
#: codes: a broker that could not take a publish.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (PublishError,)


def infrastructure(exc: BaseException, extra: tuple[type[BaseException], ...] = ()) -> str | None:
    """``"transient"`` (retry in place), ``"permanent"`` (stop consuming) or None (the message's
    or a bug's): ``common.failures.classify``, a publish the broker refused being the message's."""
    if getattr(exc, "transient", None) is None and isinstance(exc, PublishRefused):
        return None  # the broker will refuse it again: a permanent failure of this message
    return classify(exc, TRANSIENT_ERRORS + extra)


def is_transient(exc: BaseException, extra: tuple[type[BaseException], ...] = ()) -> bool:
    return infrastructure(exc, extra) == "transient"


@dataclass
class _ConsumerSpec:
    spec: QueueSpec | None
    queue: Queue | None
    handler: Handler
    prefetch: int
    types: frozenset[str] | None
    on_invalid: Callable[[bytes, str], None] | None = None


@dataclass
class _Timer:
    name: str
    period: float
    fn: Callable[[], None]
    next_at: float
    last_run: float = -1e18


@dataclass
class RuntimeSettings:
    max_attempts: int = 3
    """Attempts at a message whose handler fails with a non-transient error before it is dead-lettered."""
    retry_base_seconds: float = 0.2
    retry_max_seconds: float = 10.0
    """Cap of the backoff between retries of a transient failure (which are retried until they succeed)."""
    reconnect_initial: float = 0.5
    reconnect_max: float = 15.0
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    extra_health: dict[str, Callable[[], Any]] = field(default_factory=dict)
    transient_errors: tuple[type[BaseException], ...] = ()
    """More exception types a service's handlers raise for infrastructure trouble."""
    max_busy_seconds: float = 600.0
    """A handler or timer running longer than this makes the service unhealthy (a hang)."""
    permanent_attempts: int = 5
    """Connection attempts the broker refuses permanently (wrong password, no permission, no such
    vhost, unreadable TLS files), in a row, before ``run()`` gives up with ``BrokerRefused``..."""
    permanent_seconds: float = 10.0
    """...and for at least this long (a password being changed, definitions being imported)."""


class Service:
    """One EPU service's message loop. Build, register handlers and timers, then ``run()``."""

    def __init__(self, name: str, broker: Broker, clock: Clock | None = None,
                 settings: RuntimeSettings | None = None) -> None:
        self.name = name
        self.broker = broker
        self.clock = clock or RealClock()
        self.settings = settings or RuntimeSettings()
        self.log = logging.getLogger(f"epu.{name}")
        self.metrics = ServiceMetrics(name)
        self.publisher = Publisher(broker, source=name, metrics=self.metrics)
        self._consumers: list[_ConsumerSpec] = []
        self._timers: list[_Timer] = []
        self._declare: list[QueueSpec] = []
        self._stop = threading.Event()
        self._interrupt = threading.Event()  # stop, or the connection is gone: abandon retries
        self._connected = threading.Event()
        self._ready = threading.Event()
        self._last_loop = time.monotonic()
        self._health_server: HealthServer | None = None
        self._status = "starting"
        self._last_error: str | None = None
        self._error_kind: str | None = None
        self._refusals = 0
        self._refused_since = 0.0
        self._lost_at: float | None = None
        self._inbox: deque[tuple[_ConsumerSpec, str, Inbound]] = deque()
        self._consuming: dict[str, bool] = {}
        self._cancelled: list[str] = []
        self._stopped: dict[str, str] = {}
        """Queues (and periodic tasks, ``timer NAME``) stopped on a permanent failure → why."""
        self._live: dict[str, RawConsumer] = {}
        self._busy_since: float | None = None
        self._busy_with: str | None = None
        self._retrying: dict[str, Any] | None = None
        self.reconnect_count = 0
        self._unfinished: Future[Any] | None = None
        self.sender: str | None = None
        """The validated broker user (``user_id``, which RabbitMQ checks against the connection's
        user) of the message whose handler runs now — set before the handler is called; ``None``
        when it came without one (the in-memory transport). A handler whose effect depends on who
        sent the message (the provisioner's forced terminate) reads it."""
        self._serving_since = 0.0
        self.on_start: list[Callable[[], None]] = []
        self.on_stop: list[Callable[[], None]] = []
        """Called once when ``run()`` ends (after the work thread finished), e.g. to release leases."""
        self.on_connection_lost: list[Callable[[], None]] = []
        """Called (on the work thread, between items) after the broker connection was lost —
        e.g. to drop state that is only valid while this process holds its consumers."""

    # ------------------------------------------------------------------ registration
    def consume(self, spec: QueueSpec, handler: Handler, *, prefetch: int = 10,
                types: set[str] | None = None, on_invalid: Callable[[bytes, str], None] | None = None) -> None:
        """Handle messages from a durable queue of the topology. ``types`` limits which message
        types the handler accepts; others are dead-lettered as unexpected. ``on_invalid(body,
        reason)`` is called after a message that could not be decoded or validated was
        dead-lettered (e.g. so a command whose id is readable still gets a failed result)."""
        self._consumers.append(_ConsumerSpec(spec, None, handler, prefetch, frozenset(types) if types else None,
                                             on_invalid))
        self._declare.append(spec)

    def consume_queue(self, queue: Queue, handler: Handler, *, prefetch: int = 50) -> None:
        """Handle messages from an ad-hoc queue (e.g. an exclusive tap queue)."""
        self._consumers.append(_ConsumerSpec(None, queue, handler, prefetch, None))

    def declare(self, spec: QueueSpec) -> None:
        """Declare a queue this service publishes to but does not consume (so routes exist)."""
        self._declare.append(spec)

    def every(self, seconds: float, fn: Callable[[], None], name: str | None = None,
              initial_delay: float | None = None) -> None:
        delay = seconds if initial_delay is None else initial_delay
        self._timers.append(_Timer(name or fn.__name__, seconds, fn, time.monotonic() + delay))
        self.metrics.known_timer(name or fn.__name__)

    def wake(self, name: str, min_gap_seconds: float) -> bool:
        """Run periodic task ``name`` as soon as possible instead of at its next tick, but no
        sooner than ``min_gap_seconds`` after its last run (a rate limit: a burst of wake-ups
        costs one run). Why: the engine should answer new demand now, not up to a period later,
        as Karpenter's batching window does. True if the task was brought forward."""
        for t in self._timers:
            if t.name == name:
                at = max(time.monotonic(), t.last_run + min_gap_seconds)
                if at < t.next_at:
                    t.next_at = at  # a float store: the I/O thread sees it at its next look
                    return True
                return False
        raise KeyError(f"no periodic task named {name!r}")

    def publish(self, message: Message, correlation_id: str | None = None) -> Envelope:
        return self.publisher.publish(message, correlation_id, timestamp=self.clock.now())

    def publish_many(self, messages: list[Message], correlation_id: str | None = None) -> list[Envelope]:
        """A batch confirmed together (``Publisher.publish_many``): for bursts."""
        return self.publisher.publish_many(messages, correlation_id, timestamp=self.clock.now())

    # ------------------------------------------------------------------ lifecycle
    def stop(self) -> None:
        self._stop.set()
        self._interrupt.set()
        self.publisher.interrupt()  # a publish retrying across an outage gives up: we are leaving

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def wait_ready(self, timeout: float = 10.0) -> bool:
        """True once consumers are registered with the broker (tests and the demo use this)."""
        return self._ready.wait(timeout)

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def health(self) -> dict[str, Any]:
        """What /healthz answers: healthy (200) only while connected, every consumer consuming,
        the loop turning and no handler hung; otherwise 503 with the reason in ``status``."""
        now = time.monotonic()
        age = now - self._last_loop
        busy = None if self._busy_since is None else round(now - self._busy_since, 3)
        consumers = {q: ("consuming" if up else "down") for q, up in self._consuming.items()}
        for q in self._stopped:
            if q in consumers:
                consumers[q] = "stopped"
        doc: dict[str, Any] = {
            "service": self.name,
            "status": "stopping" if self.stopping else self._status,
            "connected": self._connected.is_set(),
            "broker": redact_current(self.broker),
            "consumers": consumers,
            "reconnects": self.reconnect_count,
            "last_error": self._last_error,
            "error_kind": self._error_kind,
            "loop_age_seconds": round(age, 3),
            "busy_seconds": busy,
            "busy_with": self._busy_with,
        }
        if self._retrying:
            doc["retrying"] = dict(self._retrying)
        if self._stopped:
            doc["status"] = "failed"
            doc["stopped"] = dict(self._stopped)
        for key, fn in self.settings.extra_health.items():
            try:
                doc[key] = fn()
            except Exception as exc:  # health must answer even when a probe breaks
                doc[key] = f"error: {exc}"
        doc["healthy"] = bool(doc["connected"] and self._status == "serving" and age < 30 and not self.stopping
                              and not self._stopped
                              and all(v == "consuming" for v in consumers.values())
                              and (busy is None or busy < self.settings.max_busy_seconds))
        return doc

    def install_signal_handlers(self) -> None:
        def handler(signum: int, _frame: Any) -> None:
            self.log.info("signal received, finishing the message in hand", extra={"signal": signum})
            self.stop()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def start_health_server(self) -> int | None:
        if self.settings.metrics_port is None:
            return None
        self._health_server = HealthServer(self.metrics, self.health, self.settings.metrics_host,
                                           self.settings.metrics_port).start()
        self.log.info("metrics and health endpoint up", extra={"port": self._health_server.port})
        return self._health_server.port

    def run(self) -> None:
        """Serve until ``stop()``: connect, declare, consume, fire timers; reconnect on any loss."""
        allow_deep_headers()
        self._status = "waiting for broker"
        self.start_health_server()
        worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{self.name}-work")
        refused: BrokerRefused | None = None
        try:
            for hook in self.on_start:
                hook()
            delay = self.settings.reconnect_initial
            ever_connected = False
            while not self.stopping:
                try:
                    self._serve(worker, ever_connected)
                    delay = self.settings.reconnect_initial
                except Exception as exc:  # whatever the connection did, the service goes on
                    was_connected = self._connected.is_set()
                    self._mark_disconnected()
                    if self.stopping:
                        break
                    ever_connected = ever_connected or was_connected
                    if was_connected:
                        self.metrics.connection_losses.inc()
                        self._lost_at = time.monotonic()
                        self._run_loss_hooks(worker)
                        delay = self.settings.reconnect_initial
                    else:
                        self.metrics.connect_failures.inc()
                    self._status = "reconnecting" if ever_connected else "waiting for broker"
                    self._last_error = f"{type(exc).__name__}: {exc}"[:500]
                    kind = permanent_reason(exc)
                    self._refusals = self._refusals + 1 if kind else 0
                    if kind is not None:
                        if self._refusals == 1:
                            self._refused_since = time.monotonic()
                        self._error_kind = f"permanent ({kind})"
                        left = self.settings.permanent_attempts - self._refusals
                        if left <= 0 and time.monotonic() - self._refused_since < self.settings.permanent_seconds:
                            left = 1  # not refused for long enough yet
                        self.log.error("the broker refused this service (%s): %s; %s", kind,
                                       "giving up" if left <= 0 else f"{left} more attempt(s), then exit",
                                       PERMANENT_HINTS[kind],
                                       extra={"error": self._last_error, "broker": self.broker.redacted_url()})
                        if left <= 0:
                            self._status = f"refused by the broker ({kind}): exiting"
                            refused = BrokerRefused(kind, self._last_error, self._refusals)
                            break
                        self._status = f"refused by the broker ({kind}): retrying"
                    else:
                        self._error_kind = "transient"
                    sleep_for = min(self.settings.reconnect_max, delay) * (0.5 + random.random() / 2)
                    if was_connected and time.monotonic() - self._serving_since > STABLE_SECONDS:
                        sleep_for = 0.0  # a connection that had held: try the other nodes at once
                    expected = isinstance(exc, ConnectionError | OSError | BrokerUnavailable) or \
                        type(exc).__module__.startswith(("amqp", "kombu"))
                    self.log.warning("broker connection lost, reconnecting" if was_connected
                                     else f"{self._status}: cannot connect",
                                     exc_info=not expected,
                                     extra={"error": self._last_error, "retry_in": round(sleep_for, 2),
                                            "broker": self.broker.redacted_url()})
                    self._stop.wait(sleep_for)
                    delay = min(self.settings.reconnect_max, delay * 2)
        finally:
            self._mark_disconnected()
            worker.shutdown(wait=True)
            for hook in self.on_stop:
                try:
                    hook()
                except Exception:
                    self.log.exception("stop hook failed")
            self.publisher.close()
            if self._health_server:
                self._health_server.stop()
            self.log.info("stopped")
        if refused is not None:
            raise refused

    def _mark_disconnected(self) -> None:
        self._connected.clear()
        self.metrics.connected.set(0)
        for q in self._consuming:
            self._consuming[q] = False
            self.metrics.consumer_up.labels(q).set(0)
        self._inbox.clear()  # their delivery tags died with the channel; the broker redelivers

    def _run_loss_hooks(self, worker: ThreadPoolExecutor) -> None:
        """Queued on the work thread: they run after the work in hand, before any new work."""
        for hook in self.on_connection_lost:
            def run(hook: Callable[[], None] = hook) -> None:
                try:
                    hook()
                except Exception:
                    self.log.exception("connection-lost hook failed")

            worker.submit(run)

    def _serve(self, worker: ThreadPoolExecutor, reconnect: bool) -> None:
        # failover across URLs; BrokerUnavailable if none answers
        conn = self.broker.connection(name=f"epu {self.name} (pid {os.getpid()})")
        consumers: list[RawConsumer] = []
        try:
            self._interrupt.clear()
            if self.stopping:
                self._interrupt.set()
            if self.broker.declare:
                with self._bounded(conn, "channel.open and the declares of its exchanges and queues"):
                    self.broker.topology.declare(conn.channel(), self._declare)
            self._cancelled.clear()
            self._live = {}
            for c in self._consumers:
                queue = c.queue if c.queue is not None else self._queue_for(c.spec)
                if queue.name in self._stopped:
                    continue  # stopped on a permanent failure: only a restart (after the fix) resumes it
                declare = self.broker.declare or c.queue is not None  # ad-hoc queues are ours
                with self._bounded(conn, f"channel.open, basic.qos and basic.consume of {queue.name}"):
                    consumers.append(RawConsumer(
                        conn.channel(), queue, prefetch=c.prefetch, declare=declare,
                        on_message=lambda m, c=c, name=queue.name: self._inbox.append((c, name, m)),
                        on_cancel=self._cancelled.append))
                self._live[queue.name] = consumers[-1]
                self._consuming[queue.name] = True
                self.metrics.consumer_up.labels(queue.name).set(1)
                self.metrics.known_queue(queue.name)  # its counters from 0, before any message
            self._connected.set()
            self.metrics.connected.set(1)
            self._status = "serving"
            self._serving_since = time.monotonic()
            self._last_error = None
            self._error_kind = None
            self._refusals = 0
            self._ready.set()
            url = redact_current(self.broker)
            if reconnect:
                took = None if self._lost_at is None else round(time.monotonic() - self._lost_at, 3)
                if took is not None:
                    self.metrics.reconnect_seconds.set(took)
                self.metrics.reconnects.inc()
                self.reconnect_count += 1
                self.log.info("reconnected to broker, resuming", extra={"broker": url, "after_seconds": took})
            else:
                self.log.info("serving", extra={"broker": url, "queues": [c.name for c in consumers]})
            self._pump(conn, worker)
            with self._bounded(conn, "basic.cancel of its consumers"):
                for consumer in consumers:
                    consumer.cancel()
        except BaseException:
            self._interrupt.set()
            raise
        finally:
            try:
                conn.release()
            except Exception:
                pass

    def _bounded(self, conn: Any, what: str) -> AbstractContextManager[None]:
        """A deadline on the broker calls of the block (``common.stall``): a broker that keeps the
        connection but stops answering is left for a new connection, counted in
        ``epu_broker_stalls_total`` and named on /healthz (``last_error``)."""
        return bounded(conn, self.broker.call_timeout, what, lambda _what: self.metrics.broker_stalls.inc())

    def _queue_for(self, spec: QueueSpec | None) -> Queue:
        assert spec is not None
        from kombu import binding

        topo = self.broker.topology
        q = topo.kombu_queues(spec)[0]
        exchange = topo.exchange_by_name(spec.exchange)
        return Queue(q.name, bindings=[binding(exchange, routing_key=k) for k in spec.routing_keys],
                     durable=True, queue_arguments=q.queue_arguments)

    # ------------------------------------------------------------------ the connection thread
    def _service_interval(self) -> float:
        hb = self.broker.heartbeat if not self.broker.is_memory else 0
        return max(0.05, min(1.0, hb / 4)) if hb else 1.0

    def _pump(self, conn: Any, worker: ThreadPoolExecutor) -> None:
        """Read frames, hand work to the work thread one item at a time, settle deliveries."""
        if self._unfinished is not None:  # work from before the connection was lost: let it end
            future, self._unfinished = self._unfinished, None
            try:
                self._await(conn, future)  # its outcome is void: that delivery died with its channel
            except Exception:
                if self._unfinished is not None:
                    raise  # this connection failed too
        while not self.stopping:
            self._last_loop = time.monotonic()
            if self._cancelled:
                for q in self._cancelled:
                    self._consuming[q] = False
                    self.metrics.consumer_up.labels(q).set(0)
                raise ConsumerLost(f"the broker cancelled the consumer of {', '.join(self._cancelled)}")
            timer = self._due_timer()
            if timer is not None:
                self._run_on_worker(conn, worker, lambda t=timer: self._run_timer(t), f"timer {timer.name}")
                continue
            if self._inbox:
                # what has arrived goes to the work thread in one hand-off, handled in order
                batch = [self._inbox.popleft() for _ in range(min(len(self._inbox), MAX_BATCH))]
                outcomes = self._run_on_worker(conn, worker, lambda b=batch: self._handle_batch(b),
                                               f"{len(batch)} message(s) from {batch[0][1]}")
                self._stop_consumers()
                for (_c, _q, inbound), outcome in zip(batch, outcomes, strict=True):
                    if outcome is not None:
                        self._settle(inbound, outcome)
                continue
            self._service(conn, self._seconds_to_next_timer())

    def _stop_consumers(self) -> None:
        """Cancel (on the connection thread) the consumers of queues stopped on a permanent
        failure; what they had prefetched is requeued by ``_handle_batch``."""
        for name in [q for q in self._stopped if q in self._live]:
            consumer = self._live.pop(name)
            with self._bounded(consumer.channel.connection, f"basic.cancel of {name}"):
                consumer.cancel()
            self._consuming[name] = False
            self.metrics.consumer_up.labels(name).set(0)

    def _service(self, conn: Any, timeout: float) -> None:
        """Read what the broker sent (deliveries go to the inbox), and keep heartbeats flowing.
        After the first frame, whatever else is already waiting is read too (without blocking),
        so deliveries reach the work thread in batches rather than one hand-off each."""
        try:
            conn.drain_events(timeout=timeout)
            while len(self._inbox) < MAX_BATCH:
                conn.drain_events(timeout=0)
        except TimeoutError:
            pass
        if conn.heartbeat:
            conn.heartbeat_check()

    def _run_on_worker(self, conn: Any, worker: ThreadPoolExecutor, fn: Callable[[], Any], what: str) -> Any:
        """Run ``fn`` on the work thread; meanwhile service the connection. If the connection
        fails, ``fn`` is left to finish on its own (its delivery, if any, died with the
        channel and comes back from the broker): the next connection waits for it before it
        hands out new work, so no two handlers ever run at once."""

        def task() -> Any:
            self._busy_since, self._busy_with = time.monotonic(), what
            try:
                return fn()
            finally:
                self._busy_since = self._busy_with = None

        return self._await(conn, worker.submit(task))

    def _await(self, conn: Any, future: Future[Any]) -> Any:
        while True:
            try:
                return future.result(timeout=self._service_interval())
            except FutureTimeout:
                pass
            self._last_loop = time.monotonic()
            try:
                self._service(conn, 0.01)
            except BaseException:
                self._interrupt.set()  # a retrying handler gives up; its message comes back
                self._unfinished = future
                raise

    def _settle(self, inbound: Inbound, outcome: str) -> None:
        if outcome in ("ack", "dead-lettered"):
            inbound.ack()
        elif outcome == "requeue":
            inbound.requeue()
        elif outcome == "reject":
            inbound.reject()

    # ------------------------------------------------------------------ timers
    def _due_timer(self) -> _Timer | None:
        now = time.monotonic()
        due = [t for t in self._timers if now >= t.next_at and f"timer {t.name}" not in self._stopped]
        return min(due, key=lambda t: t.next_at) if due and not self.stopping else None

    def _seconds_to_next_timer(self) -> float:
        timers = [t for t in self._timers if f"timer {t.name}" not in self._stopped]
        if not timers:
            return 0.5
        wait = min(t.next_at for t in timers) - time.monotonic()
        return max(0.005, min(0.5, wait))

    def _run_timer(self, timer: _Timer) -> None:
        timer.last_run = time.monotonic()
        try:
            timer.fn()
            self.metrics.timer_runs.labels(timer.name, "ok").inc()
        except Exception as exc:
            self.metrics.timer_runs.labels(timer.name, "error").inc()
            kind = infrastructure(exc, self.settings.transient_errors)
            if kind == "permanent":
                self._stop_on(f"timer {timer.name}", describe(exc))
            elif kind == "transient":  # the broker or a database is away
                self.log.warning("periodic task failed, will run again", extra={
                    "task": timer.name, "error": f"{type(exc).__name__}: {exc}"[:500]})
            else:
                self.log.exception("periodic task failed", extra={"task": timer.name})
        timer.next_at = max(timer.next_at + timer.period, time.monotonic() + timer.period * 0.1)

    # ------------------------------------------------------------------ deliveries (work thread)
    def _handle_batch(self, batch: list[tuple[_ConsumerSpec, str, Inbound]]) -> list[str | None]:
        """Handle deliveries in order; once stopping (or the connection is gone) leave the rest
        unsettled: the broker gives them to the next consumer."""
        out: list[str | None] = []
        for c, queue_name, inbound in batch:
            if self._interrupt.is_set():
                out.append(None)
            elif queue_name in self._stopped:
                out.append("requeue")  # prefetched before its consumer stopped: back to the queue
            else:
                out.append(self._handle(c, queue_name, inbound))
        return out

    def _handle(self, c: _ConsumerSpec, queue_name: str, inbound: Inbound) -> str:
        started = time.monotonic()
        try:
            outcome = self._handle_delivery(c, queue_name, inbound)
        except Exception:  # a bug in the runtime itself must not end the service either
            self.log.exception("delivery handling failed; the message goes back to the queue",
                               extra={"queue": queue_name})
            outcome = "requeue"
            self._interrupt.wait(1.0)
        self.metrics.consumed.labels(queue_name, _OUTCOME_LABEL.get(outcome, outcome)).inc()
        self.metrics.handler_seconds.labels(queue_name).observe(time.monotonic() - started)
        return outcome

    def _handle_delivery(self, c: _ConsumerSpec, queue_name: str, inbound: Inbound) -> str:
        kept = c.spec is not None and c.spec.dead_letter  # the queue's x-dead-letter-exchange keeps it
        try:
            envelope, msg = open_delivery(inbound.delivery, self.broker.limits)
            if c.types is not None and envelope.type not in c.types:
                raise DecodeError(f"unexpected message type {_clip(envelope.type)!r} on {queue_name}")
            refused = self._refused_sender(c, inbound, envelope.type, msg)
        except DecodeError as exc:
            reason = str(exc)
            outcome = self.dead_letter(inbound, queue_name, reason, kept=kept)
            if c.on_invalid is not None:
                try:
                    c.on_invalid(inbound.delivery.body, reason)
                except Exception:
                    self.log.exception("on_invalid hook failed", extra={"queue": queue_name})
            return outcome
        if refused is not None:
            self.metrics.refused_senders.labels(queue_name).inc()
            return self.dead_letter(inbound, queue_name, f"{SENDER_NOT_ALLOWED}: {refused}", kept=kept)
        user = inbound.delivery.properties.get("user_id")
        self.sender = user if isinstance(user, str) and user else None
        attempts = 0
        delay = self.settings.retry_base_seconds
        while True:
            attempts += 1
            try:
                c.handler(msg, envelope)
            except Reject as exc:
                return self.dead_letter(inbound, queue_name, f"rejected by {self.name}: {exc}", attempts, kept=kept)
            except Exception as exc:
                kind = infrastructure(exc, self.settings.transient_errors)
                if kind == "permanent":
                    self._stop_on(queue_name, f"{envelope.type} handler: {describe(exc)}")
                    self._retrying = None
                    return "requeue"  # not the message's fault: it waits in its queue for the fix
                transient = kind == "transient"
                error = f"{type(exc).__name__}: {exc}"
                if not transient and attempts >= self.settings.max_attempts:
                    self.log.exception("handler failed, dead-lettering",
                                       extra={"queue": queue_name, "type": envelope.type, "id": envelope.id})
                    return self.dead_letter(inbound, queue_name,
                                            f"handler failed after {attempts} attempts: {error}", attempts,
                                            kept=kept)
                self.metrics.handler_retries.labels(queue_name, "transient" if transient else "error").inc()
                self._retrying = {"queue": queue_name, "type": envelope.type, "id": envelope.id,
                                  "attempts": attempts, "error": error[:300], "transient": transient}
                self.log.warning("handler failed, retrying" + (" (infrastructure, until it succeeds)"
                                                              if transient else ""),
                                 extra={"queue": queue_name, "type": envelope.type, "attempt": attempts,
                                        "error": error, "retry_in": round(delay, 2)})
                if self._interrupt.wait(delay):
                    self._retrying = None
                    return "requeue"  # stopping or connection gone: leave it for the next consumer
                delay = min(delay * 2, self.settings.retry_max_seconds)
            else:
                self._retrying = None
                return "ack"

    def _stop_on(self, what: str, why: str) -> None:
        """A permanent infrastructure failure: stop ``what`` (a queue's consumer, or ``timer
        NAME``), say so in one error line, and answer /healthz with 503 and the reason."""
        if what in self._stopped:
            return
        self._stopped[what] = why[:500]
        self._last_error = why[:500]
        self.metrics.handler_retries.labels(what, "permanent").inc()
        self.log.error(f"{what} stopped: {why[:500]} — a failure no retry cures (fix it, then restart "
                       f"{self.name}); /healthz reports it", extra={"stopped": what, "error": why[:500]})

    def _refused_sender(self, c: _ConsumerSpec, inbound: Inbound, type_: str, msg: Message) -> str | None:
        """Why the sender of a message off a durable queue of the topology may not send it
        (``common.senders``), or None. Ad-hoc queues (an operator's tap) only watch."""
        if c.spec is None:
            return None
        return self.broker.senders.check(self.broker.topology, inbound.delivery, type_, msg)

    def dead_letter(self, inbound: Inbound, queue_name: str, reason: str, attempts: int = 1, *,
                    kept: bool = True) -> str:
        """Set the message aside with why, and say how to settle it.

        On RabbitMQ the broker keeps it: the death note (why, the attempts, the body's SHA-256, the
        sender it came from) is published to ``epu.notes`` under the queue's name and confirmed,
        then the message is rejected and the queue's ``x-dead-letter-exchange`` moves it, bytes and
        properties as they were sent (the validated ``user_id``) plus the broker's ``x-death``, to
        ``epu.dead``. The runtime does not write the dead-letter exchange: no EPU user may, so no
        user can make a message look like a letter of EPU's (issue 33, ``common.deadletters``). A
        latest-value queue (``kept`` false) keeps no dead letters: its message is dropped, the note
        is what remains. If the note is refused, the message is rejected all the same (the reason
        is logged); if the broker is away, it goes back to its queue to be tried again.

        The in-memory transport has no broker to dead-letter and no users (one process, one trust
        domain): there the runtime publishes the copy to the dead-letter exchange itself, with the
        reason in ``x-epu-reason``, and acks the original."""
        d = inbound.delivery
        user = d.properties.get("user_id")
        note = DeathNote(
            queue=queue_name, reason=reason[:1000], body_sha256=body_sha256(d.body),
            message_id=_prop(d.properties, "message_id"), type=_prop(d.properties, "type"),
            sender=_clip(user, 255) if isinstance(user, str) and user else None,
            exchange=_clip(d.exchange, 255), routing_key=_clip(d.routing_key, 255), attempts=attempts,
            dead_at=round(self.clock.now(), 3), kept=kept)
        if self.broker.is_memory:
            return self._keep_copy(inbound, note)
        try:
            self.publisher.publish_raw(
                note.encode(), exchange=self.broker.topology.n(DEATH_NOTES_EXCHANGE), routing_key=queue_name,
                content_type="application/x-msgpack", type_=NOTE_TYPE, mandatory=True)
        except PublishRefused as exc:
            self.log.error("death note refused by the broker; the message is dead-lettered without it "
                           "(its reason is only in this log)",
                           extra={"queue": queue_name, "reason": reason[:300], "error": str(exc)[:300]})
        except Exception as exc:
            self.log.warning("dead-lettering failed, the message goes back to the queue",
                             extra={"queue": queue_name, "error": f"{type(exc).__name__}: {exc}"[:300]})
            self._interrupt.wait(1.0)
            return "requeue"
        self.metrics.dead_lettered.labels(queue_name).inc()
        self.log.warning("message dead-lettered" if kept else "message dropped (a latest-value queue keeps no "
                         "dead letters; its death note says why)", extra={"queue": queue_name, "reason": reason[:300]})
        return "reject"

    def _keep_copy(self, inbound: Inbound, note: DeathNote) -> str:
        """``dead_letter`` on the in-memory transport: the copy, with the reason in headers."""
        d = inbound.delivery
        headers = safe_headers(d.headers)
        headers.update({
            REASON_HEADER: note.reason, ORIGINAL_QUEUE_HEADER: note.queue, ORIGINAL_EXCHANGE_HEADER: note.exchange,
            ORIGINAL_ROUTING_KEY_HEADER: note.routing_key, ATTEMPTS_HEADER: note.attempts,
            DEAD_AT_HEADER: note.dead_at,
        })
        props = d.properties
        try:
            self.publisher.publish_raw(
                d.body, exchange=self.broker.topology.dead_letter_exchange.name, routing_key=note.queue,
                headers=headers, content_type=_prop(props, "content_type") or "application/octet-stream",
                content_encoding=_prop(props, "content_encoding"), message_id=note.message_id,
                type_=note.type, correlation_id=_prop(props, "correlation_id"))
        except Exception as exc:
            self.log.warning("dead-lettering failed, the message goes back to the queue",
                             extra={"queue": note.queue, "error": f"{type(exc).__name__}: {exc}"[:300]})
            self._interrupt.wait(1.0)
            return "requeue"
        self.metrics.dead_lettered.labels(note.queue).inc()
        self.log.warning("message dead-lettered", extra={"queue": note.queue, "reason": note.reason[:300]})
        return "dead-lettered"


_OUTCOME_LABEL = {"ack": "ok", "dead-lettered": "dead-lettered", "requeue": "requeued", "reject": "rejected"}


def _clip(value: Any, n: int = 100) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text[:n]


def _prop(props: dict[str, Any], key: str) -> str | None:
    value = props.get(key)
    return value if isinstance(value, str) and value else None


def redact_current(broker: Broker) -> str:
    from epu.common.broker import redact

    return redact(broker.current_url)


def run_in_thread(service: Service) -> threading.Thread:
    t = threading.Thread(target=service.run, name=f"svc-{service.name}", daemon=True)
    t.start()
    return t


class Runnable:
    """What ``epu run SERVICE`` needs from ``services.<name>.app.build_service(config, ...)``:
    ``run()`` blocks until stopped; ``stop()`` asks it to finish; ``install_signal_handlers()``
    maps SIGTERM/SIGINT to ``stop()``. ``Service`` is one; the context broker wraps its HTTP
    server and a ``Service`` in another."""

    def run(self) -> None: ...
    def stop(self) -> None: ...
    def install_signal_handlers(self) -> None: ...
