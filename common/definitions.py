"""RabbitMQ definitions (``rabbitmqctl import_definitions``) generated from ``common.topology``.

Why generated: the broker's exchanges, queues and permissions must match what the services
declare and use, exactly (a quorum queue declared with other arguments is refused). Deriving
them from the one declaration means they cannot drift; a test compares the committed
``deploy/rabbitmq/definitions.json`` with this output and loads it into a real broker.

Least privilege, one user per service:

* ``epu-sensor-DOMAIN`` reads only its command queue, writes only ``sensor.snapshot.DOMAIN``
  and ``node.result.DOMAIN`` events (RabbitMQ topic permissions) and the dead-letter exchange.
* ``epu-decision`` reads its input and control queues; sends node commands, launches and
  terminations; writes decision records and policy outcomes.
* ``epu-provisioner`` reads the provisioner queue; writes instance state events.
* ``epu-ctxbroker`` reads terminated-instance events; writes context membership events.
* ``epu-operator`` sends policy changes and terminations; declares and reads its own
  exclusive tap queues bound to any event.

No user has configure permission on the shared entities, so services run with
``[broker] declare = false``. The committed file carries no passwords: set them with
``rabbitmqctl change_password``, or generate a file with hashes (``--passwords-file``).
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
from dataclasses import dataclass
from typing import Any

from common.topology import (
    COMMANDS_EXCHANGE,
    DEAD_LETTER_EXCHANGE,
    EVENTS_EXCHANGE,
    QueueSpec,
    Topology,
)

HASHING = "rabbit_password_hashing_sha256"
TAP_QUEUE_PATTERN = r"epu\.tap\..*"


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
    ev, cmd, dlx = (re.escape(t.n(x)) for x in (EVENTS_EXCHANGE, COMMANDS_EXCHANGE, DEAD_LETTER_EXCHANGE))
    q = {spec.name: re.escape(t.n(spec.name)) for spec in t.service_specs(domains)}
    users = []
    for d in domains:
        spec = t.sensor_spec(d)
        users.append(ServiceUser(
            f"{user_prefix}epu-sensor-{d}", "^$", _alt(ev, dlx), _alt(q[spec.name]),
            {t.n(EVENTS_EXCHANGE): rf"^(sensor\.snapshot|node\.result)\.{re.escape(d)}$"}, {},
            f"sensor of domain {d}"))
    users.append(ServiceUser(
        f"{user_prefix}epu-decision", "^$", _alt(ev, cmd, dlx),
        _alt(q[t.decision_input_spec().name], q[t.decision_control_spec().name]),
        {t.n(EVENTS_EXCHANGE): r"^(decision\.record|policy\.outcome)\..+$",
         t.n(COMMANDS_EXCHANGE): r"^(sensor\..+|provisioner)$"}, {}, "decision engine"))
    users.append(ServiceUser(
        f"{user_prefix}epu-provisioner", "^$", _alt(ev, dlx), _alt(q[t.provisioner_spec().name]),
        {t.n(EVENTS_EXCHANGE): r"^instance\.state\..+$"}, {}, "provisioner"))
    users.append(ServiceUser(
        f"{user_prefix}epu-ctxbroker", "^$", _alt(ev, dlx), _alt(q[t.ctxbroker_spec().name]),
        {t.n(EVENTS_EXCHANGE): r"^context\.member\..+$"}, {}, "context broker"))
    tap = re.escape(t.prefix) + TAP_QUEUE_PATTERN
    users.append(ServiceUser(
        f"{user_prefix}epu-operator", f"^{tap}$", _alt(cmd, tap), _alt(ev, tap),
        {t.n(COMMANDS_EXCHANGE): r"^(decision\.control|provisioner)$"}, {}, "operators: policy changes, taps"))
    return users


def _queue_def(topology: Topology, spec: QueueSpec, vhost: str) -> dict[str, Any]:
    q = topology.kombu_queues(spec)[0]
    return {"name": q.name, "vhost": vhost, "durable": True, "auto_delete": False,
            "arguments": dict(sorted(q.queue_arguments.items()))}


def rabbitmq_definitions(topology: Topology, domains: list[str], vhost: str = "epu", user_prefix: str = "",
                         passwords: dict[str, str] | None = None) -> dict[str, Any]:
    passwords = passwords or {}
    users = service_users(topology, domains, user_prefix)
    exchanges = [
        {"name": ex.name, "vhost": vhost, "type": ex.type, "durable": True, "auto_delete": False,
         "internal": False, "arguments": {}}
        for ex in (topology.events_exchange, topology.commands_exchange, topology.dead_letter_exchange)
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
        "policies": [
            {"vhost": vhost, "name": "epu-taps", "pattern": f"^{re.escape(topology.prefix)}{TAP_QUEUE_PATTERN}$",
             "apply-to": "queues", "priority": 0,
             "definition": {"max-length": 100000, "overflow": "drop-head"}},
        ],
        "queues": [_queue_def(topology, spec, vhost) for spec in specs],
        "exchanges": exchanges,
        "bindings": bindings,
    }
