"""How any EPU service runs: consumers, periodic timers, shutdown, reconnects, health.

A service is a ``Service`` with handlers registered on queues (``consume``) and periodic
tasks (``every``). ``run()`` owns one connection and one thread: it declares the topology,
consumes, and fires timers between deliveries, so handlers and timers never race each other
and need no locks of their own. Services that must do slow I/O concurrently (cloud calls)
use their own worker threads and ``publish`` (thread-safe, its own connection).

Acknowledgement contract (design rule 5): a message is acked only after its handler
returned, i.e. after its effect is stored. A message that cannot be decoded or validated, or
whose handler raises ``Reject``, is republished to the dead-letter exchange with the reason
in ``x-epu-reason`` and then acked — it never crashes the consumer nor blocks the queue. Any
other exception is retried in-process ``max_attempts`` times with backoff, then dead-lettered.

Shutdown (SIGTERM/SIGINT, or ``stop()``): the message in hand is finished and acked, then the
connection closes; prefetched but unhandled messages return to the queue via the broker.
Broker loss: reconnect with exponential backoff and jitter, redeclare, resume.

Timers fire on real (monotonic) time: they pace I/O loops. What the periodic tasks compute
uses the injected ``clock``, so virtual-time tests call the cores directly (e.g. an engine's
``iterate()``) instead of waiting on timers.
"""

from __future__ import annotations

import logging
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kombu import Consumer, Queue

from common.broker import Broker, Publisher
from common.clock import Clock, RealClock
from common.codec import decode
from common.messages import DecodeError, Envelope, Message
from common.observability import HealthServer, ServiceMetrics
from common.topology import (
    ATTEMPTS_HEADER,
    ORIGINAL_EXCHANGE_HEADER,
    ORIGINAL_QUEUE_HEADER,
    ORIGINAL_ROUTING_KEY_HEADER,
    REASON_HEADER,
    QueueSpec,
)

Handler = Callable[[Message, Envelope], None]


class Reject(Exception):
    """Raised by a handler for a message that can never succeed: dead-letter it with this reason."""


@dataclass
class _ConsumerSpec:
    spec: QueueSpec | None
    queue: Queue | None
    handler: Handler
    prefetch: int
    types: frozenset[str] | None


@dataclass
class _Timer:
    name: str
    period: float
    fn: Callable[[], None]
    next_at: float


