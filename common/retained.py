"""Read latest-value queues without consuming them: how an operator's command sees retained state.

A latest-value queue (``x-max-length`` ``STATUS_DEPTH``, ``drop-head``; see
``Topology.status_spec``) holds the newest messages of one kind — a domain's ``EngineStatus``. A
reader takes what is there with ``basic.get`` and puts it back (reject with requeue), so the next
reader finds it too; it needs only read permission on the queue (the operator's). It keeps the
one built last (the highest ``at``): the queue's order says nothing, as a message put back may
sit before or behind a newer one, and a few are kept so that a status published while a reader
holds the previous one is not the one dropped.

A queue that does not exist (no engine has declared it, or the definitions are older) is
reported as missing, not as an error: the caller says so and carries on with live events.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from amqp.exceptions import AccessRefused, NotFound
from epu.common.broker import Broker
from epu.common.consuming import from_amqp
from epu.common.inbound import open_delivery
from epu.common.messages import DecodeError, Message

#: More than this many messages in one latest-value queue would be a misconfigured queue.
MAX_PER_QUEUE = 8


@dataclass
class Retained:
    """What the queues held: the newest decodable message per queue, and what could not be read."""

    messages: dict[str, Message] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    """Queues that do not exist."""
    refused: list[str] = field(default_factory=list)
    """Queues this user may not read (RabbitMQ's 403: a domain its permissions do not name)."""
    undecodable: dict[str, str] = field(default_factory=dict)
    """Queue → why its message could not be decoded."""


def _newest(found: list[Message]) -> Message | None:
    return max(found, key=lambda m: float(getattr(m, "at", 0.0)), default=None)


def read_retained(broker: Broker, queues: Iterable[str]) -> Retained:
    """Peek at each queue (full names, prefix included): the newest message in it, left in place.
    Needs an AMQP broker (the in-memory transport has no other process to read from: empty)."""
    out = Retained()
    if broker.is_memory:
        return out
    with broker.connection() as conn:
        channel = conn.channel()
        for name in queues:
            channel.auto_decode = False
            taken: list[Any] = []
            found: list[Message] = []
            try:
                while len(taken) < MAX_PER_QUEUE and (raw := channel.basic_get(queue=name, no_ack=False)) is not None:
                    taken.append(raw)
                    try:
                        _env, msg = open_delivery(from_amqp(channel, raw).delivery, broker.limits)
                    except DecodeError as exc:
                        out.undecodable[name] = str(exc)
                    else:
                        found.append(msg)
            except NotFound:
                out.missing.append(name)
                channel = conn.channel()  # the broker closed the channel
                continue
            except AccessRefused:
                out.refused.append(name)
                channel = conn.channel()
                continue
            for raw in taken:  # back in place, for the next reader
                channel.basic_reject(raw.delivery_tag, requeue=True)
            newest = _newest(found)
            if newest is not None:
                out.messages[name] = newest
        channel.close()
    return out


def engine_statuses(broker: Broker, domains: Iterable[str]) -> tuple[dict[str, Message], dict[str, str]]:
    """Each domain's retained ``EngineStatus`` (domain → message), and for each domain without
    one, why (domain → a note an operator can act on)."""
    topo = broker.topology
    names = {topo.n(topo.status_spec(d).name): d for d in domains}
    got = read_retained(broker, names)
    found: dict[str, Message] = {}
    why: dict[str, str] = {}
    for name, domain in names.items():
        if name in got.messages:
            found[domain] = got.messages[name]
        elif name in got.missing:
            why[domain] = (f"no status queue {name}: load the current RabbitMQ definitions (docs/deploy.md) "
                           "or start the decision engine")
        elif name in got.refused:
            why[domain] = (f"RabbitMQ does not let this user read {name} (403): {domain!r} is a domain the "
                           "user's permissions do not name — an unknown domain, or definitions older than "
                           "the domain (docs/deploy.md)")
        elif name in got.undecodable:
            why[domain] = f"the status in {name} cannot be read: {got.undecodable[name]}"
        else:
            why[domain] = "no engine status yet: is the decision engine running and acting for it?"
    return found, why
