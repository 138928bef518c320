"""Follow the events exchange through an exclusive, auto-deleted queue: the one tap loop that
``epu tap``, ``epu record`` and other watchers share."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kombu import Consumer

from common.broker import Broker
from common.codec import decode
from common.messages import DecodeError, Envelope, Message

#: Called per message: routing key, then (envelope, message) or the decode error.
OnEvent = Callable[[str, Envelope | None, Message | None, DecodeError | None], None]


def follow(broker: Broker, pattern: str, on_event: OnEvent, *, stop: Callable[[], bool],
           seconds: float = 0.0, on_bound: Callable[[], None] | None = None) -> None:
    """Deliver every event matching ``pattern`` to ``on_event`` until ``stop()`` is true or
    ``seconds`` have passed (0: no limit). ``on_bound`` runs once the queue is bound, so a
    caller can signal readiness instead of sleeping. Undecodable events are passed on with
    their error (a tap shows them; it never crashes on them)."""
    deadline = time.monotonic() + seconds if seconds else None
    with broker.connection() as conn:
        channel = conn.channel()
        if broker.declare:
            broker.topology.events_exchange(channel).declare()

        def on_message(message: Any) -> None:
            rk = (message.delivery_info or {}).get("routing_key", "")
            try:
                envelope, msg = decode(message.body)
            except DecodeError as exc:
                on_event(rk, None, None, exc)
            else:
                on_event(rk, envelope, msg, None)
            message.ack()

        with Consumer(channel, queues=[broker.topology.tap_queue(pattern)], on_message=on_message, no_ack=False):
            if on_bound is not None:
                on_bound()
            while not stop() and not (deadline and time.monotonic() > deadline):
                try:
                    conn.drain_events(timeout=0.25)
                except TimeoutError:
                    pass