@dataclass
class RuntimeSettings:
    max_attempts: int = 3
    retry_base_seconds: float = 0.2
    reconnect_initial: float = 0.5
    reconnect_max: float = 15.0
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    extra_health: dict[str, Callable[[], Any]] = field(default_factory=dict)


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
        self._connected = threading.Event()
        self._ready = threading.Event()
        self._last_loop = time.monotonic()
        self._health_server: HealthServer | None = None
        self.on_start: list[Callable[[], None]] = []

    # ------------------------------------------------------------------ registration
    def consume(self, spec: QueueSpec, handler: Handler, *, prefetch: int = 10,
                types: set[str] | None = None) -> None:
        """Handle messages from a durable queue of the topology. ``types`` limits which message
        types the handler accepts; others are dead-lettered as unexpected."""
        self._consumers.append(_ConsumerSpec(spec, None, handler, prefetch, frozenset(types) if types else None))
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

    def publish(self, message: Message, correlation_id: str | None = None) -> Envelope:
        return self.publisher.publish(message, correlation_id, timestamp=self.clock.now())

    def publish_many(self, messages: list[Message], correlation_id: str | None = None) -> list[Envelope]:
        """A batch confirmed together (``Publisher.publish_many``): for bursts."""
        return self.publisher.publish_many(messages, correlation_id, timestamp=self.clock.now())

    # ------------------------------------------------------------------ lifecycle
    def stop(self) -> None:
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def wait_ready(self, timeout: float = 10.0) -> bool:
        """True once consumers are registered with the broker (tests and the demo use this)."""
        return self._ready.wait(timeout)

    def health(self) -> dict[str, Any]:
        age = time.monotonic() - self._last_loop
        doc: dict[str, Any] = {
            "service": self.name,
            "connected": self._connected.is_set(),
            "loop_age_seconds": round(age, 3),
            "broker": self.broker.redacted_url(),
        }
        for key, fn in self.settings.extra_health.items():
            try:
                doc[key] = fn()
            except Exception as exc:  # health must answer even when a probe breaks
                doc[key] = f"error: {exc}"
        doc["healthy"] = bool(doc["connected"] and age < 30 and not self.stopping)
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
        """Serve until ``stop()``: connect, declare, consume, fire timers; reconnect on loss."""
        self.start_health_server()
        for hook in self.on_start:
            hook()
        delay = self.settings.reconnect_initial
        first = True
        try:
            while not self.stopping:
                try:
                    self._serve(first)
                    delay = self.settings.reconnect_initial
                except (*self._connection_errors(), OSError) as exc:
                    self._connected.clear()
                    self.metrics.connected.set(0)
                    if self.stopping:
                        break
                    self.metrics.reconnects.inc()
                    sleep_for = min(self.settings.reconnect_max, delay) * (0.5 + random.random() / 2)
                    self.log.warning("broker connection lost, reconnecting",
                                     extra={"error": f"{type(exc).__name__}: {exc}",
                                            "retry_in": round(sleep_for, 2)})
                    self._stop.wait(sleep_for)
                    delay = min(self.settings.reconnect_max, delay * 2)
                first = False
        finally:
            self._connected.clear()
            self.publisher.close()
            if self._health_server:
                self._health_server.stop()
            self.log.info("stopped")

    def _connection_errors(self) -> tuple[type[BaseException], ...]:
        conn = self.broker.connection()
        return tuple(conn.connection_errors) + tuple(conn.channel_errors)

    def _serve(self, first: bool) -> None:
        with self.broker.connection() as conn:
            conn.ensure_connection(max_retries=1)
            channel = conn.channel()
            if self.broker.declare:
                self.broker.topology.declare(channel, self._declare)
            kombu_consumers = []
            for c in self._consumers:
                ch = conn.channel()
                queue = c.queue if c.queue is not None else self._queue_for(c.spec)
                declare = self.broker.declare or c.queue is not None  # ad-hoc queues are ours
                consumer = Consumer(ch, queues=[queue], on_message=self._make_on_message(c, queue.name),
                                    prefetch_count=c.prefetch, no_ack=False, auto_declare=declare)
                consumer.consume()
                kombu_consumers.append(consumer)
            self._connected.set()
            self.metrics.connected.set(1)
            self._ready.set()
            if not first:
                self.log.info("reconnected to broker, resuming", extra={"broker": self.broker.redacted_url()})
            else:
                self.log.info("serving", extra={"broker": self.broker.redacted_url(),
                                                "queues": [q.name for c in kombu_consumers for q in c.queues]})
            while not self.stopping:
                self._last_loop = time.monotonic()
                timeout = self._seconds_to_next_timer()
                if kombu_consumers:
                    try:
                        conn.drain_events(timeout=timeout)
                    except TimeoutError:
                        pass
                else:
                    self._stop.wait(timeout)
                self._run_due_timers()
                if conn.heartbeat:
                    conn.heartbeat_check()
            for consumer in kombu_consumers:
                try:
                    consumer.cancel()
                except Exception:  # closing anyway
                    pass

    def _queue_for(self, spec: QueueSpec | None) -> Queue:
        assert spec is not None
        from kombu import binding

        topo = self.broker.topology
        q = topo.kombu_queues(spec)[0]
        exchange = topo.exchange_by_name(spec.exchange)
        return Queue(q.name, bindings=[binding(exchange, routing_key=k) for k in spec.routing_keys],
                     durable=True, queue_arguments=q.queue_arguments)

    # ------------------------------------------------------------------ timers
    def _seconds_to_next_timer(self) -> float:
        if not self._timers:
            return 0.5
        wait = min(t.next_at for t in self._timers) - time.monotonic()
        return max(0.005, min(0.5, wait))

    def _run_due_timers(self) -> None:
        now = time.monotonic()
        for timer in self._timers:
            if now >= timer.next_at and not self.stopping:
                try:
                    timer.fn()
                    self.metrics.timer_runs.labels(timer.name, "ok").inc()
                except Exception:
                    self.metrics.timer_runs.labels(timer.name, "error").inc()
                    self.log.exception("periodic task failed", extra={"task": timer.name})
                timer.next_at = max(timer.next_at + timer.period, time.monotonic() + timer.period * 0.1)

    # ------------------------------------------------------------------ deliveries
    def _make_on_message(self, c: _ConsumerSpec, queue_name: str) -> Callable[[Any], None]:
        def on_message(message: Any) -> None:
            started = time.monotonic()
            outcome = self._handle(c, queue_name, message)
            self.metrics.consumed.labels(queue_name, outcome).inc()
            self.metrics.handler_seconds.labels(queue_name).observe(time.monotonic() - started)

        return on_message

    def _handle(self, c: _ConsumerSpec, queue_name: str, message: Any) -> str:
        body = message.body
        if isinstance(body, str):
            body = body.encode("latin-1")
        try:
            envelope, msg = decode(body)
            if c.types is not None and envelope.type not in c.types:
                raise DecodeError(f"unexpected message type {envelope.type!r} on {queue_name}")
        except DecodeError as exc:
            self.dead_letter(message, queue_name, str(exc))
            return "dead-lettered"
        attempts = 0
        while True:
            attempts += 1
            # Whatever the handler raises is the handler's failure (an OSError from its
            # database is not broker loss); only the ack below may raise connection errors.
            try:
                c.handler(msg, envelope)
            except Reject as exc:
                self.dead_letter(message, queue_name, f"rejected by {self.name}: {exc}", attempts)
                return "dead-lettered"
            except Exception as exc:
                if attempts >= self.settings.max_attempts:
                    self.log.exception("handler failed, dead-lettering",
                                       extra={"queue": queue_name, "type": envelope.type, "id": envelope.id})
                    self.dead_letter(message, queue_name,
                                     f"handler failed after {attempts} attempts: {type(exc).__name__}: {exc}",
                                     attempts)
                    return "dead-lettered"
                self.log.warning("handler failed, retrying",
                                 extra={"queue": queue_name, "type": envelope.type, "attempt": attempts,
                                        "error": f"{type(exc).__name__}: {exc}"})
                if self._stop.wait(self.settings.retry_base_seconds * 2 ** (attempts - 1)):
                    message.requeue()  # shutting down: leave it for the next consumer
                    return "requeued"
            else:
                message.ack()
                return "ok"

    def dead_letter(self, message: Any, queue_name: str, reason: str, attempts: int = 1) -> None:
        """Keep the message, with why, in the dead-letter queue; then ack it off its queue."""
        body = message.body if isinstance(message.body, bytes) else str(message.body).encode()
        headers = dict(message.headers or {})
        info = message.delivery_info or {}
        headers.update({
            REASON_HEADER: reason[:1000],
            ORIGINAL_QUEUE_HEADER: queue_name,
            ORIGINAL_EXCHANGE_HEADER: str(info.get("exchange", "")),
            ORIGINAL_ROUTING_KEY_HEADER: str(info.get("routing_key", "")),
            ATTEMPTS_HEADER: attempts,
        })
        topo = self.broker.topology
        self.publisher.publish_raw(body, exchange=topo.dead_letter_exchange.name, routing_key=queue_name,
                                   headers=headers, content_type=message.content_type or "application/octet-stream",
                                   message_id=(message.properties or {}).get("message_id"))
        message.ack()
        self.metrics.dead_lettered.labels(queue_name).inc()
        self.log.warning("message dead-lettered", extra={"queue": queue_name, "reason": reason[:300]})


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
