"""RabbitMQ definitions (``rabbitmqctl import_definitions``) generated from ``common.topology``.

Why generated: the broker's exchanges, queues and permissions must match what the services
declare and use, exactly (a quorum queue declared with other arguments is refused). Deriving
them from the one declaration means they cannot drift; a test compares the committed
``deploy/rabbitmq/definitions.json`` with this output and loads it into a real broker.

Least privilege, one user per service:

* ``epu-sensor-DOMAIN`` reads only its command queue, writes only ``sensor.snapshot.DOMAIN``,
  ``node.result.DOMAIN`` and ``slurm.power.DOMAIN`` events (RabbitMQ topic permissions) and death notes for its queue.
* ``epu-decision`` reads its input, control and per-domain snapshot queues; sends node commands, launches and
  terminations (``provisioner.launch``, ``provisioner.terminate``); writes decision records,
  domain statuses and policy outcomes, and death notes for the queues it reads.
* ``epu-provisioner`` reads the provisioner queue; writes instance state events, reports and provisioner
  alerts, and death notes for its queue.
* ``epu-ctxbroker`` reads terminated-instance events; writes context membership events and death notes
  for its queue.
* ``epu-operator`` sends policy changes and terminations (``provisioner.terminate``, never
  ``provisioner.launch``); declares and reads its own exclusive tap queues (``epu.tap.*``)
  bound to any event, reads the engine's status queues (``epu.status.DOMAIN``, without
  consuming: basic.get then requeue), the dead-letter queue and the death notes (``epu dead``) —
  what ``epu tap``, ``epu status``, ``epu record``, ``epu dead``, ``epu instances``
  and ``epu policy`` need, and nothing more (``epu cost`` reads the services' stores, not the broker).

Nobody writes the dead-letter exchange ``epu.dlx``: only the broker puts messages there (a consumer
rejects a message; its queue's ``x-dead-letter-exchange`` takes it, with the validated ``user_id``
it was sent with and the broker's ``x-death`` record). A user that could publish there could make
a letter look like anything — issue 33: a sensor injected a forced terminate of another domain's
instance that ``epu dead requeue`` then sent on as the operator. Why each message was rejected is
a *death note* (``common.deadletters``) published to ``epu.notes`` (kept in ``epu.dead.notes``)
with the rejecting queue's name as its routing key: each service user may publish there only the
names of the queues it reads, so a note is bound to the service that rejected the message, as a
message is bound to its sender.

Bounds, by policy (``QueueBounds``): the decision input and work queues refuse publishes
beyond a byte size (the publisher is told, nothing is dropped silently); dead letters are
kept ``dead_letter_days`` and then expire, the oldest dropped first beyond a byte size; a
tap left suspended drops its oldest events beyond a byte size instead of filling the
broker's memory and blocking every publisher.

No user has configure permission on the shared entities, so services run with
``[broker] declare = false``. The committed file carries no passwords: set them with
``rabbitmqctl change_password``, or generate a file with hashes (``--passwords-file``), which
must name every user exactly (a missing or misspelled user is an error, not a passwordless
account).
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
from dataclasses import dataclass
from typing import Any

from epu.common.topology import (
    COMMANDS_EXCHANGE,
    DEAD_LETTER_EXCHANGE,
    DEAD_LETTER_QUEUE,
    DEATH_NOTES_EXCHANGE,
    DEATH_NOTES_QUEUE,
    DECISION_INPUT_QUEUE,
    EVENTS_EXCHANGE,
    LAUNCH_KEY,
    TERMINATE_KEY,
    QueueSpec,
    Topology,
)

HASHING = "rabbit_password_hashing_sha256"
TAP_QUEUE_PATTERN = r"epu\.tap\..*"
MIB = 1024 * 1024


class DefinitionsError(ValueError):
    """The definitions cannot be generated as asked (e.g. a passwords file that does not match)."""


@dataclass(frozen=True)
class QueueBounds:
    """How much each kind of queue may hold (RabbitMQ policies in the definitions)."""

    input_max_bytes: int = 256 * MIB
    """The decision input: beyond this, publishes are refused (publishers retry from their outbox)."""
    input_max_length: int = 100_000
    work_max_bytes: int = 256 * MIB
    """Command queues (sensors, provisioners, decision control, context broker): refused beyond."""
    dead_letter_days: float = 14.0
    """How long a dead letter is kept for an operator to inspect."""
    dead_max_bytes: int = 1024 * MIB
    """Dead letters beyond this drop the oldest first."""
    tap_max_bytes: int = 64 * MIB
    """An operator's tap beyond this drops its oldest events."""
    tap_max_length: int = 100_000


