"""Connections and publishing with confirms.

A ``Broker`` is where messages go: a kombu URL plus a ``Topology``. ``Publisher`` turns a
typed message into an envelope and publishes it with publisher confirms (on AMQP) so that a
``publish()`` that returned means the broker has the message. It retries across broker loss
(kombu's ``ensure``), and is thread-safe so worker threads (cloud calls) can publish.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from kombu import Connection, Producer

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
            if self._conn is not None:
                self._conn.release()
            self._conn = self._producer = None

