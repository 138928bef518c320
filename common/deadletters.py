"""Dead letters: what the broker kept, why the service that rejected it says it died, and whether
a requeue may send it on. Pure: no I/O. The runtime writes the notes (``Service.dead_letter``),
``epu dead`` reads letters and notes (epu/cli_dead.py), and the simulator's operator requeues
through ``requeue_refusal`` as the CLI does.

Why it is built so (issue 33, a confused deputy). The runtime used to publish each dead letter to
the fanout ``epu.dlx`` itself, with its reason and origin in ``x-epu-*`` headers, so every service
user could write there. Beta's sensor published a forced terminate of alpha's instance straight
into it, with forged ``x-epu-original-*`` headers and an innocent reason; ``epu dead list`` showed
an ordinary letter and ``epu dead requeue`` sent it on as ``epu-operator``, whom the provisioner
believes. Now:

* **Only the broker writes the dead-letter exchange.** A consumer that cannot use a message
  rejects it (``basic.reject``, requeue false) and its queue's ``x-dead-letter-exchange`` takes it:
  the broker keeps the bytes, every property — the ``user_id`` it was published with, which
  RabbitMQ validated against the publisher's login — and adds its own ``x-death`` record. No
  user of the definitions may publish to ``epu.dlx`` (``common.definitions``); such a publish is
  refused with 403.
* **The reason is a note, bound to the service that rejected.** A header cannot be added on
  reject, so the runtime publishes a ``DeathNote`` (why, how many attempts, the body's SHA-256) to
  ``epu.notes`` with the rejecting queue's name as routing key, before it rejects. Each service user
  may publish only the names of the queues it reads (topic permissions), and a note is believed
  only from that queue's reader (``note_is_trusted``). A note only explains; no decision below
  rests on a note alone being absent.
* **A requeue keeps the original sender.** ``requeue_refusal`` refuses a letter with no broker
  record (``x-death``), one whose body does not decode, one that died because its sender was not
  allowed, one that died in a queue its type and key never reach, and one whose proven sender may
  not send it (the receivers' own rule, ``common.senders``). ``epu dead requeue`` then publishes
  the original bytes on the body's own routing key *with the letter's* ``user_id``: RabbitMQ
  accepts that only from the same user or a user with the ``impersonator`` tag, and the receiver
  checks the original sender as it did the first time. A requeue never lends the requeuer's
  authority.

What a letter's headers say beyond ``x-death``'s queue and reason is the sender's word: RabbitMQ
(3.10) keeps a publisher-written ``x-death`` entry that names the rejecting queue and reason and
only counts it up, with whatever exchange and routing keys the publisher wrote into it. So the
first entry's ``queue`` and ``reason`` are the broker's; its ``exchange`` and ``routing-keys``, and
any ``x-epu-*`` header, are not, and nothing here reads them.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import asdict, dataclass
from typing import Any

import msgpack
from epu.common.messages import Message
from epu.common.senders import SenderPolicy
from epu.common.topology import (
    CTXBROKER_QUEUE,
    DECISION_CONTROL_QUEUE,
    DECISION_INPUT_QUEUE,
    PROVISIONER_QUEUE,
    QueueSpec,
    Topology,
)

NOTE_TYPE = "dead.note"
"""The AMQP ``type`` property of a death note (not an EPU message: notes are never consumed by a service)."""
NOTE_VERSION = 1
MAX_NOTE_BYTES = 16 * 1024
"""A note larger than this is not one of ours (reasons are clipped to 1,000 characters)."""
SENDER_NOT_ALLOWED = "sender not allowed"
"""How the runtime's reason begins when the sender check refused a message."""


class NoteError(ValueError):
    """A death note that cannot be read: the message names the bad key."""


