"""Small helpers for tests on the real broker: an event tap, queue reads, consumer counts."""

from __future__ import annotations

import uuid
from typing import Any

from epu.common.broker import Broker
from epu.common.codec import decode
from kombu import Queue, binding


class Tap:
    """An exclusive queue on the events exchange bound to ``patterns``; read with ``poll()``."""

    def __init__(self, broker: Broker, *patterns: str) -> None:
        topo = broker.topology
        self.conn = broker.connection()
        self.channel = self.conn.channel()
        topo.events_exchange(self.channel).declare()
        self.queue = Queue(topo.n(f"epu.test-tap.{uuid.uuid4().hex[:8]}"),
                           bindings=[binding(topo.events_exchange, routing_key=p) for p in patterns],
                           exclusive=True, auto_delete=True, durable=False)(self.channel)
        self.queue.declare()
        self.seen: list[Any] = []

    def poll(self) -> list[Any]:
        while (msg := self.queue.get(no_ack=True, accept=None)) is not None:
            self.seen.append(decode(msg.body)[1])
        return self.seen

    def of(self, type_: str) -> list[Any]:
        return [m for m in self.poll() if type_ == m.TYPE]

    def close(self) -> None:
        self.conn.release()


def read_queue(broker: Broker, name: str) -> list[Any]:
    """Messages now in a durable queue of the topology (consumed)."""
    out = []
    with broker.connection() as conn:
        q = Queue(broker.topology.n(name), no_declare=True)(conn.channel())
        while (msg := q.get(no_ack=False, accept=None)) is not None:
            msg.ack()
            out.append(decode(msg.body)[1])
    return out


def consumers(broker: Broker, name: str) -> int:
    with broker.connection() as conn:
        try:
            return conn.channel().queue_declare(queue=broker.topology.n(name), passive=True).consumer_count
        except Exception:
            return 0
