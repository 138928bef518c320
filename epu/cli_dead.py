"""``epu dead list|show|requeue``: the dead-letter queue, for an operator.

Why: a message a service could not decode, validate or handle is kept in ``epu.dead`` — put there
by the broker, as it was sent — and the service's death note in ``epu.dead.notes`` says why
(``common.deadletters``); only ``rabbitmqadmin`` could see them. ``list`` and ``show`` peek
(basic.get, then put every message back: neither queue has a delivery limit, so reading loses
nothing). ``requeue`` takes one letter out, checks it may be sent on (``requeue_refusal``: a
letter the broker never dead-lettered, one that died because its sender was not allowed, one that
died where its type is never sent, one whose proven sender may not send it — all refused), and
publishes its original bytes on the routing key its body makes, *with its original* ``user_id``,
with publisher confirms; only then is it removed. RabbitMQ accepts that ``user_id`` only from
that same user or one with the ``impersonator`` tag, and the receiver checks the sender again: a
requeue never lends the requeuer's authority (issue 33). A crash between publish and removal
leaves both copies; receivers deduplicate by message id.

What is shown comes from what the broker vouches for — the ``user_id`` (the sender), ``x-death``'s
first queue and reason, the body — and from death notes of the queue's own reader. ``x-epu-*``
headers on a letter in RabbitMQ are its sender's words (the runtime writes none there) and are
listed as such, never believed.

Keys: a letter is named by its AMQP ``message_id`` (what the sender set), or, without one, by the
first 12 hex digits of its body's SHA-256; ``show`` and ``requeue`` take any unique prefix.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from epu.common.cliargs import RAW, add_config_arg, load_or_exit
from epu.common.deadletters import (
    DeathNote,
    LetterFacts,
    NoteError,
    body_sha256,
    death_queue,
    note_is_trusted,
    requeue_refusal,
    requeue_route,
    resent_headers,
)
from epu.common.inbound import safe_headers
from epu.common.senders import SenderPolicy
from epu.common.topology import DEAD_LETTER_QUEUE, DEATH_NOTES_QUEUE, Topology

MAX_LIST = 10_000
"""Most messages one peek reads (the rest are counted, not listed)."""
MAX_DROPPED_SHOWN = 20
"""Notes of dropped messages ``list`` prints (the newest)."""


@dataclass
class DeadLetter:
    key: str
    type: str
    domain: str | None
    force: bool | None
    """A terminate's ``force`` (None for other types): the first thing to know before a requeue."""
    sender: str | None
    """The ``user_id`` it was published with (RabbitMQ validated it then, and dead-lettering keeps it)."""
    reason: str
    reason_from: str
    """Who says so: the rejecting service's note, the broker's x-death, or nobody."""
    queue: str
    """The queue it died in (the broker's own record)."""
    exchange: str
    routing_key: str
    """Where a requeue sends it: its type's exchange, the routing key its body makes (empty: it does not decode)."""
    dead_at: float | None
    attempts: int | None
    size: int
    facts: LetterFacts = field(repr=False)
    body: bytes = field(repr=False)
    properties: dict[str, Any] = field(default_factory=dict, repr=False)
    headers: dict[str, Any] = field(default_factory=dict, repr=False)
    refusal: str | None = None
    """Why ``requeue`` would refuse it (None: it may be requeued)."""

    def age(self, now: float) -> float | None:
        return None if self.dead_at is None else max(0.0, now - self.dead_at)

    def summary(self, now: float) -> dict[str, Any]:
        return {"type": self.type, "domain": self.domain, "force": self.force, "key": self.key,
                "sender": self.sender, "reason": self.reason, "reason_from": self.reason_from, "queue": self.queue,
                "exchange": self.exchange, "routing_key": self.routing_key, "dead_at": self.dead_at,
                "age_seconds": None if self.dead_at is None else round(self.age(now) or 0.0, 1),
                "attempts": self.attempts, "size": self.size,
                "requeue": "allowed" if self.refusal is None else f"refused: {self.refusal}"}


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value or "")


def _x_death(headers: dict[str, Any]) -> dict[str, Any]:
    deaths = headers.get("x-death")
    return deaths[0] if isinstance(deaths, list) and deaths and isinstance(deaths[0], dict) else {}


