"""Consume a queue and get raw deliveries: the one place that talks to a transport's consumer API.

Why not kombu's ``Consumer`` on AMQP: kombu turns a delivery into its ``Message`` before any
callback runs, and that constructor inflates a ``compression`` header without a limit (a
200 KB zlib bomb became 200 MB in memory) and py-amqp's channel decodes the body with the
sender's ``content_encoding`` (a ``cp1252`` body became a str that could not be encoded
back). Here, on AMQP, py-amqp's public ``basic_consume`` hands over the raw message on a
channel with ``auto_decode`` off, so the consumer sees exactly the bytes that were sent and
``common.inbound`` decides what to do with them. The in-memory transport (one process, the
demo) has no raw API; kombu's ``Consumer`` is used there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from epu.common.inbound import Delivery
from kombu import Consumer, Queue


class Inbound:
    """A delivery plus how to settle it. Settle only from the thread that drains the connection."""

    def __init__(self, delivery: Delivery, ack: Callable[[], None], requeue: Callable[[], None],
                 reject: Callable[[], None]) -> None:
        self.delivery = delivery
        self.ack = ack
        self.requeue = requeue
        self.reject = reject
        """Refuse without requeue: the queue's own dead-letter exchange (if any) takes it."""


def from_amqp(channel: Any, msg: Any) -> Inbound:
    props = dict(msg.properties or {})
    headers = props.pop("application_headers", None) or {}
    info = msg.delivery_info or {}
    body = msg.body
    if isinstance(body, str):  # only if someone turned auto_decode back on
        body = body.encode("utf-8", errors="replace")
    tag = msg.delivery_tag
    delivery = Delivery(bytes(body), props, headers, str(info.get("exchange", "")), str(info.get("routing_key", "")),
                        bool(info.get("redelivered", False)))
    return Inbound(delivery, lambda: channel.basic_ack(tag), lambda: channel.basic_reject(tag, requeue=True),
                   lambda: channel.basic_reject(tag, requeue=False))


def from_kombu(message: Any) -> Inbound:
    body = message.body
    if isinstance(body, str):
        body = body.encode("utf-8", errors="replace")
    props = dict(message.properties or {})
    props.setdefault("content_type", message.content_type)
    props.setdefault("content_encoding", message.content_encoding)
    props.pop("application_headers", None)
    info = message.delivery_info or {}
    delivery = Delivery(bytes(body or b""), props, dict(message.headers or {}), str(info.get("exchange", "")),
                        str(info.get("routing_key", "")), bool(info.get("redelivered", False)))
    return Inbound(delivery, message.ack, message.requeue, message.reject)


class RawConsumer:
    """One queue consumed on its own channel; every delivery goes to ``on_message``."""

    def __init__(self, channel: Any, queue: Queue, *, prefetch: int, declare: bool,
                 on_message: Callable[[Inbound], None], on_cancel: Callable[[str], None] | None = None) -> None:
        self.channel = channel
        self.queue = queue
        self.name = queue.name
        self._kombu: Consumer | None = None
        bound = queue(channel)
        if declare:
            bound.declare()
        if hasattr(channel, "auto_decode"):  # py-amqp: raw bytes, our own decoding
            channel.auto_decode = False
            channel.basic_qos(0, prefetch, False)
            self.tag = channel.basic_consume(
                queue=queue.name, no_ack=False, callback=lambda m: on_message(from_amqp(channel, m)),
                on_cancel=(lambda tag: on_cancel(self.name)) if on_cancel else None)
        else:  # kombu's virtual transports (memory://)
            self._kombu = Consumer(channel, queues=[queue], prefetch_count=prefetch, no_ack=False, auto_declare=False,
                                   on_message=lambda m: on_message(from_kombu(m)),
                                   on_decode_error=lambda m, exc: on_message(from_kombu(m)))
            self._kombu.consume()

    def cancel(self) -> None:
        try:
            if self._kombu is not None:
                self._kombu.cancel()
            else:
                self.channel.basic_cancel(self.tag)
        except Exception:  # closing anyway
            pass
