"""The message bus of a run: RabbitMQ's delivery semantics, with every delivery in the world's hands.

What it models (and why each matters to the invariants):

* the topology of ``common.topology``: a domain's snapshots go to its latest-value snapshot
  queue (one message deep: a newer snapshot replaces one still waiting); instance events,
  instance reports and command results to the decision engines' input queue; launches and
  terminations to the provisioners' work queue; node commands to their domain's sensor queue;
  policy changes to the engines' control queue; decision records, policy outcomes and alerts
  only to taps (the world's observers);
* durable queues: a message waits in its queue while no consumer is connected, and is
  delivered when one (re)connects;
* single-active-consumer (the engines' queues): only the first connected consumer receives;
  when its connection goes, the broker hands the queue to the next one;
* competing consumers (the provisioners' queue): round robin over the connected ones;
* manual acks: a consumer that crashes while handling a message leaves it unacked, and the
  broker redelivers it; a handler that raises is judged by the runtime's own rule
  (``common.runtime.infrastructure``, as ``common.runtime.Service._handle`` judges it): an
  infrastructure failure that passes (a database failing over, locked, read-only) is retried in
  place with the runtime's backoff until it succeeds, later messages for that consumer waiting
  behind it; any other is retried ``max_attempts`` times in all, then dead-lettered. Not modelled:
  the runtime's one work thread also holds the service's other queues and timers meanwhile, and a
  failure no wait cures stops the consumer (no fault of the simulator raises one);
* faults (``MessageFaults``): every delivery may be delayed, duplicated or lost, and with
  enough jitter messages overtake each other (reordering); the broker itself may be down
  (publishes fail, nothing is delivered) and one process's connection may drop;
* identities (``Identities``): every process publishes as its own broker user
  (``Proc.identity``), with the topic permissions deploy/rabbitmq's definitions give that user
  (``common.definitions``): a publish beyond them is refused as RabbitMQ refuses it. The bus
  stamps each message with its sender's user (the broker-validated ``user_id``) and the key it
  was published on, routes by that key, and before any handler runs checks the message against
  its sender with the runtime's own rule (``common.senders``): a mismatch is dead-lettered.
* dead letters (``SimLetter``, ``Bus.dead``): what the broker keeps when a consumer rejects a
  message off a queue with a dead-letter exchange — the message with the user it was sent as and
  the queue it died in — and the rejecting runtime's note of why; a latest-value queue keeps none.
  Nobody may publish to the dead-letter exchange (``inject_dead_letter`` is refused as RabbitMQ
  refuses it, by the write permissions of the generated definitions); ``requeue`` is ``epu dead
  requeue``: the same check (``common.deadletters.requeue_refusal``), then the letter is sent on
  the body's own key *as the user that first sent it*.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple

from epu.common.deadletters import DeathNote, LetterFacts, requeue_refusal
from epu.common.messages import Message
from epu.common.runtime import RuntimeSettings, infrastructure
from epu.common.senders import SenderPolicy
from epu.common.topology import DEAD_LETTER_EXCHANGE, DEFAULT_TOPOLOGY
from epu.sim.world import World

MAX_LETTERS = 10_000
"""Dead letters the simulated broker keeps (the oldest dropped first, as the ``epu-dead`` policy's byte bound does)."""


class Crash(BaseException):
    """Raised inside a process to kill it on the spot (a crash at any step). A BaseException,
    so the cores' ``except Exception`` clauses do not swallow it, as they would not swallow a
    SIGKILL."""


@dataclass
class MessageFaults:
    latency: tuple[float, float] = (0.002, 0.02)
    """Every delivery takes this long (uniform, seconds)."""
    delay_rate: float = 0.0
    """Share of deliveries held back by ``delay_seconds`` more (a slow consumer, a busy broker)."""
    delay_seconds: tuple[float, float] = (1.0, 30.0)
    duplicate_rate: float = 0.0
    """Share of deliveries delivered twice (a redelivery after a lost ack)."""
    loss_rate: float = 0.0
    """Share of events lost (published without a confirm while the broker failed over)."""
    reorder_jitter: float = 0.0
    """Extra uniform jitter per delivery (seconds): enough of it and messages overtake."""


class Sent(NamedTuple):
    """How a message was published: what the broker knows of it, beside its body (a tuple: one
    is made per publish, and a frozen dataclass's ``__init__`` costs twice as much)."""

    routing_key: str
    user: str | None
    """The sender's broker user (RabbitMQ validates ``user_id``: a sender cannot claim another)."""
    sender: Any
    """The process that published it (the world's truth, for the invariants; no core sees it)."""
    body_key: bool = False
    """``routing_key`` is the body's own (``msg.routing_key()``, as EPU's publishers use): the
    consumer's check that they agree need not work it out again."""
    requeued: bool = False
    """Sent on from the dead-letter queue (``Bus.requeue``): ``sender`` is the letter's true
    original sender, whose authority — not the requeuer's — invariant 10 judges."""
    exchange: str | None = None
    """The exchange the sender chose, if not its type's (a hostile sender may choose)."""


class Identities:
    """Each broker user's topic permissions, from the generated definitions (least privilege).

    Why from ``common.definitions``: the simulated broker must refuse exactly what the real one
    would, so the adversary can do only what a stolen credential of that user could."""

    def __init__(self, domains: list[str]) -> None:
        import re

        from epu.common.definitions import service_users

        users = service_users(DEFAULT_TOPOLOGY, sorted(set(domains)))
        self.topic_write: dict[str, dict[str, re.Pattern[str]]] = {
            u.name: {ex: re.compile(pattern) for ex, pattern in u.topic_write.items()} for u in users}
        self.write: dict[str, re.Pattern[str]] = {u.name: re.compile(u.write) for u in users}
        """Each user's write permission (the exchanges it may publish to at all)."""
        self._memo: dict[tuple[str, str, str], bool] = {}

    def may_write(self, user: str, exchange: str) -> bool:
        """RabbitMQ's write permission: may ``user`` publish to ``exchange`` at all."""
        pattern = self.write.get(user)
        return pattern is not None and pattern.match(exchange) is not None

    def may_publish(self, user: str, exchange: str, key: str) -> bool:
        memo = self._memo.get((user, exchange, key))
        if memo is None:
            perms = self.topic_write.get(user)
            pattern = perms.get(exchange) if perms is not None else None
            memo = self._memo[(user, exchange, key)] = pattern is not None and pattern.match(key) is not None
        return memo


@dataclass
class Consumer:
    owner: Any
    """The process (``processes.Proc``) that consumes; its ``connected`` says if it can receive."""
    handler: Callable[[Message], None]
    holding: bool = False
    """A delivery of this consumer is being retried in place (a transient failure): the next
    ones wait in the broker behind it, as the runtime's work thread holds them."""


@dataclass
class SimQueue:
    name: str
    mode: str
    """``sac`` (single active consumer), ``competing`` or ``single``."""
    consumers: list[Consumer] = field(default_factory=list)
    backlog: deque[tuple[Message, int, Sent | None]] = field(default_factory=deque)
    latest_value: bool = False
    """One message deep (x-max-length 1, drop-head): a waiting message is replaced by a newer one."""
    ttl: float | None = None
    """Seconds a message may wait before the broker drops it (the sensors publish snapshots with
    the active window as their AMQP ``expiration``); judged by the broker's clock, the world's."""
    waiting_since: float = 0.0
    """When the message now waiting in a latest-value queue began to wait."""
    rr: int = 0
    active: Consumer | None = None
    """The single active consumer, as the broker chose it (sac queues)."""
    labels: dict[str, str] = field(default_factory=dict, repr=False, compare=False)
    """Message type → the label of its delivery events here (``Bus._send``), made once."""

    def pick(self) -> Consumer | None:
        """The consumer the broker gives the next message to: among those it believes connected
        (``registered``). Whether that consumer really gets it is ``deliverable``'s question.
        Most queues have one consumer (consumers are only ever added): then the general rule's
        outcome is written out, without a list per delivery."""
        if len(self.consumers) == 1:
            c = self.consumers[0]
            if not c.owner.registered:
                self.active = None
                return None
            if self.mode == "sac":
                self.active = c  # None or ``c`` itself before: the only one it can be
            else:
                self.rr = 0  # (rr + 1) % 1
            return c
        live = [c for c in self.consumers if c.owner.registered]
        if not live:
            self.active = None
            return None
        if self.mode == "sac":
            if self.active is None or self.active not in live:
                self.active = live[0]
            return self.active
        self.rr = (self.rr + 1) % len(live)
        return live[self.rr]


@dataclass
class BusStats:
    published: int = 0
    delivered: int = 0
    duplicated: int = 0
    lost: int = 0
    dead_lettered: int = 0
    redelivered: int = 0
    transient_retries: int = 0
    """Handler failures of the infrastructure's, retried in place until they succeed."""
    refused_publishes: int = 0
    """Publishes beyond the sender's permissions (refused by the broker)."""
    refused_senders: int = 0
    """Deliveries whose sender may not send them (dead-lettered by the consumer's runtime)."""
    requeued: int = 0
    """Dead letters sent on by a requeue."""
    requeues_refused: int = 0
    """Requeues refused by ``requeue_refusal`` or by the broker (the letter is kept)."""


@dataclass
class SimLetter:
    """A message in the simulated dead-letter queue."""

    msg: Message
    sent: Sent
    """How it was first published: ``sent.user`` is the ``user_id`` the broker validated then and
    keeps on the letter; ``sent.sender`` the world's truth."""
    queue: str | None
    """The queue it died in as the letter's ``x-death`` names it (the topology's name); None: none."""
    note: str | None
    """The rejecting runtime's reason (its death note); None: none."""
    claims: dict[str, str] = field(default_factory=dict)
    """``x-epu-*`` headers its sender wrote into it: words, believed by no check (the old requeue did)."""


def topology_queue(name: str) -> str:
    """The production name of a simulated queue (``decision.input`` → ``epu.decision.input``)."""
    return f"epu.{name}"


def snapshot_queue(domain: str) -> str:
    return f"decision.snapshot.{domain}"


def route_key(type_: str, key: str, exchange: str | None = None) -> tuple[str, ...]:
    """The queues a message of ``type_`` published with routing key ``key`` (to ``exchange``, by
    default its type's) reaches (the topology's bindings, by key: the broker never reads a body)."""
    if (exchange or DEFAULT_TOPOLOGY.exchange_for(type_).name) == DEFAULT_TOPOLOGY.commands_exchange.name:
        if key in ("provisioner.launch", "provisioner.terminate"):
            return ("provisioner",)
        if key == "decision.control":
            return ("decision.control",)
        if key.startswith("sensor.") and key.count(".") == 1:
            return (key,)
        return ()
    if key.startswith("sensor.snapshot.") and key.count(".") == 2:
        return (snapshot_queue(key.rsplit(".", 1)[1]),)
    if (key.startswith("node.result.") and key.count(".") == 2) or key.startswith("instance.state.") \
            or (key.startswith("instance.report.") and key.count(".") == 2) \
            or (key.startswith("slurm.power.") and key.count(".") == 2):
        return ("decision.input",)
    return ()


def route(msg: Message) -> tuple[str, ...]:
    """The queues a message reaches (``common.topology``'s bindings)."""
    t = msg.TYPE
    if t == "sensor.snapshot":
        return (snapshot_queue(msg.domain),)  # type: ignore[attr-defined]
    if t in ("instance.state", "instance.report", "node.result", "slurm.power"):
        return ("decision.input",)
    if t in ("instance.launch", "instance.terminate"):
        return ("provisioner",)
    if t == "node.command":
        return (f"sensor.{msg.domain}",)  # type: ignore[attr-defined]
    if t == "policy.change":
        return ("decision.control",)
    return ()


class Bus:
    MAX_ATTEMPTS = RuntimeSettings.max_attempts
    RETRY_BASE = RuntimeSettings.retry_base_seconds
    RETRY_MAX = RuntimeSettings.retry_max_seconds

    def __init__(self, world: World, faults: MessageFaults | None = None) -> None:
        self.world = world
        self.faults = faults or MessageFaults()
        self.queues: dict[str, SimQueue] = {}
        self.broker_up = True
        self.enabled = True
        """Faults apply only while enabled."""
        self.taps: list[Callable[[Message, Any], None]] = []
        """Called with (message, sender) for every message accepted by the broker."""
        self.stats = BusStats()
        self._rng = world.rng("bus")
        self.identities: Identities | None = None
        """Broker users and their permissions (None: every publisher may publish anything)."""
        self._senders = SenderPolicy(require_sender_user=True)
        self._verdicts: dict[tuple[str | None, str, str | None], tuple[str | None, bool]] = {}
        """(user, type, domain) → the user rule's verdict and whether the user is a foreign sender
        (``_user_verdict``), for ``_senders``; emptied when the policy is replaced."""
        self.bind_senders = True
        """Consumers check each message against its sender (False: as before issue 26)."""
        self.on_foreign: list[Callable[[Message, Sent, str], None]] = []
        """Called (message, how it was sent, queue) when a handler is about to act on a message its
        true sender was not allowed to send: invariant 10's hook."""
        self.delivering: Sent | None = None
        """How the message whose handler runs now was sent (its validated user: what the runtime
        hands a handler as ``Service.sender``)."""
        self.around: list[Callable[[Message, Sent, Any], Callable[[], None] | None]] = []
        """Called (message, how it was sent, consuming process) before a handler runs; a callable
        it returns runs after the handler returned (invariant 10: what the handler did with it)."""
        self.dead: deque[SimLetter] = deque(maxlen=MAX_LETTERS)
        """The dead-letter queue (``epu.dead``)."""
        self.requeue_lends_authority = False
        """``epu dead requeue`` as before issue 33: the letter sent where its ``x-epu-original-*``
        headers say, as the requeuer (True only to show what invariant 10 catches)."""

    @property
    def senders(self) -> SenderPolicy:
        """The consumers' rule (``common.senders``), as production runs it with deploy/rabbitmq's users."""
        return self._senders

    @senders.setter
    def senders(self, policy: SenderPolicy) -> None:
        self._senders = policy
        self._verdicts = {}

    def _user_verdict(self, user: str | None, type_: str, msg: Message) -> tuple[str | None, bool]:
        """The user rule's reason to refuse (``SenderPolicy.check_user``, None: none) and whether
        ``user`` is not among the users allowed to send it (invariant 10's test), remembered per
        (user, type, domain): both are pure functions of those and the policy, and a run checks
        every one of its hundreds of thousands of deliveries."""
        domain = getattr(msg, "domain", None)
        if not isinstance(domain, str):
            domain = None
        k = (user, type_, domain)
        verdict = self._verdicts.get(k)
        if verdict is None:
            allowed = self._senders.allowed_users(type_, domain)
            verdict = self._verdicts[k] = (self._senders.check_user(user, type_, msg),
                                           user is not None and bool(allowed) and user not in allowed)
        return verdict

    def queue(self, name: str, mode: str = "single", latest_value: bool = False) -> SimQueue:
        q = self.queues.get(name)
        if q is None:
            q = self.queues[name] = SimQueue(name, mode, latest_value=latest_value)
        return q

    def subscribe(self, name: str, mode: str, owner: Any, handler: Callable[[Message], None],
                  latest_value: bool = False) -> Consumer:
        c = Consumer(owner, handler)
        q = self.queue(name, mode, latest_value)
        q.mode, q.latest_value = mode, q.latest_value or latest_value
        q.consumers.append(c)
        return c

    def _wait(self, q: SimQueue, msg: Message, attempt: int, sent: Sent | None) -> None:
        if q.latest_value:
            if not q.backlog or q.backlog[-1][0] is not msg:
                q.waiting_since = self.world.t
            q.backlog.clear()  # drop-head: the newest replaces what waited
        q.backlog.append((msg, attempt, sent))

    # ------------------------------------------------------------------ publishing
    def publish(self, sender: Any, msg: Message, routing_key: str | None = None, exchange: str | None = None) -> None:
        """What a process's ``publish`` does: refused while the broker or the sender's connection
        is down (the caller sees an error, as with a failed confirm), or when the sender's user may
        not publish on the key (``PermissionError``, as RabbitMQ's ACCESS_REFUSED). ``routing_key``
        is the key the sender chose; EPU's publishers always use the body's own, and the exchange
        of the message's type (a hostile sender may choose another, ``exchange``)."""
        if not self.broker_up or (sender is not None and not sender.connected):
            raise ConnectionError(f"simulated: {'broker down' if not self.broker_up else 'connection lost'}")
        user = getattr(sender, "identity", None)
        key = routing_key if routing_key is not None else msg.routing_key()
        if self.identities is not None and user is not None:
            ex = exchange or DEFAULT_TOPOLOGY.exchange_for(msg.TYPE).name
            if not self.identities.may_publish(user, ex, key):
                self.stats.refused_publishes += 1
                self.world.note(f"refused {msg.TYPE} from {user} on {ex} {key}")
                raise PermissionError(f"simulated: ACCESS_REFUSED: {user} may not publish to {ex} with {key}")
        if exchange is not None:
            self._accepted(msg, Sent(key, user, sender, False, exchange=exchange))
            return
        sent = Sent(key, user, sender, routing_key is None)
        self.stats.published += 1
        for tap in self.taps:
            tap(msg, sender)
        names = route(msg) if routing_key is None else tuple(n for n in route_key(msg.TYPE, key) if n in self.queues)
        f = self.faults
        if self.enabled and (f.loss_rate or f.duplicate_rate or f.reorder_jitter or f.delay_rate):
            self._publish_faulty(msg, names, sent)
            return
        # no fault applies: ``_publish_faulty`` with its tests false and ``_delay``'s one draw
        # (a run publishes hundreds of thousands of messages)
        lo, hi = f.latency
        rnd = self._rng.random
        for name in names:
            self._send(self.queues.get(name) or self.queue(name), msg, lo + rnd() * (hi - lo), 1, sent)

    def _accepted(self, msg: Message, sent: Sent) -> None:
        """``publish``'s routing, for a publish on an exchange its sender chose and for a requeue."""
        self.stats.published += 1
        for tap in self.taps:
            tap(msg, sent.sender)
        names = route(msg) if sent.body_key and sent.exchange is None else \
            tuple(n for n in route_key(msg.TYPE, sent.routing_key, sent.exchange) if n in self.queues)
        f = self.faults
        if self.enabled and (f.loss_rate or f.duplicate_rate or f.reorder_jitter or f.delay_rate):
            self._publish_faulty(msg, names, sent)
            return
        # no fault applies: ``_publish_faulty`` with its tests false and ``_delay``'s one draw
        # (a run publishes hundreds of thousands of messages)
        lo, hi = f.latency
        rnd = self._rng.random
        for name in names:
            self._send(self.queues.get(name) or self.queue(name), msg, lo + rnd() * (hi - lo), 1, sent)

    def _publish_faulty(self, msg: Message, names: tuple[str, ...], sent: Sent) -> None:
        """``publish``'s routing while message faults apply (loss, duplicates, extra delays)."""
        f = self.faults
        for name in names:
            if self.enabled and f.loss_rate and msg.TYPE != "policy.change" and self._rng.random() < f.loss_rate:
                self.stats.lost += 1
                self.world.note(f"lost {msg.TYPE} to {name}")
                continue
            q = self.queue(name)
            self._send(q, msg, self._delay(), 1, sent)
            if self.enabled and f.duplicate_rate and self._rng.random() < f.duplicate_rate:
                self.stats.duplicated += 1
                self._send(q, msg, self._delay() + self._rng.uniform(0.0, 5.0), 1, sent)

    def _delay(self) -> float:
        f = self.faults
        lo, hi = f.latency
        d = lo + self._rng.random() * (hi - lo)
        if self.enabled:
            if f.reorder_jitter:
                d += self._rng.random() * f.reorder_jitter
            if f.delay_rate and self._rng.random() < f.delay_rate:
                a, b = f.delay_seconds
                d += a + self._rng.random() * (b - a)
        return d

    def _send(self, q: SimQueue, msg: Message, delay: float, attempt: int = 1, sent: Sent | None = None) -> None:
        label = q.labels.get(msg.TYPE)
        if label is None:
            label = q.labels[msg.TYPE] = f"deliver {msg.TYPE} to {q.name}"
        self.world.call_after(delay, partial(self._deliver, q, msg, attempt, sent), label)

    # ------------------------------------------------------------------ delivery
    def _deliver(self, q: SimQueue, msg: Message, attempt: int, sent: Sent | None = None) -> None:
        if not self.broker_up:
            self._wait(q, msg, attempt, sent)
            return
        c = q.pick()
        if c is None or not c.owner.receiving or c.holding:
            # nobody to deliver to, the broker's consumer cannot be reached (its link is down and
            # the broker has not noticed yet), or it is retrying a message in place: the message
            # waits, unacked
            self._wait(q, msg, attempt, sent)
            return
        self._deliver_to(q, c, msg, attempt, sent)

    def _retry(self, q: SimQueue, c: Consumer, msg: Message, attempt: int, sent: Sent | None) -> None:
        if not (self.broker_up and c.owner.receiving and c.owner.registered):
            held, c.holding = c.holding, False
            if not (held and q.latest_value and q.backlog):  # a newer snapshot replaced it
                self._wait(q, msg, attempt, sent)  # unacked when the connection went: redelivered
            return
        self._deliver_to(q, c, msg, attempt, sent)

    def _release(self, q: SimQueue, c: Consumer) -> None:
        """A retry in place ended: what waited behind it is delivered."""
        if c.holding:
            c.holding = False
            self.flush(q)

    def _refused(self, q: SimQueue, msg: Message, sent: Sent | None) -> bool:
        """The consumer's runtime checks the sender (``Service._refused_sender``) — the same rule —
        and dead-letters a message its sender may not send; a message that passes but whose true
        sender was not allowed is reported to ``on_foreign`` (invariant 10)."""
        if sent is None:
            return False
        why, foreign = self._user_verdict(sent.user, msg.TYPE, msg)
        if sent.requeued:  # judged by the letter's true sender, not by the user it was sent on as
            foreign = self._foreign_origin(msg, sent)
        if self.bind_senders:
            # the exchange is the type's unless the sender chose one; the key is the body's unless
            # the sender chose one (a message's body does not change on the way)
            if sent.exchange is not None and sent.exchange != (want := DEFAULT_TOPOLOGY.exchange_for(msg.TYPE).name):
                why = f"came by exchange {sent.exchange!r}, not {want!r}"
            elif not sent.body_key and sent.routing_key != (body_key := msg.routing_key()):
                why = f"came by {sent.routing_key!r}, body is for {body_key!r}"
            if why is not None:
                self.stats.refused_senders += 1
                self.world.note(f"dead-lettered {msg.TYPE} from {q.name}: sender not allowed: {why}")
                self._keep(q, msg, sent, f"sender not allowed: {why}")
                return True
        if foreign and self.on_foreign:
            for fn in self.on_foreign:
                fn(msg, sent, q.name)
        return False

    def _deliver_to(self, q: SimQueue, c: Consumer, msg: Message, attempt: int, sent: Sent | None = None) -> None:
        if self._refused(q, msg, sent):
            return
        self.stats.delivered += 1
        after = [a for fn in self.around if (a := fn(msg, sent, c.owner)) is not None] \
            if self.around and sent is not None else ()
        self.delivering = sent
        try:
            c.handler(msg)
            for a in after:
                a()
        except Crash:
            self.stats.redelivered += 1
            c.holding = False
            c.owner.crash("while handling " + msg.TYPE)
            self._wait(q, msg, 1, sent)
            self.flush(q)
        except Exception as exc:
            transient = infrastructure(exc) == "transient"
            if not transient and attempt >= self.MAX_ATTEMPTS:
                self.stats.dead_lettered += 1
                self.world.note(f"dead-lettered {msg.TYPE} from {q.name}: {type(exc).__name__}")
                c.owner.dead_letter(msg, exc)
                if sent is not None:
                    self._keep(q, msg, sent, f"handler failed after {attempt} attempts: {type(exc).__name__}: {exc}")
                self._release(q, c)
                return
            if transient:
                self.stats.transient_retries += 1
            c.holding = True
            self.world.call_after(min(self.RETRY_BASE * 2 ** (attempt - 1), self.RETRY_MAX),
                                  lambda: self._retry(q, c, msg, attempt + 1, sent), f"retry {msg.TYPE}")
        else:
            self._release(q, c)

    # ------------------------------------------------------------------ dead letters
    def _keep(self, q: SimQueue, msg: Message, sent: Sent, reason: str) -> None:
        """A consumer rejected ``msg``: its queue's dead-letter exchange keeps it (the broker does:
        the user it was sent as stays on it); a latest-value queue keeps none."""
        if not q.latest_value:
            self.dead.append(SimLetter(msg, sent, topology_queue(q.name), reason))

    def _foreign_origin(self, msg: Message, sent: Sent) -> bool:
        """Invariant 10 for a requeued letter: its true original sender may not send it."""
        user = getattr(sent.sender, "identity", None)
        domain = getattr(msg, "domain", None)
        allowed = self._senders.allowed_users(msg.TYPE, domain if isinstance(domain, str) else None)
        return bool(allowed) and user not in allowed

    def inject_dead_letter(self, sender: Any, msg: Message, claims: dict[str, str]) -> None:
        """``sender`` publishes ``msg`` straight to the dead-letter exchange with forged headers
        (``claims``; ``x-death-queue`` stands for a forged ``x-death`` record): refused
        (``PermissionError``) unless its user may write the exchange, as RabbitMQ refuses it."""
        if not self.broker_up or not sender.connected:
            raise ConnectionError("simulated: broker down" if not self.broker_up else "simulated: connection lost")
        user = getattr(sender, "identity", None)
        if self.identities is not None and user is not None and not self.identities.may_write(user, DEAD_LETTER_EXCHANGE):
            self.stats.refused_publishes += 1
            self.world.note(f"refused {msg.TYPE} from {user} into {DEAD_LETTER_EXCHANGE}")
            raise PermissionError(f"simulated: ACCESS_REFUSED: {user} may not publish to {DEAD_LETTER_EXCHANGE}")
        self.stats.published += 1
        self.world.note(f"{user} put a {msg.TYPE} into {DEAD_LETTER_EXCHANGE}")
        self.dead.append(SimLetter(msg, Sent(msg.routing_key(), user, sender), claims.get("x-death-queue"),
                                   None, dict(claims)))

    def requeue(self, requeuer: Any, letter: SimLetter, impersonator: bool = True) -> str | None:
        """``epu dead requeue``: None once sent on (and taken out of the queue), else why not (kept).

        As the CLI: ``requeue_refusal`` judges the letter (its proven sender, the queue it died in,
        its death note); an accepted letter is sent on the body's own key with its original user —
        which RabbitMQ takes only from that user or one with the impersonator tag. ``requeuer`` is a
        process (the world's truth of who acted); the letter's true sender stays its sender."""
        if not self.broker_up or not requeuer.connected:
            return "broker unreachable"
        if self.requeue_lends_authority:
            return self._requeue_as_before(requeuer, letter)
        note = None if letter.note is None else DeathNote(
            queue=letter.queue or "", reason=letter.note, body_sha256="", message_id=None, type=letter.msg.TYPE,
            sender=letter.sent.user, exchange="", routing_key=letter.sent.routing_key, attempts=1, dead_at=0.0,
            kept=True)
        facts = LetterFacts(type=letter.msg.TYPE, message=letter.msg, user=letter.sent.user,
                            death_queue=letter.queue, note=note)
        why = requeue_refusal(facts, self._senders, DEFAULT_TOPOLOGY)
        if why is None and letter.sent.user != getattr(requeuer, "identity", None) and not impersonator:
            why = f"the broker would not send it as {letter.sent.user!r} (a requeue keeps the letter's sender)"
        if why is not None:
            self.stats.requeues_refused += 1
            self.world.note(f"requeue of {letter.msg.TYPE} refused: {why}")
            return why
        self.dead.remove(letter)
        self.stats.requeued += 1
        self.world.note(f"requeued {letter.msg.TYPE} as {letter.sent.user}")
        self._accepted(letter.msg, Sent(letter.msg.routing_key(), letter.sent.user, letter.sent.sender, True,
                                        requeued=True))
        return None

    def _requeue_as_before(self, requeuer: Any, letter: SimLetter) -> str | None:
        """The requeue of before issue 33: sent where the letter's headers say it was going (the
        runtime wrote them, or its sender did), as the requeuer."""
        exchange = letter.claims.get("x-epu-original-exchange") or (
            letter.sent.exchange or DEFAULT_TOPOLOGY.exchange_for(letter.msg.TYPE).name)
        key = letter.claims.get("x-epu-original-routing-key") or letter.sent.routing_key
        user = getattr(requeuer, "identity", None)
        if self.identities is not None and user is not None and not self.identities.may_publish(user, exchange, key):
            self.stats.requeues_refused += 1
            return f"{user} may not publish to {exchange} with {key}"
        self.dead.remove(letter)
        self.stats.requeued += 1
        self.world.note(f"requeued {letter.msg.TYPE} as {user} (as before issue 33)")
        self._accepted(letter.msg, Sent(key, user, letter.sent.sender, key == letter.msg.routing_key(), requeued=True,
                                        exchange=exchange if exchange != DEFAULT_TOPOLOGY.exchange_for(
                                            letter.msg.TYPE).name else None))
        return None

    def flush(self, q: SimQueue | None = None) -> None:
        """A consumer (re)connected or the broker is back: deliver what waited, in order."""
        for queue in [q] if q is not None else list(self.queues.values()):
            if not queue.backlog:
                continue
            waiting, queue.backlog = queue.backlog, deque()
            if queue.latest_value and queue.ttl is not None and self.world.t - queue.waiting_since > queue.ttl:
                self.world.note(f"expired {len(waiting)} message(s) in {queue.name} (ttl {queue.ttl:.0f}s)")
                continue
            for i, (msg, attempt, sent) in enumerate(waiting):
                self._send(queue, msg, 0.001 * (i + 1), attempt, sent)

    def set_broker(self, up: bool) -> None:
        self.broker_up = up
        self.world.note(f"broker {'up' if up else 'down'}")
        if up:
            self.flush()

    def sac_holder(self, name: str) -> Any:
        """The process the broker currently delivers ``name`` to (sac queues), or ``None``."""
        q = self.queues.get(name)
        if q is None or not self.broker_up:
            return None
        c = q.pick()
        return c.owner if c is not None else None
