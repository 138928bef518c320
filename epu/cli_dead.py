"""``epu dead list|show|requeue``: the dead-letter queue, for an operator.

Why: a message a service could not decode, validate or handle is kept in ``epu.dead`` with its
reason (``x-epu-reason``), where it was going and when it died — but only ``rabbitmqadmin`` could
see it. ``list`` and ``show`` peek (basic.get, then put every message back: the dead-letter queue
has no delivery limit, so reading it loses nothing); ``requeue`` takes one message out and
publishes its original bytes to where it was first sent (its original exchange and routing key),
with publisher confirms, and only then removes it from the dead-letter queue — after a fix
(a config that names the domain, a newer service), so the message is handled. A crash between
the two leaves both copies; receivers deduplicate by message id.

Keys: a message is named by its AMQP ``message_id`` (what the sender set; the runtime keeps it on
a dead letter), or, without one, by the first 12 hex digits of its body's SHA-256.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from epu.common.cliargs import RAW, add_config_arg, load_or_exit
from epu.common.topology import (
    ATTEMPTS_HEADER,
    DEAD_AT_HEADER,
    DEAD_LETTER_QUEUE,
    ORIGINAL_EXCHANGE_HEADER,
    ORIGINAL_QUEUE_HEADER,
    ORIGINAL_ROUTING_KEY_HEADER,
    REASON_HEADER,
)

MAX_LIST = 10_000
"""Most messages one peek reads (the rest are counted, not listed)."""


@dataclass
class DeadLetter:
    key: str
    type: str
    reason: str
    queue: str
    """The queue it was taken from when it died."""
    exchange: str
    routing_key: str
    dead_at: float | None
    attempts: int | None
    size: int
    body: bytes = field(repr=False)
    properties: dict[str, Any] = field(default_factory=dict, repr=False)
    headers: dict[str, Any] = field(default_factory=dict, repr=False)

    def age(self, now: float) -> float | None:
        return None if self.dead_at is None else max(0.0, now - self.dead_at)

    def summary(self, now: float) -> dict[str, Any]:
        return {"key": self.key, "type": self.type, "reason": self.reason, "queue": self.queue,
                "exchange": self.exchange, "routing_key": self.routing_key, "dead_at": self.dead_at,
                "age_seconds": None if self.dead_at is None else round(self.age(now) or 0.0, 1),
                "attempts": self.attempts, "size": self.size}


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value or "")


def _x_death(headers: dict[str, Any]) -> dict[str, Any]:
    """The broker's own record (a message the queue's dead-letter exchange took: rejected,
    expired, over a limit), first entry."""
    deaths = headers.get("x-death")
    return deaths[0] if isinstance(deaths, list) and deaths and isinstance(deaths[0], dict) else {}


def describe(body: bytes, properties: dict[str, Any], headers: dict[str, Any]) -> DeadLetter:
    """What a dead letter is, from its bytes and AMQP metadata. Pure."""
    death = _x_death(headers)
    msg_id = _text(properties.get("message_id"))
    key = msg_id or hashlib.sha256(body).hexdigest()[:12]
    type_ = _text(properties.get("type"))
    if not type_:
        try:
            import msgpack

            env = msgpack.unpackb(body, raw=False, strict_map_key=False)
            type_ = str(env.get("type", "")) if isinstance(env, dict) else ""
        except Exception:
            type_ = ""
    reason = _text(headers.get(REASON_HEADER)) or (f"{_text(death.get('reason'))} by the broker" if death else "")
    when = headers.get(DEAD_AT_HEADER)
    if not isinstance(when, int | float):
        t = death.get("time")
        when = t.timestamp() if hasattr(t, "timestamp") else (t if isinstance(t, int | float) else None)
    keys = death.get("routing-keys")
    attempts = headers.get(ATTEMPTS_HEADER)
    return DeadLetter(
        key=key, type=type_ or "(unknown)", reason=reason or "(no reason recorded)",
        queue=_text(headers.get(ORIGINAL_QUEUE_HEADER) or death.get("queue")),
        exchange=_text(headers.get(ORIGINAL_EXCHANGE_HEADER) or death.get("exchange")),
        routing_key=_text(headers.get(ORIGINAL_ROUTING_KEY_HEADER)
                          or (keys[0] if isinstance(keys, list) and keys else "")),
        dead_at=float(when) if when is not None else None,
        attempts=attempts if isinstance(attempts, int) else None, size=len(body), body=body,
        properties=dict(properties), headers=dict(headers))


class DeadError(RuntimeError):
    """What ``requeue`` could not do: one line, exit status 1."""


def _open(broker: Any) -> tuple[Any, Any, str]:
    conn = broker.connection()
    channel = conn.channel()
    channel.auto_decode = False
    return conn, channel, broker.topology.n(DEAD_LETTER_QUEUE)


def _read(channel: Any, queue: str, limit: int) -> list[Any]:
    out = []
    while len(out) < limit and (raw := channel.basic_get(queue=queue, no_ack=False)) is not None:
        out.append(raw)
    return out


def _letter(raw: Any) -> DeadLetter:
    props = dict(raw.properties or {})
    headers = dict(props.pop("application_headers", None) or {})
    return describe(bytes(raw.body), props, headers)


def peek(broker: Any, limit: int = MAX_LIST) -> tuple[list[DeadLetter], int]:
    """The dead letters (up to ``limit``) and how many the queue holds; all left in place."""
    conn, channel, queue = _open(broker)
    try:
        total = channel.queue_declare(queue=queue, passive=True).message_count
        taken = _read(channel, queue, limit)
        letters = [_letter(r) for r in taken]
        for r in taken:
            channel.basic_reject(r.delivery_tag, requeue=True)
        return letters, total
    finally:
        conn.release()


def requeue(broker: Any, key: str, source: str) -> DeadLetter:
    """Publish the dead letter named ``key`` to where it was first sent, then remove it."""
    from epu.common.broker import Publisher

    conn, channel, queue = _open(broker)
    found: DeadLetter | None = None
    try:
        taken = _read(channel, queue, MAX_LIST)
        chosen = None
        for raw in taken:
            letter = _letter(raw)
            if chosen is None and letter.key == key:
                chosen, found = raw, letter
            else:
                channel.basic_reject(raw.delivery_tag, requeue=True)
        if chosen is None or found is None:
            raise DeadError(f"no dead letter {key!r} (epu dead list names them)")
        if not found.exchange or not found.routing_key:
            channel.basic_reject(chosen.delivery_tag, requeue=True)
            raise DeadError(f"dead letter {key}: its original exchange or routing key is not recorded")
        headers = {k: v for k, v in found.headers.items() if not str(k).startswith("x-epu-") and k != "x-death"}
        pub = Publisher(broker, source=source)
        try:
            pub.publish_raw(found.body, exchange=found.exchange, routing_key=found.routing_key, headers=headers,
                            message_id=_text(found.properties.get("message_id")) or None,
                            type_=_text(found.properties.get("type")) or None,
                            correlation_id=_text(found.properties.get("correlation_id")) or None,
                            content_type=_text(found.properties.get("content_type")) or None,
                            content_encoding=_text(found.properties.get("content_encoding")) or None,
                            mandatory=True)
        except Exception as exc:
            channel.basic_reject(chosen.delivery_tag, requeue=True)
            raise DeadError(f"dead letter {key} not requeued (kept): {type(exc).__name__}: {exc}") from None
        finally:
            pub.close()
        channel.basic_ack(chosen.delivery_tag)
        return found
    finally:
        conn.release()


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= n:
            return f"{seconds / n:.1f}{unit}"
    return f"{seconds:.0f}s"


def cmd_list(args: argparse.Namespace) -> int:
    config = load_or_exit(args.config)
    letters, total = peek(config.broker_obj(), args.limit)
    now = time.time()
    if args.json:
        print(json.dumps({"total": total, "letters": [d.summary(now) for d in letters]}, indent=2))
        return 0
    if not letters:
        print("no dead letter")
        return 0
    print(f"{'KEY':<34} {'TYPE':<20} {'AGE':>6}  {'QUEUE':<28} REASON")
    for d in letters:
        print(f"{d.key[:34]:<34} {d.type[:20]:<20} {_age(d.age(now)):>6}  {d.queue[:28]:<28} {d.reason[:200]}")
    if total > len(letters):
        print(f"... {total - len(letters)} more (--limit)")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    config = load_or_exit(args.config)
    letters, _ = peek(config.broker_obj())
    found = next((d for d in letters if d.key == args.key), None)
    if found is None:
        print(f"epu dead show: no dead letter {args.key!r} (epu dead list names them)", file=sys.stderr)
        return 1
    doc = found.summary(time.time())
    try:
        import msgpack

        doc["body"] = msgpack.unpackb(found.body, raw=False, strict_map_key=False)
    except Exception:
        doc["body_hex"] = found.body[:512].hex()
    doc["headers"] = {str(k): v for k, v in found.headers.items() if k != "x-death"}
    print(json.dumps(doc, indent=2, default=_text))
    return 0


def cmd_requeue(args: argparse.Namespace) -> int:
    import getpass

    config = load_or_exit(args.config)
    try:
        d = requeue(config.broker_obj(), args.key, f"cli:{getpass.getuser()}")
    except DeadError as exc:
        print(f"epu dead requeue: {exc}", file=sys.stderr)
        return 1
    print(f"requeued {d.key} ({d.type}) to {d.exchange} with key {d.routing_key}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("dead", help="the dead-letter queue: list, show, requeue", formatter_class=RAW,
                       description="Messages a service could not decode, validate or handle wait in the\n"
                                   "dead-letter queue (epu.dead) with the reason, the queue they came from and\n"
                                   "when they died, for dead_letter_days (deploy/rabbitmq). Reading them changes\n"
                                   "nothing; requeue sends one back where it was going, after a fix.",
                       epilog="Examples:\n  epu dead list\n  epu dead show 3f2a9c...\n  epu dead requeue 3f2a9c...\n\n"
                              "Permissions: list and show need read on epu.dead (the epu-operator user has it);\n"
                              "requeue also needs write to the original exchange with its routing key (an\n"
                              "operator may requeue policy changes and terminations; others need an admin user).\n"
                              "Exit status: see each ACTION's --help; 2 when no ACTION is given.")
    p.set_defaults(func=lambda _args: p.print_help() or 2)
    dsub = p.add_subparsers(dest="dead_command", metavar="ACTION")
    s = dsub.add_parser("list", help="each dead letter's key, type, age, queue and reason", formatter_class=RAW,
                        description="One line per dead letter, oldest first: its key (for show and requeue), its\n"
                                    "message type, how long ago it died, the queue it was taken from and why.",
                        epilog="Example: epu dead list --limit 50 -c /etc/epu/operator.toml\n"
                               "Exit status: 0 listed; 1 RabbitMQ refused or cannot be reached; 2 bad configuration.")
    s.add_argument("--limit", type=int, default=1000, help="list at most N (default 1000)")
    s.add_argument("--json", action="store_true", help="print {total, letters: [...]} as JSON")
    add_config_arg(s)
    s.set_defaults(func=cmd_list)
    s = dsub.add_parser("show", help="one dead letter whole: headers and decoded body", formatter_class=RAW,
                        description="Print KEY's summary, AMQP headers and body (decoded from msgpack where it\n"
                                    "decodes, else the first 512 bytes in hex) as JSON.",
                        epilog="Example: epu dead show 3f2a9c0d1e2b -c /etc/epu/operator.toml\n"
                               "Exit status: 0 shown; 1 no such dead letter, or RabbitMQ unreachable; 2 bad configuration.")
    s.add_argument("key", help="the key `epu dead list` shows")
    add_config_arg(s)
    s.set_defaults(func=cmd_show)
    s = dsub.add_parser("requeue", help="send one dead letter back where it was going", formatter_class=RAW,
                        description="Publish KEY's original bytes to its original exchange and routing key (with\n"
                                    "confirms), then remove it from the dead-letter queue. Do it after fixing what\n"
                                    "made it fail: a message that fails again comes back with the new reason.",
                        epilog="Example: epu dead requeue 3f2a9c0d1e2b -c /etc/epu/operator.toml\n"
                               "Exit status: 0 requeued; 1 no such dead letter, its origin unknown, or the broker\n"
                               "refused the publish (the dead letter is kept); 2 bad configuration.")
    s.add_argument("key", help="the key `epu dead list` shows")
    add_config_arg(s)
    s.set_defaults(func=cmd_requeue)