def _decode(body: bytes, properties: dict[str, Any], headers: dict[str, Any]) -> tuple[str, Any]:
    """(type, typed message or None), opened as a consumer opens it (bounded, defensively)."""
    from epu.common.broker import MessageLimits
    from epu.common.inbound import Delivery, open_delivery
    from epu.common.messages import DecodeError

    try:
        envelope, msg = open_delivery(Delivery(body, dict(properties), dict(headers)), MessageLimits())
        return envelope.type, msg
    except DecodeError:
        pass
    type_ = _text(properties.get("type"))
    if not type_:
        try:
            import msgpack

            env = msgpack.unpackb(body, raw=False, strict_map_key=False)
            type_ = str(env.get("type", "")) if isinstance(env, dict) else ""
        except Exception:
            type_ = ""
    return type_ or "(unknown)", None


def describe(body: bytes, properties: dict[str, Any], headers: dict[str, Any],
             notes: dict[tuple[str, str], DeathNote] | None = None, policy: SenderPolicy | None = None,
             topology: Topology | None = None) -> DeadLetter:
    """What a dead letter is, from its bytes and AMQP metadata and the trusted death notes
    (``(queue, body sha256)`` → newest note). Pure."""
    policy = policy or SenderPolicy()
    topology = topology or Topology()
    death = _x_death(headers)
    queue, death_reason = death_queue(headers)
    msg_id = _text(properties.get("message_id"))
    sha = body_sha256(body)
    key = msg_id or sha[:12]
    type_, msg = _decode(body, properties, headers)
    user = properties.get("user_id")
    sender = _text(user) or None
    note = (notes or {}).get((queue, sha)) if queue else None
    if note is not None:
        reason, reason_from = note.reason, f"death note of the reader of {note.queue}"
    elif death_reason:
        reason, reason_from = f"{death_reason} by the broker", "broker (x-death)"
    else:
        reason, reason_from = "(no reason recorded)", "nobody"
    if queue is None:
        reason_from = "nobody: no x-death record, the broker did not dead-letter it"
    when: Any = note.dead_at if note is not None else None
    if when is None:
        t = death.get("time")
        when = t.timestamp() if hasattr(t, "timestamp") else (t if isinstance(t, int | float) else None)
    facts = LetterFacts(type=type_, message=msg, user=sender, death_queue=queue, note=note)
    exchange, routing_key = requeue_route(msg, topology) if msg is not None else ("", "")
    domain = getattr(msg, "domain", None)
    force = getattr(msg, "force", None)
    return DeadLetter(
        key=key, type=type_, domain=domain if isinstance(domain, str) else None,
        force=force if isinstance(force, bool) else None, sender=sender, reason=reason, reason_from=reason_from,
        queue=queue or "", exchange=exchange, routing_key=routing_key,
        dead_at=float(when) if when is not None else None,
        attempts=note.attempts if note is not None else None, size=len(body), facts=facts, body=body,
        properties=dict(properties), headers=dict(headers), refusal=requeue_refusal(facts, policy, topology))


def resolve(letters: list[DeadLetter], prefix: str) -> int:
    """The index of the one letter ``prefix`` names (its key, or the start of only one key)."""
    if not prefix:
        raise DeadError("give a dead letter's key (or the start of one): epu dead list names them")
    exact = [i for i, d in enumerate(letters) if d.key == prefix]
    if exact:
        return exact[0]  # copies of one message share its key: any of them
    matches = [i for i, d in enumerate(letters) if d.key.startswith(prefix)]
    keys = sorted({letters[i].key for i in matches})
    if not keys:
        raise DeadError(f"no dead letter {prefix!r} (epu dead list names them)")
    if len(keys) > 1:
        shown = ", ".join(keys[:5]) + (" ..." if len(keys) > 5 else "")
        raise DeadError(f"{prefix!r} is ambiguous: {len(keys)} dead letters start with it ({shown}); "
                        "give more of the key")
    return matches[0]


class DeadError(RuntimeError):
    """What ``show`` or ``requeue`` could not do: one line, exit status 1."""


