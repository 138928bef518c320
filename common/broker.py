"""Connections and publishing with confirms.

A ``Broker`` is where messages go: a kombu URL plus a ``Topology``. ``Publisher`` turns a
typed message into an envelope and publishes it with publisher confirms (on AMQP) so that a
``publish()`` that returned means the broker has the message. It retries across broker loss
(kombu's ``ensure``), and is thread-safe so worker threads (cloud calls) can publish.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from amqp import spec
from amqp.exceptions import MessageNacked
from kombu import Connection, Producer
from kombu.serialization import dumps

from common.codec import CONTENT_TYPE, SERIALIZER
from common.messages import Envelope, Message
from common.topology import DEFAULT_TOPOLOGY, Topology

log = logging.getLogger("epu.broker")

#: How hard publish() tries across a broker outage before giving up (seconds grow to interval_max).
PUBLISH_RETRY_POLICY = {"max_retries": 30, "interval_start": 0.2, "interval_step": 0.5, "interval_max": 3.0}


@dataclass(frozen=True)
class Broker:
    url: str = "memory://"
    topology: Topology = DEFAULT_TOPOLOGY
    heartbeat: int = 30
    declare: bool = True
    """Declare exchanges and queues at start. False where deploy/rabbitmq's definitions are
    loaded and service users have no configure permission (least privilege)."""
    transport_options: dict[str, Any] = field(default_factory=dict)

    @property
    def is_memory(self) -> bool:
        return self.url.startswith("memory://")

    def connection(self) -> Connection:
        opts = dict(self.transport_options)
        if self.is_memory:
            opts.setdefault("polling_interval", 0.02)
        else:
            opts.setdefault("confirm_publish", True)
        return Connection(self.url, heartbeat=0 if self.is_memory else self.heartbeat,
                          transport_options=opts, connect_timeout=5)

    def redacted_url(self) -> str:
        """The URL without its password, for logs."""
        if "@" not in self.url or "://" not in self.url:
            return self.url
        scheme, rest = self.url.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        user = creds.split(":", 1)[0]
        return f"{scheme}://{user}:***@{host}"


class Publisher:
    """Publishes typed messages as msgpack envelopes, with confirms, from any thread."""

    def __init__(self, broker: Broker, source: str, metrics: Any = None) -> None:
        self.broker = broker
        self.source = source
        self.metrics = metrics
        self._lock = threading.Lock()
        self._conn: Connection | None = None
        self._producer: Producer | None = None

    def _ensure_producer(self) -> Producer:
        if self._producer is None:
            self._conn = self.broker.connection()
            self._producer = Producer(self._conn)
        return self._producer

    def publish(self, message: Message, correlation_id: str | None = None, *,
                message_id: str | None = None, timestamp: float | None = None) -> Envelope:
        envelope = Envelope.wrap(message, self.source, correlation_id, timestamp=timestamp, message_id=message_id)
        return self._publish_envelope(message, envelope, correlation_id)

    def _publish_envelope(self, message: Message, envelope: Envelope, correlation_id: str | None) -> Envelope:
        topo = self.broker.topology
        self.publish_raw(
            envelope.model_dump(mode="python"),
            exchange=topo.exchange_for(message).name,
            routing_key=message.routing_key(),
            message_id=envelope.id, type_=envelope.type, correlation_id=correlation_id,
        )
        if self.metrics is not None:
            self.metrics.published.labels(envelope.type).inc()
        return envelope

    def publish_many(self, messages: Sequence[Message], correlation_id: str | None = None, *,
                     timestamp: float | None = None, confirm_timeout: float = 30.0) -> list[Envelope]:
        """Publish a batch; return once the broker has confirmed every message of it.

        Why: ``publish()`` waits one confirm round trip per message, which caps a publisher at a
        few hundred messages a second; the engine's burst of launches and node commands is sent
        in one go on a fresh confirm channel and confirmed together (RabbitMQ acks many delivery
        tags at once). On a connection loss the unconfirmed rest is republished on a new
        connection with the same message ids: at least once, exactly as ``publish()``. A message
        the broker refuses (nack) raises ``MessageNacked`` after the rest are confirmed."""
        envelopes = [Envelope.wrap(m, self.source, correlation_id, timestamp=timestamp) for m in messages]
        if not envelopes:
            return []
        opts = self.broker.transport_options
        if self.broker.is_memory or not opts.get("confirm_publish", True):
            for m, env in zip(messages, envelopes, strict=True):  # nothing to batch: no confirms
                self._publish_envelope(m, env, correlation_id)
            return envelopes
        topo = self.broker.topology
        frames = []
        for m, env in zip(messages, envelopes, strict=True):
            ctype, cenc, payload = dumps(env.model_dump(mode="python"), serializer=SERIALIZER)
            props = {"delivery_mode": 2, "message_id": env.id, "type": env.type}
            if correlation_id:
                props["correlation_id"] = correlation_id
            frames.append((payload, ctype, cenc, props, topo.exchange_for(m).name, m.routing_key()))
        pending = set(range(len(frames)))
        policy = PUBLISH_RETRY_POLICY
        interval = policy["interval_start"]
        with self._lock:
            for attempt in range(int(policy["max_retries"]) + 1):
                try:
                    nacked = self._publish_confirmed(frames, pending, confirm_timeout)
                    break
                except self._recoverable_errors() as exc:
                    if attempt == policy["max_retries"]:
                        raise
                    self._on_error(exc, interval)
                    self._drop_connection()
                    time.sleep(interval)
                    interval = min(interval + policy["interval_step"], policy["interval_max"])
        if self.metrics is not None:
            for env in envelopes:
                self.metrics.published.labels(env.type).inc()
        if nacked:
            raise MessageNacked(f"broker refused {len(nacked)} of {len(frames)} messages: "
                                + ", ".join(envelopes[i].id for i in nacked[:10]))
        return envelopes

    def _publish_confirmed(self, frames: list[tuple[Any, ...]], pending: set[int], timeout: float) -> list[int]:
        """Send ``frames[pending]`` on a new confirm channel and wait for every confirm.
        Confirmed indexes leave ``pending`` as acks arrive (so a retry after a connection
        loss resends only the rest); returns the nacked indexes."""
        self._ensure_producer()
        assert self._conn is not None
        channel = self._conn.channel()
        try:
            channel.confirm_select()
            order = sorted(pending)
            tag_of = dict(enumerate(order, start=1))  # delivery tags count from 1 on a new channel
            outstanding = set(tag_of)
            nacked: list[int] = []

            def settle(tag: int, multiple: bool, ok: bool) -> None:
                for t in [t for t in outstanding if t <= tag] if multiple else [tag]:
                    outstanding.discard(t)
                    pending.discard(tag_of[t])
                    if not ok:
                        nacked.append(tag_of[t])

            # registered before the first publish: publishing may already read an ack
            channel.events["basic_ack"].add(lambda tag, multiple: settle(tag, multiple, True))
            channel.events["basic_nack"].add(lambda tag, multiple: settle(tag, multiple, False))
            for i in order:
                payload, ctype, cenc, props, exchange, routing_key = frames[i]
                msg = channel.prepare_message(payload, content_type=ctype, content_encoding=cenc,
                                              headers={}, properties=props)
                channel._basic_publish(msg, exchange=exchange, routing_key=routing_key)
            deadline = time.monotonic() + timeout
            while outstanding:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{len(outstanding)} publishes unconfirmed after {timeout}s")
                channel.wait([spec.Basic.Ack, spec.Basic.Nack], timeout=left)
            return sorted(nacked)
        finally:
            try:
                channel.close()
            except Exception:  # the connection may be gone; the retry opens a new one
                pass

    def _recoverable_errors(self) -> tuple[type[BaseException], ...]:
        assert self._conn is not None
        return (*self._conn.recoverable_connection_errors, TimeoutError, OSError)

    def _drop_connection(self) -> None:
        if self._conn is not None:
            try:
                self._conn.release()
            except Exception:
                pass
        self._conn = self._producer = None

    def publish_raw(self, body: Any, exchange: str, routing_key: str, *, headers: dict[str, Any] | None = None,
                    message_id: str | None = None, type_: str | None = None,
                    correlation_id: str | None = None, content_type: str | None = None) -> None:
        """Publish ``body`` (an object to msgpack-encode, or raw bytes with ``content_type``)."""
        if isinstance(body, bytes | bytearray):
            payload, serializer = bytes(body), None
            ctype = content_type or "application/octet-stream"
        else:
            # the registered kombu serializer does the msgpack encoding (common.codec)
            payload, serializer, ctype = body, SERIALIZER, CONTENT_TYPE
        props: dict[str, Any] = {"delivery_mode": 2}
        if message_id:
            props["message_id"] = message_id
        if type_:
            props["type"] = type_
        if correlation_id:
            props["correlation_id"] = correlation_id
        with self._lock:
            producer = self._ensure_producer()
            assert self._conn is not None
            publish = self._conn.ensure(producer, producer.publish, errback=self._on_error,
                                        **PUBLISH_RETRY_POLICY)
            extra = {} if serializer else {"content_type": ctype, "content_encoding": "binary"}
            publish(payload, exchange=exchange, routing_key=routing_key, serializer=serializer,
                    headers=headers or {}, **extra, **props)

    def _on_error(self, exc: BaseException, interval: float) -> None:
        log.warning("publish failed, retrying", extra={"error": str(exc), "retry_in": interval,
                                                      "broker": self.broker.redacted_url()})

    def close(self) -> None:
        with self._lock:
            self._drop_connection()

