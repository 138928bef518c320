"""Follow the events exchange through an exclusive, auto-deleted queue: the one tap loop that
``epu tap``, ``epu record``, ``epu status`` and ``epu policy set`` share.

Least privilege: the queue is named ``<prefix>epu.tap.<random>`` — the only queues the
generated ``epu-operator`` user may create — and the events exchange is never declared by a
tap (the operator has no configure permission on it). Only when the exchange does not exist
yet and the broker config allows declaring (a developer's broker) is it declared. Deliveries
are opened with ``common.inbound`` like a service's, so a hostile event is shown as
undecodable, never crashes the tap, and never inflates a compression bomb. Setting the tap up
and cancelling it have a deadline (``common.stall``): a broker that stops answering is an error
(``BrokerStalled``), not a tap that hangs silent.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from amqp.exceptions import NotFound
from epu.common.broker import Broker
from epu.common.consuming import Inbound, RawConsumer
from epu.common.inbound import allow_deep_headers, open_delivery
from epu.common.messages import DecodeError, Envelope, Message
from epu.common.stall import bounded

#: Called per message: routing key, then (envelope, message) or the decode error.
OnEvent = Callable[[str, Envelope | None, Message | None, DecodeError | None], None]


def _consume(conn: Any, broker: Broker, patterns: Sequence[str], on_message: Callable[[Inbound], None]) -> RawConsumer:
    try:
        return RawConsumer(conn.channel(), broker.topology.tap_queue(patterns), prefetch=200, declare=True,
                           on_message=on_message)
    except NotFound:
        if not broker.declare:
            raise NotFound(reply_text=f"exchange {broker.topology.events_exchange.name!r} does not exist: "
                                      f"load the RabbitMQ definitions (deploy/rabbitmq) or start the services") \
                from None
        broker.topology.events_exchange(conn.channel()).declare()
        return RawConsumer(conn.channel(), broker.topology.tap_queue(patterns), prefetch=200, declare=True,
                           on_message=on_message)


def follow(broker: Broker, pattern: str | Sequence[str], on_event: OnEvent, *, stop: Callable[[], bool],
           seconds: float = 0.0, on_bound: Callable[[], None] | None = None,
           on_idle: Callable[[], None] | None = None) -> None:
    """Deliver every event matching ``pattern`` (one topic pattern or several) to ``on_event``
    until ``stop()`` is true or ``seconds`` have passed (0: no limit). ``on_bound`` runs once
    the queue is bound, so a caller can act (publish a command, signal readiness) knowing no
    answer can be missed; ``on_idle`` runs whenever no message came for a quarter second.
    Undecodable events are passed on with their error (a tap shows them; it never crashes)."""
    allow_deep_headers()
    patterns = [pattern] if isinstance(pattern, str) else list(pattern)
    deadline = time.monotonic() + seconds if seconds else None
    with broker.connection() as conn:
        def on_message(inbound: Inbound) -> None:
            d = inbound.delivery
            try:
                envelope, msg = open_delivery(d, broker.limits)
            except DecodeError as exc:
                on_event(d.routing_key, None, None, exc)
            else:
                on_event(d.routing_key, envelope, msg, None)
            inbound.ack()

        with bounded(conn, broker.call_timeout, "channel.open, queue.declare and basic.consume of the tap"):
            consumer = _consume(conn, broker, patterns, on_message)
        try:
            if on_bound is not None:
                on_bound()
            while not stop() and not (deadline and time.monotonic() > deadline):
                try:
                    conn.drain_events(timeout=0.25)
                except TimeoutError:
                    if on_idle is not None:
                        on_idle()
                if conn.heartbeat:
                    conn.heartbeat_check()
        finally:
            with bounded(conn, broker.call_timeout, "basic.cancel of the tap"):
                consumer.cancel()
