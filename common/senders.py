"""Who may send what: every inbound message bound to the identity allowed to send it.

Why: a message's body says which domain (or instance) it is about, but the body is written by
the sender. RabbitMQ's topic permissions (deploy/rabbitmq, ``common.definitions``) let the
sensor of domain beta publish only on beta's keys — yet a body saying ``domain: alpha`` on
beta's key used to be stored as alpha's newest snapshot: a forged snapshot showing alpha's busy
nodes idle made the engine drain them. The least privilege means something only if the
consumer believes what the broker authenticated (the exchange and routing key the message came
by, and the validated ``user_id``) and not what the body claims.

Two rules, checked by the runtime for every message off a durable queue of the topology
(``Service._handle_delivery``), a mismatch dead-lettered with the reason (``x-epu-reason``):

* **The key is the body's.** A message must arrive on its type's exchange with exactly the
  routing key its own publisher derives from its body (``Message.routing_key()``): a snapshot
  of alpha comes by ``sensor.snapshot.alpha``, a result of beta's sensor by
  ``node.result.beta``, an instance event of alpha by ``instance.state.alpha.<state>``. With
  the least-privilege users only alpha's sensor can publish on alpha's keys, so the body's
  domain is the sender's.
* **The user is the one allowed.** RabbitMQ refuses a publish whose ``user_id`` property is not
  the connection's user, so a ``user_id`` is the authenticated sender (``Publisher`` sets it on
  every AMQP publish). A message sent as one of EPU's service users (``epu-sensor-<domain>``,
  ``epu-decision``, ``epu-provisioner``, ``epu-ctxbroker``, ``epu-operator``, with the
  deployment's ``user_prefix``) must be sent by a user allowed to send that type for that
  domain (``ALLOWED``). A message without ``user_id``, or from a user that is none of EPU's
  (``guest`` in development), is accepted only while ``require_sender_user`` is false; a
  production deployment with deploy/rabbitmq's users sets it true.

The in-memory transport (``memory://``, the one-process demo) has no users: every service of
the process is one trust domain, publishers set no ``user_id``, and only the key rule applies.
The simulator's bus carries each process's identity itself (docs/simulation.md).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

from epu.common.messages import Message
from epu.common.topology import Topology

#: Message type → the roles that may send it; ``{domain}`` is the message's domain.
ALLOWED: dict[str, tuple[str, ...]] = {
    "sensor.snapshot": ("epu-sensor-{domain}",),
    "node.result": ("epu-sensor-{domain}",),
    "slurm.power": ("epu-sensor-{domain}",),
    "instance.state": ("epu-provisioner",),
    "instance.report": ("epu-provisioner",),
    "provisioner.alert": ("epu-provisioner",),
    "node.command": ("epu-decision",),
    "instance.launch": ("epu-decision",),
    "instance.terminate": ("epu-decision", "epu-operator"),
    "policy.change": ("epu-operator",),
    "policy.outcome": ("epu-decision",),
    "decision.record": ("epu-decision",),
    "decision.status": ("epu-decision",),
    "context.member": ("epu-ctxbroker",),
}

_SERVICE_USER = r"epu-(sensor-.+|decision|provisioner|ctxbroker|operator)"


@functools.lru_cache(maxsize=4096)
def _allowed(prefix: str, type_: str, domain: str) -> tuple[str, ...]:
    return tuple(prefix + r.format(domain=domain) for r in ALLOWED.get(type_, ()))


@dataclass(frozen=True)
class SenderPolicy:
    """How strictly inbound messages are bound to their senders (``[broker]`` settings)."""

    user_prefix: str = ""
    """Prefix of the service users' names, as deploy/rabbitmq's definitions were generated with."""
    require_sender_user: bool = False
    """True: refuse a message whose validated ``user_id`` is missing or not the service user
    allowed to send it. False: a message from a user that is none of EPU's (or none at all) is
    accepted; one sent as an EPU service user must still be sent by one allowed."""

    def allowed_users(self, type_: str, domain: str | None) -> tuple[str, ...]:
        """The user names that may send a message of ``type_`` about ``domain``."""
        return _allowed(self.user_prefix, type_, domain or "")

    def is_service_user(self, user: str) -> bool:
        return re.fullmatch(re.escape(self.user_prefix) + _SERVICE_USER, user) is not None

    def check(self, topology: Topology, delivery: Any, type_: str, msg: Message) -> str | None:
        """Why ``msg`` (of envelope type ``type_``) may not be acted on as sent, or None.
        ``delivery`` is a ``common.inbound.Delivery`` (exchange, routing key, properties)."""
        reason = self.check_key(topology, delivery.exchange, delivery.routing_key, type_, msg)
        if reason is not None:
            return reason
        user = delivery.properties.get("user_id")
        return self.check_user(user if isinstance(user, str) and user else None, type_, msg)

    @staticmethod
    def check_key(topology: Topology, exchange: str, routing_key: str, type_: str, msg: Message) -> str | None:
        """The key rule: the message came by its type's exchange with the key its body makes."""
        try:
            expected = msg.routing_key()
        except NotImplementedError:
            return None
        want_exchange = topology.exchange_for(type_).name
        domain = getattr(msg, "domain", None)
        about = f" (body says domain {domain!r})" if isinstance(domain, str) else ""
        if exchange != want_exchange:
            return (f"{type_} came by exchange {exchange!r}, not {want_exchange!r}: a message is bound to the "
                    f"exchange and key its sender may publish on{about}")
        if routing_key != expected:
            return (f"{type_} came by routing key {routing_key!r} but its body is for {expected!r}{about}: "
                    "the body may not claim what the key it was sent on does not allow")
        return None

    def check_user(self, user: str | None, type_: str, msg: Message) -> str | None:
        """The user rule (see the module's docstring)."""
        domain = getattr(msg, "domain", None)
        allowed = self.allowed_users(type_, domain if isinstance(domain, str) else None)
        if not allowed or (user is not None and user in allowed):
            return None
        whom = " or ".join(allowed)
        what = f"{type_} of domain {domain!r}" if isinstance(domain, str) else type_
        if user is not None and self.is_service_user(user):
            return f"{what} sent by user {user!r}: only {whom} may send it"
        if self.require_sender_user:
            sender = f"user {user!r}" if user is not None else "no user_id"
            return f"{what} sent with {sender}: only {whom} may send it (require_sender_user)"
        return None