def _open(broker: Any) -> tuple[Any, Any]:
    from epu.common.inbound import allow_deep_headers

    allow_deep_headers()  # a letter keeps its sender's headers, however deep (py-amqp parses them recursively)
    conn = broker.connection()
    channel = conn.channel()
    channel.auto_decode = False
    return conn, channel


def _read(channel: Any, queue: str, limit: int) -> list[Any]:
    out = []
    while len(out) < limit and (raw := channel.basic_get(queue=queue, no_ack=False)) is not None:
        out.append(raw)
    return out


def _parts(raw: Any) -> tuple[bytes, dict[str, Any], dict[str, Any]]:
    props = dict(raw.properties or {})
    headers = dict(props.pop("application_headers", None) or {})
    return bytes(raw.body), props, headers


def _notes(channel: Any, broker: Any, limit: int = MAX_LIST) -> tuple[dict[tuple[str, str], DeathNote], list[DeathNote]]:
    """The trusted death notes (all put back): ``(queue, body sha256)`` → newest, and the notes of
    messages their queue did not keep (latest-value queues). A missing notes queue is no note."""
    from amqp.exceptions import NotFound

    queue = broker.topology.n(DEATH_NOTES_QUEUE)
    try:
        channel.queue_declare(queue=queue, passive=True)
    except NotFound:  # definitions older than the notes: the channel is closed, take a new one
        return {}, []
    taken = _read(channel, queue, limit)
    index: dict[tuple[str, str], DeathNote] = {}
    dropped: list[DeathNote] = []
    try:
        for raw in taken:
            body, props, _headers = _parts(raw)
            try:
                note = DeathNote.decode(body)
            except NoteError:
                continue
            routing_key = _text((getattr(raw, "delivery_info", None) or {}).get("routing_key"))
            if not note_is_trusted(note, routing_key, _text(props.get("user_id")) or None, broker.senders,
                                   broker.topology):
                continue
            if not note.kept:
                dropped.append(note)
            k = (note.queue, note.body_sha256)
            if k not in index or note.dead_at >= index[k].dead_at:
                index[k] = note
    finally:
        for raw in taken:
            channel.basic_reject(raw.delivery_tag, requeue=True)
    return index, dropped


def _letters(channel: Any, broker: Any, notes: dict[tuple[str, str], DeathNote], limit: int) -> tuple[list[Any], list[DeadLetter]]:
    taken = _read(channel, broker.topology.n(DEAD_LETTER_QUEUE), limit)
    return taken, [describe(*_parts(r), notes=notes, policy=broker.senders, topology=broker.topology) for r in taken]


def peek(broker: Any, limit: int = MAX_LIST) -> tuple[list[DeadLetter], int, list[DeathNote]]:
    """The dead letters (up to ``limit``), how many the queue holds, and the notes of messages
    their queue did not keep; all left in place."""
    conn, channel = _open(broker)
    try:
        notes, dropped = _notes(channel, broker)
        if not channel.is_open:
            channel = conn.channel()
            channel.auto_decode = False
        total = channel.queue_declare(queue=broker.topology.n(DEAD_LETTER_QUEUE), passive=True).message_count
        taken, letters = _letters(channel, broker, notes, limit)
        for r in taken:
            channel.basic_reject(r.delivery_tag, requeue=True)
        return letters, total, dropped
    finally:
        conn.release()


def _refused_publish(letter: DeadLetter, exc: Exception) -> str:
    text = str(exc)
    if "user_id property set to" in text:
        return (f"the broker would not send it as its sender {letter.sender!r}: a requeue keeps the letter's "
                f"sender, never lends the requeuer's — requeue it as {letter.sender} or as a broker user with the "
                f"impersonator tag ({text[:300]})")
    return f"{type(exc).__name__}: {text[:500]}"


