"""Helpers for tests and tools that look into queues: wait on conditions, read a queue.

In the spirit of nameko's test helpers: no sleeps-and-hope, every wait has a condition and
a timeout, and reading a queue goes through the same codec the services use.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from epu.common.broker import Broker
from epu.common.codec import decode
from epu.common.consuming import from_amqp, from_kombu
from epu.common.inbound import Delivery
from kombu import Queue

T = TypeVar("T")


def wait_for(condition: Callable[[], T], timeout: float = 10.0, interval: float = 0.02,
             message: str = "condition") -> T:
    """Poll ``condition`` until it returns something truthy; fail with ``message`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


def _get_one(channel: Any, queue_name: str) -> Delivery | None:
    """One message off the queue (acked), as the bytes and headers that were sent: on AMQP
    through py-amqp's raw ``basic_get`` (kombu's Message would inflate a compressed body)."""
    if hasattr(channel, "auto_decode"):
        channel.auto_decode = False
        msg = channel.basic_get(queue_name, no_ack=True)
        return None if msg is None else from_amqp(channel, msg).delivery
    msg = Queue(queue_name, no_declare=True)(channel).get(no_ack=True, accept=None)
    return None if msg is None else from_kombu(msg).delivery


def get_raw(broker: Broker, queue_name: str, timeout: float = 5.0) -> Delivery:
    """Fetch one message (acked) from an existing queue, waiting up to ``timeout``."""
    with broker.connection() as conn:
        channel = conn.channel()
        deadline = time.monotonic() + timeout
        while True:
            msg = _get_one(channel, queue_name)
            if msg is not None:
                return msg
            if time.monotonic() > deadline:
                raise TimeoutError(f"no message on {queue_name} within {timeout}s")
            time.sleep(0.02)


def drain(broker: Broker, queue_name: str, raw: bool = False) -> list[Any]:
    """Every message currently in the queue: (envelope, message) pairs where decodable, raw
    ``Delivery`` objects (body, headers, properties) otherwise (or always, with ``raw=True``)."""
    out: list[Any] = []
    with broker.connection() as conn:
        channel = conn.channel()
        while (msg := _get_one(channel, queue_name)) is not None:
            if raw:
                out.append(msg)
                continue
            try:
                out.append(decode(msg.body))
            except Exception:
                out.append(msg)
    return out


def queue_depth(broker: Broker, queue_name: str) -> int:
    """Messages ready in a queue (passive declare; works where basic.get does not, e.g. SAC queues)."""
    with broker.connection() as conn:
        return conn.channel().queue_declare(queue=queue_name, passive=True).message_count
