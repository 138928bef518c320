"""The AMQP topology, declared once.

Everything a service or an operator needs to know about exchanges, queues, routing keys and
dead-lettering is here, as data. Services ask for queue specs by role; deploy/rabbitmq's
definitions are generated from the same declaration (``rabbitmq_definitions``), and
docs/messages.md documents it, so the three cannot drift.

Layout:

* ``epu.events`` (topic): everything observable. Routing key ``<type>.<domain>[.<detail>]``.
  A tap bound with ``#`` sees the whole system.
* ``epu.commands`` (topic, exact keys): commands to the one service that must act —
  ``sensor.<domain>`` → ``epu.sensor.<domain>``; ``provisioner.launch`` and
  ``provisioner.terminate`` → ``epu.provisioner`` (competing consumers; two keys so a
  permission can allow terminating without allowing launching); ``decision.control`` →
  ``epu.decision.control``. Commands are published ``mandatory``: a command no queue takes
  is returned to its sender as an error, never confirmed and dropped.
* ``epu.decision.input``: the events the engine must see in full (command results, instance
  states and reports), single-active-consumer so a standby engine takes over on failure.
* ``epu.decision.snapshot.<domain>``: the latest snapshot of each domain, one message deep
  (a new one drops the old), single-active-consumer: an engine never works through a backlog
  of snapshots.
* ``epu.status.<domain>``: the engine's newest ``EngineStatus`` of each domain, a few messages
  deep (readers keep the newest) and never consumed: ``epu status`` reads it (basic.get, then requeue) to show the whole
  state at once. No delivery limit, so any number of reads leave it in place.
* ``epu.ctxbroker.instances``: instance states and reports: each live instance's address (what its
  node may publish in its context), and terminated/failed instances, so the broker removes nodes
  whose agent never said goodbye.
* ``epu.dlx`` (fanout) → ``epu.dead``: every message a consumer rejected (or the broker dropped
  from a queue: expired, over its delivery limit), put there by the broker itself — no user may
  publish to it (``common.deadletters``).
* ``epu.notes`` (topic) → ``epu.dead.notes``: why each was rejected, one note per rejection,
  published by the consuming service with the consumed queue's name as its routing key (each
  service user may publish only the names of the queues it reads).
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from amqp.exceptions import PreconditionFailed
from epu.common.messages import NAME_PATTERN, Message
from kombu import Exchange, Queue, binding

EVENTS_EXCHANGE = "epu.events"
COMMANDS_EXCHANGE = "epu.commands"
DEAD_LETTER_EXCHANGE = "epu.dlx"
DEAD_LETTER_QUEUE = "epu.dead"
DEATH_NOTES_EXCHANGE = "epu.notes"
DEATH_NOTES_QUEUE = "epu.dead.notes"

PROVISIONER_QUEUE = "epu.provisioner"
DECISION_CONTROL_QUEUE = "epu.decision.control"
DECISION_INPUT_QUEUE = "epu.decision.input"
CTXBROKER_QUEUE = "epu.ctxbroker.instances"

#: Message types that are commands (go to ``epu.commands``); all others are events.
COMMAND_TYPES = frozenset({"node.command", "instance.launch", "instance.terminate", "policy.change"})

#: Message types published ``mandatory``: every command, and the requests Slurm's power saving
#: hands the engine (``slurm.power``): an event no queue is bound to receive would be confirmed and
#: dropped, and slurmctld would wait for nodes nobody asked for until ResumeTimeout.
MANDATORY_TYPES = COMMAND_TYPES | {"slurm.power"}

#: Headers of a dead letter the runtime itself writes: only on the in-memory transport, which has no
#: broker to dead-letter (``Service.dead_letter``). A dead letter in RabbitMQ carrying them got them
#: from its sender: ``epu dead`` never believes them.
REASON_HEADER = "x-epu-reason"
ORIGINAL_QUEUE_HEADER = "x-epu-original-queue"
ORIGINAL_EXCHANGE_HEADER = "x-epu-original-exchange"
ORIGINAL_ROUTING_KEY_HEADER = "x-epu-original-routing-key"
ATTEMPTS_HEADER = "x-epu-attempts"
DEAD_AT_HEADER = "x-epu-dead-at"
"""When the message was dead-lettered (epoch seconds): its age in ``epu dead list``."""

#: Set to ``1`` by the test suite only (tests/conftest.py; a test marked ``quorum`` runs without it):
#: every queue a ``Topology`` declares or describes is a classic one, whatever ``quorum`` says.
#: Why: RabbitMQ 3.10 reserves three of its file handles per quorum queue (measured: 15 per 5
#: queues), its default budget is 927 (open-file limit 1,024), and the suite declares a topology
#: per test — at about 285 quorum queues the broker had no handle left for a new connection and
#: answered nothing for 12 minutes (issue 34). Production never sets it: quorum queues, as
#: configured (``[broker] quorum``).
CLASSIC_QUEUES_FOR_TESTS = "EPU_TEST_CLASSIC_QUEUES"

#: Broker-side guard against poison messages on quorum queues (redelivered this often → DLX).
DELIVERY_LIMIT = 20

#: How many statuses a status queue keeps (see ``Topology.status_spec``); readers keep the newest.
STATUS_DEPTH = 4

#: Routing keys of the provisioners' work queue: distinct, so topic permissions tell them apart.
LAUNCH_KEY = "provisioner.launch"
TERMINATE_KEY = "provisioner.terminate"


def check_name(name: str, what: str = "domain") -> str:
    if not re.match(NAME_PATTERN, name):
        raise ValueError(f"invalid {what} name {name!r}: expected {NAME_PATTERN}")
    return name


def sensor_queue_name(domain: str) -> str:
    return f"epu.sensor.{check_name(domain)}"


def snapshot_queue_name(domain: str) -> str:
    return f"epu.decision.snapshot.{check_name(domain)}"


def status_queue_name(domain: str) -> str:
    return f"epu.status.{check_name(domain)}"


def sensor_routing_key(domain: str) -> str:
    return f"sensor.{check_name(domain)}"


@dataclass(frozen=True)
class QueueSpec:
    """A queue, what feeds it, and how it behaves. Pure data, turned into kombu objects late."""

    name: str
    exchange: str
    routing_keys: tuple[str, ...]
    single_active_consumer: bool = False
    purpose: str = ""
    extra_arguments: dict[str, Any] = field(default_factory=dict)
    dead_letter: bool = True
    """Rejected and overflowing messages go to the dead-letter exchange. Off for latest-value
    queues, whose replaced messages are not failures."""
    obsolete_keys: tuple[str, ...] = ()
    """Routing keys earlier versions bound this queue with. Declaring unbinds them: bindings of a
    durable queue outlive the code that made them, so an upgraded deployment would otherwise
    keep routing (e.g. every snapshot into the engine's input queue as well as its own)."""
    delivery_limit: bool = True
    """A quorum queue's ``x-delivery-limit``. Off for a queue read without consuming (each
    read returns the message, which would count as a failed delivery)."""
    replaceable: bool = False
    """Holds only a value its publisher sends again (the status queues): declaring it over a queue
    an earlier version declared with other arguments deletes and re-creates it
    (``Topology._recreate``) instead of failing."""

    def arguments(self, quorum: bool) -> dict[str, Any]:
        args: dict[str, Any] = {"x-dead-letter-exchange": DEAD_LETTER_EXCHANGE} if self.dead_letter else {}
        if quorum:
            args["x-queue-type"] = "quorum"
            if self.delivery_limit:
                args["x-delivery-limit"] = DELIVERY_LIMIT
        if self.single_active_consumer:
            args["x-single-active-consumer"] = True
        args.update(self.extra_arguments)
        return args


@dataclass(frozen=True)
class Topology:
    """The exchanges and queues of one EPU deployment.

    ``prefix`` is empty in production; tests use a unique prefix (or a unique vhost) so runs
    never see each other. ``quorum`` selects quorum queues (RabbitMQ ≥ 3.8); the in-memory
    transport ignores queue arguments.
    """

    prefix: str = ""
    quorum: bool = True

    @property
    def quorum_queues(self) -> bool:
        """Whether the queues are declared as quorum queues: ``quorum``, unless the test suite's
        switch (``CLASSIC_QUEUES_FOR_TESTS``) is on."""
        return self.quorum and os.environ.get(CLASSIC_QUEUES_FOR_TESTS) != "1"

    # ---- names
    def n(self, name: str) -> str:
        return f"{self.prefix}{name}"

    @property
    def events_exchange(self) -> Exchange:
        return Exchange(self.n(EVENTS_EXCHANGE), type="topic", durable=True)

    @property
    def commands_exchange(self) -> Exchange:
        # topic (with exact keys) rather than direct so RabbitMQ topic permissions can say
        # which user may send which command (an operator may send decision.control only)
        return Exchange(self.n(COMMANDS_EXCHANGE), type="topic", durable=True)

    @property
    def dead_letter_exchange(self) -> Exchange:
        return Exchange(self.n(DEAD_LETTER_EXCHANGE), type="fanout", durable=True)

    @property
    def death_notes_exchange(self) -> Exchange:
        # topic so RabbitMQ topic permissions bind each note to the service reading its queue
        return Exchange(self.n(DEATH_NOTES_EXCHANGE), type="topic", durable=True)

    def exchange_for(self, message: Message | str) -> Exchange:
        type_ = message if isinstance(message, str) else message.TYPE
        return self.commands_exchange if type_ in COMMAND_TYPES else self.events_exchange

    # ---- queue specs by role
    def dead_letter_spec(self) -> QueueSpec:
        return QueueSpec(DEAD_LETTER_QUEUE, DEAD_LETTER_EXCHANGE, ("#",),
                         purpose="every message a consumer rejected or the broker dropped, put there by the "
                                 "broker itself (why: epu.dead.notes)")

    def death_notes_spec(self) -> QueueSpec:
        return QueueSpec(DEATH_NOTES_QUEUE, DEATH_NOTES_EXCHANGE, ("#",), dead_letter=False, delivery_limit=False,
                         purpose="why each dead letter died: a note from the service that rejected it, "
                                 "routed by the name of the queue it was taken from")

    def sensor_spec(self, domain: str) -> QueueSpec:
        return QueueSpec(sensor_queue_name(domain), COMMANDS_EXCHANGE, (sensor_routing_key(domain),),
                         purpose=f"node commands for the sensor of domain {domain}")

    def provisioner_spec(self) -> QueueSpec:
        return QueueSpec(PROVISIONER_QUEUE, COMMANDS_EXCHANGE, (LAUNCH_KEY, TERMINATE_KEY),
                         purpose="launch and terminate requests (competing provisioners)")

    def decision_control_spec(self) -> QueueSpec:
        return QueueSpec(DECISION_CONTROL_QUEUE, COMMANDS_EXCHANGE, ("decision.control",),
                         single_active_consumer=True, purpose="operator policy changes")

    def decision_input_spec(self) -> QueueSpec:
        return QueueSpec(
            DECISION_INPUT_QUEUE, EVENTS_EXCHANGE,
            ("node.result.*", "instance.state.#", "instance.report.*", "slurm.power.*"),
            single_active_consumer=True, obsolete_keys=("sensor.snapshot.*",),
            purpose="what the decision engine must see in full: command results, instance states and reports, "
                    "Slurm's power-saving calls",
        )

    def decision_snapshot_spec(self, domain: str) -> QueueSpec:
        """The newest snapshot of a domain and nothing older: a snapshot supersedes the one
        before, so the queue keeps one (``x-max-length`` 1, the older dropped, not dead-lettered).
        An engine that was away never works through a backlog."""
        return QueueSpec(snapshot_queue_name(domain), EVENTS_EXCHANGE, (f"sensor.snapshot.{check_name(domain)}",),
                         single_active_consumer=True, dead_letter=False,
                         extra_arguments={"x-max-length": 1, "x-overflow": "drop-head"},
                         purpose=f"the latest snapshot of domain {domain} (latest value, no backlog)")

    def status_spec(self, domain: str) -> QueueSpec:
        """The engine's newest ``EngineStatus`` of a domain, kept for readers: a few deep (a new
        status drops the oldest), never dead-lettered, no delivery limit — readers take what is
        there with basic.get, keep the newest (highest ``at``) and put all back (requeue).

        Why ``STATUS_DEPTH`` and not 1: a quorum queue counts a message out with a reader against
        ``x-max-length``, so at depth 1 a status published while a reader held the previous one
        was the one dropped, and the reader put the older back (stale for up to a heartbeat). With
        room for a few, the newer stays unless more readers than that hold one at once. Why not a
        classic queue, which drops the older instead: it lives on one node, so when that node of
        a cluster is lost its durable queue cannot be declared again and the engine could not
        reconnect (tests/cluster)."""
        return QueueSpec(status_queue_name(domain), EVENTS_EXCHANGE, (f"decision.status.{check_name(domain)}",),
                         dead_letter=False, delivery_limit=False, replaceable=True,
                         extra_arguments={"x-max-length": STATUS_DEPTH, "x-overflow": "drop-head"},
                         purpose=f"the engine's newest status of domain {domain} (latest value, read by epu status)")

    def ctxbroker_spec(self) -> QueueSpec:
        return QueueSpec(CTXBROKER_QUEUE, EVENTS_EXCHANGE,
                         ("instance.state.#", "instance.report.*"),
                         purpose="instance states and reports: each live instance's address (all its node "
                                 "may publish), and instances gone, so their nodes leave their context")

    def service_specs(self, domains: list[str] | tuple[str, ...] = ()) -> list[QueueSpec]:
        """Every durable queue of a deployment with these domains."""
        specs = [self.dead_letter_spec(), self.death_notes_spec(), self.provisioner_spec(), self.decision_control_spec(),
                 self.decision_input_spec(), self.ctxbroker_spec()]
        specs += [self.sensor_spec(d) for d in domains]
        specs += [self.decision_snapshot_spec(d) for d in domains]
        specs += [self.status_spec(d) for d in domains]
        return specs

    # ---- kombu objects
    def exchange_by_name(self, name: str) -> Exchange:
        return {
            EVENTS_EXCHANGE: self.events_exchange,
            COMMANDS_EXCHANGE: self.commands_exchange,
            DEAD_LETTER_EXCHANGE: self.dead_letter_exchange,
            DEATH_NOTES_EXCHANGE: self.death_notes_exchange,
        }[name]

    def kombu_queues(self, spec: QueueSpec) -> list[Queue]:
        """One kombu Queue per binding (kombu binds one routing key per Queue object)."""
        exchange = self.exchange_by_name(spec.exchange)
        # the dead-letter queue itself must not dead-letter into its own exchange (a loop)
        quorum = self.quorum_queues
        if spec.name == DEAD_LETTER_QUEUE:
            args = {"x-queue-type": "quorum"} if quorum else {}
        else:
            args = spec.arguments(quorum)
            if spec.dead_letter:
                args["x-dead-letter-exchange"] = self.n(DEAD_LETTER_EXCHANGE)
        return [
            Queue(self.n(spec.name), exchange=exchange, routing_key=key, durable=True,
                  queue_arguments=args)
            for key in spec.routing_keys
        ]

    def declare(self, channel: Any, specs: list[QueueSpec] | None = None) -> None:
        """Declare exchanges, the dead-letter and death-note queues and the given queues (idempotent)."""
        for exchange in (self.events_exchange, self.commands_exchange, self.dead_letter_exchange,
                         self.death_notes_exchange):
            exchange(channel).declare()
        for spec in [self.dead_letter_spec(), self.death_notes_spec(), *(specs or [])]:
            queues = self.kombu_queues(spec)
            for queue in queues:
                try:
                    queue(channel).declare()
                except PreconditionFailed:
                    if not spec.replaceable:
                        raise
                    channel = self._recreate(channel, queue)
            for key in spec.obsolete_keys:  # unbinding what is not bound is not an error
                channel.queue_unbind(queue=queues[0].name, exchange=self.n(spec.exchange), routing_key=key)

    @staticmethod
    def _recreate(channel: Any, queue: Queue) -> Any:
        """Replace a latest-value queue whose arguments an earlier version declared differently
        (the status queues one deep before ``STATUS_DEPTH``): RabbitMQ refuses to redeclare a
        queue with other arguments (406, which closes the channel). Deleting it loses only a value
        its publisher sends again. Returns the channel to carry on with."""
        channel = channel.connection.channel()
        channel.queue_delete(queue=queue.name)
        queue(channel).declare()
        return channel

    def tap_queue(self, pattern: str | Sequence[str] = "#", name: str | None = None) -> Queue:
        """An exclusive, auto-deleted queue on the events exchange, bound with one topic pattern
        or several: an operator's window. Named ``epu.tap.*``, the only queues the operator
        user may create; the exchange is never declared here (operators may not)."""
        exchange = Exchange(self.n(EVENTS_EXCHANGE), type="topic", durable=True, no_declare=True)
        patterns = [pattern] if isinstance(pattern, str) else list(pattern)
        return Queue(name or self.n(f"epu.tap.{uuid.uuid4().hex[:12]}"),
                     bindings=[binding(exchange, routing_key=p) for p in patterns],
                     exclusive=True, auto_delete=True, durable=False)


DEFAULT_TOPOLOGY = Topology()