def requeue(broker: Any, key: str, source: str) -> DeadLetter:
    """Send the dead letter ``key`` (or the one whose key starts so) on, as its sender, then remove it."""
    from epu.common.broker import Publisher

    conn, channel = _open(broker)
    try:
        notes, _ = _notes(channel, broker)
        if not channel.is_open:
            channel = conn.channel()
            channel.auto_decode = False
        taken, letters = _letters(channel, broker, notes, MAX_LIST)
        try:
            i = resolve(letters, key)
        except DeadError:
            for raw in taken:
                channel.basic_reject(raw.delivery_tag, requeue=True)
            raise
        chosen, letter = taken[i], letters[i]
        for j, raw in enumerate(taken):
            if j != i:
                channel.basic_reject(raw.delivery_tag, requeue=True)
        if letter.refusal is not None:
            channel.basic_reject(chosen.delivery_tag, requeue=True)
            raise DeadError(f"dead letter {letter.key} not requeued (kept): {letter.refusal}")
        pub = Publisher(broker, source=source)
        props = letter.properties
        try:
            pub.publish_raw(letter.body, exchange=letter.exchange, routing_key=letter.routing_key,
                            headers=resent_headers(letter.headers),
                            message_id=_text(props.get("message_id")) or None,
                            type_=_text(props.get("type")) or None,
                            correlation_id=_text(props.get("correlation_id")) or None,
                            content_type=_text(props.get("content_type")) or None,
                            content_encoding=_text(props.get("content_encoding")) or None,
                            mandatory=True, user_id=letter.sender)
        except Exception as exc:
            channel.basic_reject(chosen.delivery_tag, requeue=True)
            raise DeadError(f"dead letter {letter.key} not requeued (kept): {_refused_publish(letter, exc)}") from None
        finally:
            pub.close()
        channel.basic_ack(chosen.delivery_tag)
        return letter
    finally:
        conn.release()


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= n:
            return f"{seconds / n:.1f}{unit}"
    return f"{seconds:.0f}s"


def _what(d: DeadLetter) -> str:
    if d.domain is None:
        return d.type
    return f"{d.type} {d.domain}" + (" FORCE" if d.force else "")