def hash_password(password: str, salt: bytes | None = None) -> str:
    """RabbitMQ's SHA-256 password hash: base64(salt + sha256(salt + password))."""
    salt = salt if salt is not None else os.urandom(4)
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


@dataclass(frozen=True)
class ServiceUser:
    name: str
    configure: str
    write: str
    read: str
    topic_write: dict[str, str]
    topic_read: dict[str, str]
    purpose: str


def _alt(*names: str) -> str:
    return "^(" + "|".join(names) + ")$"


def service_users(topology: Topology, domains: list[str], user_prefix: str = "") -> list[ServiceUser]:
    t = topology
    ev, cmd, notes = (re.escape(t.n(x)) for x in (EVENTS_EXCHANGE, COMMANDS_EXCHANGE, DEATH_NOTES_EXCHANGE))
    q = {spec.name: re.escape(t.n(spec.name)) for spec in t.service_specs(domains)}
    notes_ex = t.n(DEATH_NOTES_EXCHANGE)
    users = []
    for d in domains:
        spec = t.sensor_spec(d)
        users.append(ServiceUser(
            f"{user_prefix}epu-sensor-{d}", "^$", _alt(ev, notes), _alt(q[spec.name]),
            {t.n(EVENTS_EXCHANGE): rf"^(sensor\.snapshot|node\.result|slurm\.power)\.{re.escape(d)}$",
             notes_ex: _alt(q[spec.name])}, {},
            f"sensor of domain {d}"))
    snapshots = [q[t.decision_snapshot_spec(d).name] for d in domains]
    statuses = [q[t.status_spec(d).name] for d in domains]
    decision_reads = _alt(q[t.decision_input_spec().name], q[t.decision_control_spec().name], *snapshots)
    users.append(ServiceUser(
        f"{user_prefix}epu-decision", "^$", _alt(ev, cmd, notes), decision_reads,
        {t.n(EVENTS_EXCHANGE): r"^(decision\.(record|status)|policy\.outcome)\..+$",
         t.n(COMMANDS_EXCHANGE): rf"^(sensor\..+|{re.escape(LAUNCH_KEY)}|{re.escape(TERMINATE_KEY)})$",
         notes_ex: decision_reads}, {},
        "decision engine"))
    prov = _alt(q[t.provisioner_spec().name])
    users.append(ServiceUser(
        f"{user_prefix}epu-provisioner", "^$", _alt(ev, notes), prov,
        {t.n(EVENTS_EXCHANGE): r"^(instance\.(state|report)|provisioner\.alert)\..+$", notes_ex: prov}, {},
        "provisioner"))
    ctx = _alt(q[t.ctxbroker_spec().name])
    users.append(ServiceUser(
        f"{user_prefix}epu-ctxbroker", "^$", _alt(ev, notes), ctx,
        {t.n(EVENTS_EXCHANGE): r"^context\.member\..+$", notes_ex: ctx}, {}, "context broker"))
    tap = re.escape(t.prefix) + TAP_QUEUE_PATTERN
    dead = re.escape(t.n(DEAD_LETTER_QUEUE))
    dead_notes = re.escape(t.n(DEATH_NOTES_QUEUE))
    users.append(ServiceUser(
        f"{user_prefix}epu-operator", f"^{tap}$", _alt(cmd, tap), _alt(ev, tap, *statuses, dead, dead_notes),
        {t.n(COMMANDS_EXCHANGE): rf"^(decision\.control|{re.escape(TERMINATE_KEY)})$"}, {},
        "operators: policy changes, terminations, taps"))
    return users


def _queue_def(topology: Topology, spec: QueueSpec, vhost: str) -> dict[str, Any]:
    q = topology.kombu_queues(spec)[0]
    return {"name": q.name, "vhost": vhost, "durable": True, "auto_delete": False,
            "arguments": dict(sorted(q.queue_arguments.items()))}


