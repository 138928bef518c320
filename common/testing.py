"""Helpers for tests and tools that look into queues: wait on conditions, read a queue.

In the spirit of nameko's test helpers: no sleeps-and-hope, every wait has a condition and
a timeout, and reading a queue goes through the same codec the services use.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from kombu import Queue

from common.broker import Broker
from common.codec import decode

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


def get_raw(broker: Broker, queue_name: str, timeout: float = 5.0) -> Any:
    """Fetch one message (kombu Message, acked) from an existing queue, waiting up to ``timeout``."""
    with broker.connection() as conn:
        q = Queue(queue_name, no_declare=True)(conn.channel())
        deadline = time.monotonic() + timeout
        while True:
            msg = q.get(no_ack=False, accept=None)
            if msg is not None:
                msg.ack()
                return msg
            if time.monotonic() > deadline:
                raise TimeoutError(f"no message on {queue_name} within {timeout}s")
            time.sleep(0.02)


def drain(broker: Broker, queue_name: str, raw: bool = False) -> list[Any]:
    """Every message currently in the queue: (envelope, message) pairs where decodable, kombu
    messages otherwise (or always, with ``raw=True``)."""
    out = []
    with broker.connection() as conn:
        q = Queue(queue_name, no_declare=True)(conn.channel())
        while (msg := q.get(no_ack=False, accept=None)) is not None:
            msg.ack()
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