def body_sha256(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


@dataclass(frozen=True)
class DeathNote:
    """Why a service rejected one message off one of its queues (what it saw of it)."""

    queue: str
    """The queue it was taken from (also the note's routing key)."""
    reason: str
    body_sha256: str
    """Of the message's bytes: the note's link to its dead letter."""
    message_id: str | None
    type: str | None
    """The envelope's type, when it decoded."""
    sender: str | None
    """The ``user_id`` the message came with (validated by RabbitMQ), as the service saw it."""
    exchange: str
    routing_key: str
    attempts: int
    dead_at: float
    kept: bool
    """The queue dead-letters (the broker keeps the message in ``epu.dead``); False: a latest-value
    queue, which keeps none — the message is gone and this note is all that is left of it."""

    def encode(self) -> bytes:
        return msgpack.packb({"v": NOTE_VERSION, **asdict(self)}, use_bin_type=True)

    @classmethod
    def decode(cls, body: bytes) -> DeathNote:
        if len(body) > MAX_NOTE_BYTES:
            raise NoteError(f"death note of {len(body)} bytes: more than {MAX_NOTE_BYTES}")
        try:
            doc = msgpack.unpackb(body, raw=False, strict_map_key=True)
        except Exception as exc:
            raise NoteError(f"death note is not msgpack: {type(exc).__name__}") from None
        if not isinstance(doc, dict):
            raise NoteError(f"death note is a {type(doc).__name__}, not a map")
        if doc.get("v") != NOTE_VERSION:
            raise NoteError(f"death note key 'v': version {doc.get('v')!r}, expected {NOTE_VERSION}")
        out: dict[str, Any] = {}
        for name, kinds in _NOTE_FIELDS.items():
            value = doc.get(name)
            if not isinstance(value, kinds) or isinstance(value, bool) and bool not in kinds:
                raise NoteError(f"death note key {name!r}: {type(value).__name__} is not "
                                + " or ".join(k.__name__ for k in kinds))
            out[name] = value
        if not math.isfinite(float(out["dead_at"])):
            raise NoteError("death note key 'dead_at': not a finite number")
        out["dead_at"] = float(out["dead_at"])
        return cls(**out)


_NOTE_FIELDS: dict[str, tuple[type, ...]] = {
    "queue": (str,), "reason": (str,), "body_sha256": (str,), "message_id": (str, type(None)),
    "type": (str, type(None)), "sender": (str, type(None)), "exchange": (str,), "routing_key": (str,),
    "attempts": (int,), "dead_at": (int, float), "kept": (bool,),
}


# ---------------------------------------------------------------------- who reads which queue


def queue_spec(topology: Topology, queue: str) -> QueueSpec | None:
    """The durable queue of the topology named ``queue`` (with the topology's prefix), or None."""
    for spec in topology.service_specs([]):
        if topology.n(spec.name) == queue:
            return spec
    for base, make in (("epu.sensor.", topology.sensor_spec), ("epu.decision.snapshot.", topology.decision_snapshot_spec),
                       ("epu.status.", topology.status_spec)):
        full = topology.n(base)
        if queue.startswith(full):
            try:
                return make(queue[len(full):])
            except ValueError:  # not a domain name
                return None
    return None


def queue_reader(topology: Topology, queue: str) -> str | None:
    """The role (user name without prefix) that consumes ``queue``, or None (nobody's, or unknown)."""
    spec = queue_spec(topology, queue)
    if spec is None:
        return None
    if spec.name.startswith("epu.sensor."):
        return "epu-sensor-" + spec.name[len("epu.sensor."):]
    if spec.name in (DECISION_INPUT_QUEUE, DECISION_CONTROL_QUEUE) or spec.name.startswith("epu.decision.snapshot."):
        return "epu-decision"
    return {PROVISIONER_QUEUE: "epu-provisioner", CTXBROKER_QUEUE: "epu-ctxbroker"}.get(spec.name)


def note_is_trusted(note: DeathNote, routing_key: str, user: str | None, policy: SenderPolicy,
                    topology: Topology) -> bool:
    """Whether ``note`` (delivered with ``routing_key`` and ``user_id`` ``user``) is the word of the
    service that reads the queue it names: the key is that queue (the only key its user may publish
    there), and the validated user is that queue's reader — or, where the deployment accepts
    senders that are none of EPU's users (``require_sender_user`` false: a development broker's
    ``guest``), no EPU service user at all."""
    if routing_key != note.queue:
        return False
    role = queue_reader(topology, note.queue)
    if role is None:
        return False
    if user is not None and user == policy.user_prefix + role:
        return True
    return not policy.require_sender_user and (user is None or not policy.is_service_user(user))


# ---------------------------------------------------------------------- requeue


def topic_matches(pattern: str, key: str) -> bool:
    """AMQP topic matching: ``*`` is one word, ``#`` zero or more."""
    words, pat = key.split("."), pattern.split(".")
    ends = {0}  # positions in ``words`` reachable after the pattern words so far
    for p in pat:
        if p == "#":
            ends = set(range(min(ends), len(words) + 1)) if ends else set()
        else:
            ends = {i + 1 for i in ends if i < len(words) and (p == "*" or words[i] == p)}
        if not ends:
            return False
    return len(words) in ends


def requeue_route(message: Message, topology: Topology) -> tuple[str, str]:
    """Where a requeue sends a letter: its type's exchange, with the routing key its body makes —
    never an origin a header claims."""
    return topology.exchange_for(message).name, message.routing_key()


def queue_takes(topology: Topology, queue: str, message: Message) -> bool:
    """Whether ``message``, published as EPU publishes it, is delivered to ``queue``."""
    spec = queue_spec(topology, queue)
    if spec is None:
        return False
    exchange, key = requeue_route(message, topology)
    return topology.n(spec.exchange) == exchange and any(topic_matches(k, key) for k in spec.routing_keys)


@dataclass(frozen=True)
class LetterFacts:
    """What a requeue may go by, and nothing else."""

    type: str
    message: Message | None
    """The decoded body; None when it does not decode."""
    user: str | None
    """The ``user_id`` property: validated by RabbitMQ when the message was first published and kept
    by its dead-lettering. None: the publisher set none."""
    death_queue: str | None
    """The queue the broker dead-lettered it from (``x-death``'s first entry); None: no record."""
    note: DeathNote | None = None
    """The trusted note of its death, if one was found."""


def death_queue(headers: dict[str, Any]) -> tuple[str | None, str | None]:
    """(queue, reason) of the broker's newest death record (``x-death``'s first entry)."""
    deaths = headers.get("x-death")
    first = deaths[0] if isinstance(deaths, list) and deaths and isinstance(deaths[0], dict) else {}
    queue, reason = first.get("queue"), first.get("reason")
    queue = queue.decode("utf-8", "replace") if isinstance(queue, bytes) else queue
    reason = reason.decode("utf-8", "replace") if isinstance(reason, bytes) else reason
    return (queue if isinstance(queue, str) and queue else None,
            reason if isinstance(reason, str) and reason else None)


def requeue_refusal(facts: LetterFacts, policy: SenderPolicy, topology: Topology) -> str | None:
    """Why this letter may not be requeued, or None. The receivers check the requeued message
    again (its ``user_id`` is kept); this refuses up front what they would refuse or what no
    one should send on."""
    if facts.death_queue is None:
        return ("it has no x-death record: the broker never dead-lettered it (a message published "
                "straight to the dead-letter exchange is nobody's letter)")
    msg = facts.message
    if msg is None:
        return f"its body does not decode as an EPU message ({facts.type}): there is nothing to send on"
    note = facts.note
    if note is not None and note.reason.startswith(SENDER_NOT_ALLOWED):
        return f"it died because {note.reason}: a requeue does not change who sent it"
    if not queue_takes(topology, facts.death_queue, msg):
        _, key = requeue_route(msg, topology)
        return (f"it died in {facts.death_queue}, where a {msg.TYPE} with routing key {key!r} is never "
                "delivered: it was not sent where its body says")
    why = policy.check_user(facts.user, msg.TYPE, msg)
    if why is not None:
        return f"its sender may not send it: {why}"
    return None


#: Headers that are the broker's bookkeeping or a claim about a death: never sent on by a requeue.
_DEATH_HEADER = re.compile(r"^(x-death|x-(first|last)-death-.*|x-delivery-count|x-epu-.*)$")


def resent_headers(headers: dict[str, Any]) -> dict[str, Any]:
    """The letter's headers as its sender set them, without death bookkeeping or ``x-epu-*`` claims."""
    return {k: v for k, v in headers.items() if not _DEATH_HEADER.match(str(k))}