def check_passwords(users: list[ServiceUser], passwords: dict[str, str]) -> None:
    """Every user has a non-empty password and no password names an unknown user."""
    names = [u.name for u in users]
    missing = [n for n in names if not passwords.get(n)]
    unknown = sorted(set(passwords) - set(names))
    problems = []
    if missing:
        problems.append("no password for " + ", ".join(missing))
    if unknown:
        problems.append("passwords for users that do not exist (misspelled?): " + ", ".join(unknown)
                        + "; expected: " + ", ".join(names))
    if problems:
        raise DefinitionsError("; ".join(problems))


def queue_policies(topology: Topology, domains: list[str], vhost: str, bounds: QueueBounds) -> list[dict[str, Any]]:
    """The bounds as RabbitMQ policies (one per kind of queue; a queue matches exactly one)."""
    t = topology
    pre = re.escape(t.prefix)
    work = [s.name for s in t.service_specs(domains)
            if s.name not in (DEAD_LETTER_QUEUE, DECISION_INPUT_QUEUE) and s.dead_letter]  # not latest-value queues

    def policy(name: str, pattern: str, definition: dict[str, Any]) -> dict[str, Any]:
        return {"vhost": vhost, "name": name, "pattern": pattern, "apply-to": "queues", "priority": 0,
                "definition": definition}

    return [
        policy("epu-taps", f"^{pre}{TAP_QUEUE_PATTERN}$",
               {"max-length": bounds.tap_max_length, "max-length-bytes": bounds.tap_max_bytes,
                "overflow": "drop-head"}),
        policy("epu-dead", f"^({re.escape(t.n(DEAD_LETTER_QUEUE))}|{re.escape(t.n(DEATH_NOTES_QUEUE))})$",
               {"message-ttl": int(bounds.dead_letter_days * 86_400_000), "max-length-bytes": bounds.dead_max_bytes,
                "overflow": "drop-head"}),
        policy("epu-decision-input", f"^{re.escape(t.n(DECISION_INPUT_QUEUE))}$",
               {"max-length": bounds.input_max_length, "max-length-bytes": bounds.input_max_bytes,
                "overflow": "reject-publish"}),
        policy("epu-work", "^(" + "|".join(re.escape(t.n(n)) for n in work) + ")$",
               {"max-length-bytes": bounds.work_max_bytes, "overflow": "reject-publish"}),
    ]


def rabbitmq_definitions(topology: Topology, domains: list[str], vhost: str = "epu", user_prefix: str = "",
                         passwords: dict[str, str] | None = None,
                         bounds: QueueBounds | None = None) -> dict[str, Any]:
    """The definitions document. ``passwords`` (user → password), when given, must name every
    user and only them (``DefinitionsError`` otherwise); without it users get no password."""
    users = service_users(topology, domains, user_prefix)
    if passwords is not None:
        check_passwords(users, passwords)
    passwords = passwords or {}
    exchanges = [
        {"name": ex.name, "vhost": vhost, "type": ex.type, "durable": True, "auto_delete": False,
         "internal": False, "arguments": {}}
        for ex in (topology.events_exchange, topology.commands_exchange, topology.dead_letter_exchange,
                   topology.death_notes_exchange)
    ]
    specs = topology.service_specs(domains)
    bindings = [
        {"source": topology.n(spec.exchange), "vhost": vhost, "destination": topology.n(spec.name),
         "destination_type": "queue", "routing_key": "" if spec.exchange == DEAD_LETTER_EXCHANGE else key,
         "arguments": {}}
        for spec in specs for key in spec.routing_keys
    ]
    return {
        "rabbit_version": "3.10.8",
        "users": [
            {"name": u.name, "password_hash": hash_password(passwords[u.name]) if u.name in passwords else "",
             "hashing_algorithm": HASHING, "tags": []}
            for u in users
        ],
        "vhosts": [{"name": vhost}],
        "permissions": [
            {"user": u.name, "vhost": vhost, "configure": u.configure, "write": u.write, "read": u.read}
            for u in users
        ],
        "topic_permissions": [
            {"user": u.name, "vhost": vhost, "exchange": ex, "write": pattern, "read": u.topic_read.get(ex, ".*")}
            for u in users for ex, pattern in sorted(u.topic_write.items())
        ],
        "policies": queue_policies(topology, domains, vhost, bounds or QueueBounds()),
        "queues": [_queue_def(topology, spec, vhost) for spec in specs],
        "exchanges": exchanges,
        "bindings": bindings,
    }


def write_private(path: str, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only (0600, also when it existed):
    a definitions file with password hashes is a secret."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
    finally:
        os.close(fd)