def cmd_list(args: argparse.Namespace) -> int:
    config = load_or_exit(args.config)
    letters, total, dropped = peek(config.broker_obj(), args.limit)
    now = time.time()
    if args.json:
        print(json.dumps({"total": total, "letters": [d.summary(now) for d in letters],
                          "dropped": [vars(n) for n in dropped]}, indent=2))
        return 0
    if not letters:
        print("no dead letter")
    else:
        print(f"{'KEY':<34} {'WHAT':<30} {'AGE':>6}  {'QUEUE':<28} {'SENDER':<22} REASON")
        for d in letters:
            print(f"{d.key[:34]:<34} {_what(d)[:30]:<30} {_age(d.age(now)):>6}  {d.queue[:28]:<28} "
                  f"{(d.sender or '-')[:22]:<22} {d.reason[:200]}")
        if total > len(letters):
            print(f"... {total - len(letters)} more (--limit)")
    for n in dropped[-MAX_DROPPED_SHOWN:]:
        print(f"dropped (not kept: {n.queue} is a latest-value queue): {n.type or '?'} from {n.sender or '?'} "
              f"{_age(max(0.0, now - n.dead_at))} ago: {n.reason[:200]}")
    if len(dropped) > MAX_DROPPED_SHOWN:
        print(f"... and {len(dropped) - MAX_DROPPED_SHOWN} older dropped messages (--json lists them all)")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    config = load_or_exit(args.config)
    letters, _, _ = peek(config.broker_obj())
    try:
        found = letters[resolve(letters, args.key)]
    except DeadError as exc:
        print(f"epu dead show: {exc}", file=sys.stderr)
        return 1
    doc = found.summary(time.time())
    try:
        import msgpack

        doc["body"] = msgpack.unpackb(found.body, raw=False, strict_map_key=False)
    except Exception:
        doc["body_hex"] = found.body[:512].hex()
    doc["headers"] = {str(k): v for k, v in safe_headers(found.headers).items() if k != "x-death"}
    doc["x-death"] = _x_death(found.headers)
    claims = sorted(str(k) for k in found.headers if str(k).startswith("x-epu-"))
    if claims:
        doc["sender_claims"] = (f"{', '.join(claims)}: written by the sender, not by EPU (the runtime writes no "
                                "header on a dead letter in RabbitMQ); not believed")
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
    print(f"requeued {d.key} ({_what(d)}) to {d.exchange} with key {d.routing_key}, as {d.sender or 'no user_id'}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("dead", help="the dead-letter queue: list, show, requeue", formatter_class=RAW,
                       description="Messages a service could not decode, validate or handle wait in the\n"
                                   "dead-letter queue (epu.dead), put there by the broker as they were sent, with\n"
                                   "the service's note of why (epu.dead.notes), for dead_letter_days\n"
                                   "(deploy/rabbitmq). Reading them changes nothing; requeue sends one back where it\n"
                                   "was going, after a fix, as the user that first sent it.",
                       epilog="Examples:\n  epu dead list\n  epu dead show 3f2a9c\n  epu dead requeue 3f2a9c\n\n"
                              "KEY may be any unique start of a key (an ambiguous one is an error).\n"
                              "Permissions: list and show need read on epu.dead and epu.dead.notes (the\n"
                              "epu-operator user has it). requeue keeps the letter's sender (its user_id):\n"
                              "RabbitMQ takes that from the same user or from a user with the impersonator\n"
                              "tag, so an operator requeues its own policy changes and terminations, and a\n"
                              "broker administrator (impersonator) requeues what a service sent.\n"
                              "Exit status: see each ACTION's --help; 2 when no ACTION is given.")
    p.set_defaults(func=lambda _args: p.print_help() or 2)
    dsub = p.add_subparsers(dest="dead_command", metavar="ACTION")
    s = dsub.add_parser("list", help="each dead letter's key, type, domain, age, queue, sender and reason",
                        formatter_class=RAW,
                        description="One line per dead letter, oldest first: its key (for show and requeue), its\n"
                                    "type and domain (FORCE for a forced terminate), how long ago it died, the queue\n"
                                    "it died in, the user that sent it and why (the rejecting service's note, or the\n"
                                    "broker's record). Then the messages latest-value queues refused and dropped.",
                        epilog="Example: epu dead list --limit 50 -c /etc/epu/operator.toml\n"
                               "Exit status: 0 listed; 1 RabbitMQ refused or cannot be reached; 2 bad configuration.")
    s.add_argument("--limit", type=int, default=1000, help="list at most N (default 1000)")
    s.add_argument("--json", action="store_true", help="print {total, letters: [...], dropped: [...]} as JSON")
    add_config_arg(s)
    s.set_defaults(func=cmd_list)
    s = dsub.add_parser("show", help="one dead letter whole: type, domain, force, sender, reason, body",
                        formatter_class=RAW,
                        description="Print KEY's type, domain and force first, then its sender, reason, whether\n"
                                    "requeue would send it (and why not), its AMQP headers and body (decoded from\n"
                                    "msgpack where it decodes, else the first 512 bytes in hex) as JSON. x-epu-*\n"
                                    "headers on a letter are its sender's claims and are flagged as such.",
                        epilog="Example: epu dead show 3f2a9c -c /etc/epu/operator.toml\n"
                               "Exit status: 0 shown; 1 no such dead letter, an ambiguous KEY, or RabbitMQ\n"
                               "unreachable; 2 bad configuration.")
    s.add_argument("key", help="a key `epu dead list` shows, or any unique start of one")
    add_config_arg(s)
    s.set_defaults(func=cmd_show)
    s = dsub.add_parser("requeue", help="send one dead letter back where it was going, as its sender",
                        formatter_class=RAW,
                        description="Check KEY may be sent on, publish its original bytes on the routing key its\n"
                                    "body makes with its original user_id (with confirms), then remove it from the\n"
                                    "dead-letter queue. Refused (and kept): a letter the broker never dead-lettered,\n"
                                    "one that died because its sender was not allowed to send it, one that died in a\n"
                                    "queue its type never reaches, one whose sender may not send it. Do it after\n"
                                    "fixing what made it fail: a message that fails again comes back with a new note.",
                        epilog="Example: epu dead requeue 3f2a9c -c /etc/epu/operator.toml\n"
                               "Exit status: 0 requeued; 1 no such dead letter, an ambiguous KEY, a letter refused,\n"
                               "or the broker refused the publish (the dead letter is kept); 2 bad configuration.")
    s.add_argument("key", help="a key `epu dead list` shows, or any unique start of one")
    add_config_arg(s)
    s.set_defaults(func=cmd_requeue)
