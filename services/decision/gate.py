"""The one door out of the decision engine: every launch, terminate and node command is built here
and leaves through ``Gate.send``, which applies one table of rules.

Why one door: the engine used to send from five places — the plan, the re-send of open intents,
the terminates asked again, the end of a provisioner's stale record and the terminate after a
refusal — each deciding the domain's mode, the spend cap and the terminate's guard on its own. A
review found three of them ignoring observe mode and one sending a *plain* terminate (destroy
whatever runs) for a busy node. Here, a command is made by a builder below (``launch_request``,
``terminate_request``, ``node_command``: the only constructors of those messages in the engine)
and leaves only through ``Gate.send``, which checks it against ``RULES`` at the moment it would
leave. A feature adds a row to the table, never a door (``tests/decision/test_gate.py`` fails on a
module of ``services/decision`` that builds or publishes a command itself).

The table (``RULES``), in order; the first rule that refuses holds the command back:

======================  ===========  ===================================================================
rule                    commands     holds back
======================  ===========  ===================================================================
observe                 all          every command while the domain's mode is ``observe`` — nothing
                                     leaves, ever, whatever path made it (counted as shadow)
not superseded          launch,      a command a later decision took back: a launch of an instance
                        node         given up; an ``add`` or ``online`` of one on its way out; an
                        commands     ``offline`` of one taken back into service — closed, not sent
engine never forces     terminate    a ``forced`` proof: only an operator forces (``epu instances
                                     terminate --force`` goes to the provisioners, not through here)
give back native only   give_back    a give-back (native mode: a resumed node EPU cannot serve, powered
                                     down so Slurm requeues its job) outside native mode, or of a node
                                     a live instance of ours holds
release when ended      release      a release (native mode: a slot held since its removal handed back
                                     to Slurm's power saving) outside native mode, or while the
                                     instance whose identity the slot carries still lives
reason allows proof     terminate    a proof ``common.retire.PROOFS`` does not allow for the reason
proof holds             terminate    a proof the engine's record does not show: ``removed`` without
                                     the sensor's confirmed removal; ``unstarted`` for an instance
                                     the batch system may know
======================  ===========  ===================================================================

The spend cap is applied where launches are made (``planner``: ``budget.admit`` drops a launch
over the cap before it is stored); a re-sent launch keeps its id, which the provisioner and the
cloud dedupe, so it never buys a second instance.

Each command leaves on an ``Authority``: the domain's policy, the engine's safety net (re-sends,
terminates asked again, a provisioner's stale record closed), or an operator (an instance an
operator retired, with the operator's name from their own change); it is logged with the command
and counted by kind (``Gate.counts``)."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from epu.common.messages import (
    TERMINAL_INSTANCE_STATES,
    LaunchRequest,
    Message,
    NodeCommand,
    TerminateRequest,
    new_id,
)
from epu.common.retire import Proof, RetireReason, allowed
from epu.services.decision.ports import DecisionStore
from epu.services.decision.view import Instance

log = logging.getLogger("epu.decision")

COMMAND_TYPES = (LaunchRequest, TerminateRequest, NodeCommand)


class Authority(StrEnum):
    """On whose authority a command leaves."""

    POLICY = "policy"
    """The domain's policy and the life cycle every policy shares."""
    SAFETY_NET = "safety-net"
    """The engine's own repairs: an open intent re-sent, a terminate asked again, a provisioner's
    record of an instance that ended here closed."""
    OPERATOR = "operator"
    """An operator's change (an instance they retired)."""


# ---------------------------------------------------------------------------- the builders


def launch_request(launch_id: str, domain: str, site: str, node_name: str, cores: int,
                   instance_type: str = "") -> LaunchRequest:
    return LaunchRequest(launch_id=launch_id, domain=domain, site=site, node_name=node_name, cores=cores,
                         instance_type=instance_type)


def node_command(domain: str, op: str, node: str, inst: Instance, reason: str, *, requeue: bool = False,
                 make_id: Callable[[], str] = new_id) -> NodeCommand:
    """A batch-system operation on ``inst``'s node (``address`` and ``cores`` for ``add`` only)."""
    return NodeCommand(command_id=make_id(), domain=domain, action=op, node=node, instance_id=inst.instance_id,
                       address=inst.ip if op == "add" else None, cores=inst.cores if op == "add" else None,
                       reason=reason, requeue=requeue and op == "remove")


def release(domain: str, node: str, instance_id: str, *, make_id: Callable[[], str] = new_id) -> NodeCommand:
    """Native mode: hand back to Slurm's power saving a slot held since its removal, once
    ``instance_id`` (the identity it still carries) has ended."""
    return NodeCommand(command_id=make_id(), domain=domain, action="release", node=node, instance_id=instance_id,
                       reason=f"epu: instance {instance_id} has ended")


def give_back(domain: str, node: str, reason: str, *, make_id: Callable[[], str] = new_id) -> NodeCommand:
    """Native mode: hand a node Slurm resumed back to Slurm (powered down with ``reason``, its job
    requeued) — a resume EPU cannot serve. No instance is behind it."""
    return NodeCommand(command_id=make_id(), domain=domain, action="give_back", node=node, reason=reason)


def proof_of(inst: Instance) -> Proof | None:
    """What the engine's record proves about ending ``inst`` now: its node removed (confirmed by
    the sensor), or an instance the batch system cannot know (judged again by the provisioner on a
    fresh listing); None: nothing — only a bookkeeping terminate may go."""
    if inst.removed:
        return Proof.REMOVED
    if not inst.batch_may_know:
        return Proof.UNSTARTED
    return None


def retire_of(inst: Instance, default: RetireReason = RetireReason.SCALE_DOWN) -> RetireReason:
    """``inst``'s typed retire reason (``default`` when it has none)."""
    try:
        return RetireReason(inst.retire) if inst.retire else default
    except ValueError:  # a row written before the reasons were typed
        return default


def terminate_request(inst: Instance, retire: RetireReason, proof: Proof, reason: str, *,
                      make_id: Callable[[], str] = new_id) -> TerminateRequest:
    """A terminate of ``inst`` for ``retire`` carrying ``proof``; the two flags of schema 1.x say
    the same (``TerminateRequest`` refuses flags that contradict the proof)."""
    return TerminateRequest(request_id=make_id(), instance_id=inst.instance_id, domain=inst.domain, reason=reason,
                            force=proof == Proof.FORCED,
                            unless_started=proof in (Proof.UNSTARTED, Proof.BOOKKEEPING),
                            retire=retire, proof=proof)


# ---------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Outgoing:
    """A command about to leave, with what the rules look at."""

    domain: str
    message: Message
    authority: Authority
    mode: str
    """The domain's mode now (``active``, ``observe``)."""
    instance: Instance | None
    """The engine's record of the command's instance now (None: unknown, or a launch not stored);
    for a ``give_back``, a live instance holding the node's name (None: none); for a ``release``,
    the instance whose identity the slot carries."""
    native: bool = False
    """The domain is in native mode now."""

    @property
    def kind(self) -> str:
        m = self.message
        return "launch" if isinstance(m, LaunchRequest) else "terminate" if isinstance(m, TerminateRequest) \
            else m.action if isinstance(m, NodeCommand) else m.TYPE


def _observe(o: Outgoing) -> str | None:
    return "observe mode: nothing leaves" if o.mode == "observe" else None


def _never_forced(o: Outgoing) -> str | None:
    m = o.message
    if isinstance(m, TerminateRequest) and m.effective_proof == Proof.FORCED:
        return "forced terminate: only an operator forces, never the engine"
    return None


def _superseded(o: Outgoing) -> str | None:
    """A command a later decision about its instance took back: it is closed, never sent (an
    ``add`` held in observe mode, or unanswered, re-sent after the instance was given up would
    put its node back in the batch system after its removal)."""
    inst, m = o.instance, o.message
    if inst is None:
        return None
    ended = inst.state in TERMINAL_INSTANCE_STATES
    if isinstance(m, LaunchRequest):
        return "launch of an instance already given up" if ended or inst.terminate_sent else None
    if not isinstance(m, NodeCommand):
        return None
    out = bool(inst.retire) or inst.terminate_sent or inst.removed or ended
    if m.action in ("add", "online") and out:
        return f"{m.action} of an instance on its way out"
    if m.action == "offline" and (not inst.retire or inst.removed or ended):
        return "offline of an instance taken back into service or already removed"
    return None


def _give_back_native(o: Outgoing) -> str | None:
    """A give-back powers a node down in Slurm and requeues its job: only in native mode, and
    never for a node one of our live instances holds (that node may run the job now)."""
    m = o.message
    if not isinstance(m, NodeCommand) or m.action != "give_back":
        return None
    if not o.native:
        return "give back outside native mode"
    if o.instance is not None:
        return f"give back of {m.node}: live instance {o.instance.instance_id} holds that name"
    return None


def _release_when_ended(o: Outgoing) -> str | None:
    """A release makes a slot schedulable again: only in native mode, and only once the instance
    it was held for has ended (its machine could otherwise answer Slurm's power-up)."""
    m = o.message
    if not isinstance(m, NodeCommand) or m.action != "release":
        return None
    if not o.native:
        return "release outside native mode"
    if o.instance is not None and o.instance.state not in TERMINAL_INSTANCE_STATES:
        return f"release of {m.node}: its instance {o.instance.instance_id} still lives ({o.instance.state})"
    return None


def _reason_allows_proof(o: Outgoing) -> str | None:
    m = o.message
    if not isinstance(m, TerminateRequest):
        return None
    if m.retire is None or m.proof is None:
        return "terminate without a typed reason and proof"
    if not allowed(m.retire, m.proof):
        return f"reason {m.retire.value!r} does not allow proof {m.proof.value!r}"
    return None


def _proof_holds(o: Outgoing) -> str | None:
    m = o.message
    if not isinstance(m, TerminateRequest) or m.proof in (None, Proof.BOOKKEEPING):
        return None
    inst = o.instance
    if inst is None:
        return f"proof {m.proof.value!r} of an instance the engine does not know"
    if m.proof == Proof.REMOVED and not inst.removed:
        return "proof 'removed' but the sensor has not confirmed the node's removal"
    if m.proof == Proof.UNSTARTED and inst.batch_may_know:
        return "proof 'unstarted' but the batch system may know the instance"
    return None


@dataclass(frozen=True)
class Rule:
    name: str
    check: Callable[[Outgoing], str | None]
    """Why the command may not leave, or None."""


RULES: tuple[Rule, ...] = (
    Rule("observe", _observe),
    Rule("not superseded", _superseded),
    Rule("give back native only", _give_back_native),
    Rule("release when ended", _release_when_ended),
    Rule("engine never forces", _never_forced),
    Rule("reason allows proof", _reason_allows_proof),
    Rule("proof holds", _proof_holds),
)


def verdict(o: Outgoing) -> tuple[str, str] | None:
    """(rule, why) of the first rule that holds ``o`` back, or None: it may leave."""
    for rule in RULES:
        why = rule.check(o)
        if why is not None:
            return rule.name, why
    return None


def instance_of(msg: Message) -> str | None:
    return (msg.launch_id if isinstance(msg, LaunchRequest) else msg.instance_id
            if isinstance(msg, TerminateRequest | NodeCommand) else None)


def action_id(msg: Message) -> str:
    """The id an intent of ``msg`` is stored under (``DecisionStore.mark_sent``)."""
    if isinstance(msg, LaunchRequest):
        return msg.launch_id
    if isinstance(msg, NodeCommand):
        return msg.command_id
    assert isinstance(msg, TerminateRequest)
    return msg.request_id


def authority_of(inst: Instance | None) -> Authority:
    """An action on an instance an operator retired is on the operator's authority; any other
    planned action on the policy's."""
    return Authority.OPERATOR if inst is not None and inst.retire == RetireReason.OPERATOR else Authority.POLICY


# ---------------------------------------------------------------------------- the door


@dataclass
class Sent:
    """What one ``Gate.send`` did: the ids that left, and the commands held back with why."""

    ids: list[str] = field(default_factory=list)
    held: list[tuple[Message, str, str]] = field(default_factory=list)
    """(command, rule, why)."""


class Gate:
    """Publishes commands that pass ``RULES`` (see the module docstring)."""

    def __init__(self, store: DecisionStore, publish: Callable[[Message], Any],
                 publish_many: Callable[[list[Message]], Any] | None = None) -> None:
        self.store = store
        self.publish = publish
        self.publish_many = publish_many
        self.counts: Counter[tuple[str, str, str]] = Counter()
        """(domain, kind, authority) → commands sent."""
        self.held: Counter[tuple[str, str, str]] = Counter()
        """(domain, kind, rule) → commands held back."""

    def mode(self, domain: str) -> str:
        current = self.store.current_config(domain)
        return current[1].mode if current is not None else "active"

    def native(self, domain: str) -> bool:
        current = self.store.current_config(domain)
        return bool(getattr(current[1], "native", "")) if current is not None else False

    def _holder(self, domain: str, node: str) -> Instance | None:
        """A live instance of ``domain`` whose node name is ``node`` (a give-back's guard)."""
        for inst in self.store.instances(domain):
            if inst.state not in TERMINAL_INSTANCE_STATES and inst.node_name.split(".", 1)[0] == node.split(".", 1)[0]:
                return inst
        return None

    def send(self, domain: str, messages: Iterable[Message], authority: Authority | None = None,
             instances: dict[str, Instance] | None = None) -> Sent:
        """Publish each of ``messages`` that passes the rules (one confirmed batch when the service
        can), on ``authority`` (None: each command's own, ``authority_of`` its instance);
        ``instances``: the caller's records of the commands' instances (else the store's). A
        publish failure raises after nothing or some were sent; the ids sent are in the error's
        ``sent`` attribute."""
        mode = self.mode(domain)
        out = Sent()
        ready: list[tuple[Message, Authority, str]] = []
        native: bool | None = None
        for msg in messages:
            iid = instance_of(msg)
            inst = (instances or {}).get(iid) if iid else None
            if inst is None and iid is not None and not isinstance(msg, LaunchRequest):
                inst = self.store.instance(iid)
            if isinstance(msg, NodeCommand) and msg.action in ("give_back", "release"):
                native = self.native(domain) if native is None else native
                if msg.action == "give_back":
                    inst = self._holder(domain, msg.node)
            auth = authority or authority_of(inst)
            o = Outgoing(domain, msg, auth, mode, inst, native=bool(native))
            held = verdict(o)
            if held is not None:
                rule, why = held
                out.held.append((msg, rule, why))
                if rule == "not superseded":
                    self.store.complete(action_id=action_id(msg), outcome=f"closed: {why}")
                self.held[(domain, o.kind, rule)] += 1
                (log.debug if rule == "observe" else log.error)("command held at the gate", extra={
                    "domain": domain, "kind": o.kind, "instance": iid, "rule": rule, "why": why,
                    "authority": auth.value})
                continue
            # an operator's action names the operator (their change put it in the instance's reason)
            ready.append((msg, auth, inst.reason if auth == Authority.OPERATOR and inst is not None else ""))
        if not ready:
            return out
        try:
            if self.publish_many is not None and len(ready) > 1:
                self.publish_many([m for m, _, _ in ready])
                out.ids = [action_id(m) for m, _, _ in ready]
            else:
                for m, _, _ in ready:
                    self.publish(m)
                    out.ids.append(action_id(m))
        except Exception as exc:
            exc.sent = list(out.ids)  # type: ignore[attr-defined]
            raise
        finally:
            for m, auth, operator in ready[:len(out.ids)]:
                kind = Outgoing(domain, m, auth, mode, None).kind
                self.counts[(domain, kind, auth.value)] += 1
                if isinstance(m, TerminateRequest) or auth != Authority.POLICY:
                    log.info("command sent", extra={"domain": domain, "kind": kind, "instance": instance_of(m),
                                                    "authority": auth.value, "reason": getattr(m, "reason", ""),
                                                    **({"operator": operator} if operator else {})})
        return out


# ---------------------------------------------------------------------------- observe mode


def shadow_plan(out: Any) -> Any:
    """Observe mode at planning: the plan as a record of what would have been done — its actions
    moved to ``shadow``, nothing left to store (no intent, no instance row changed) or to send."""
    if not out.actions:
        return out
    note = f"observe mode: {len(out.actions)} action(s) recorded, none done"
    return replace(out, actions=[], instances={}, shadow=list(out.actions), notes=[*out.notes, note])


def shadow_signature(planned: Iterable[Any]) -> tuple[tuple[str, str, str, str], ...]:
    """What a shadow plan would do, without its fresh ids: (kind, instance or "", site, type). Two
    iterations that would do the same have the same signature (a launch gets a new id each time)."""
    return tuple(sorted((p.kind, "" if p.kind == "launch" else p.instance_id, p.site, p.instance_type)
                        for p in planned))


__all__ = ["COMMAND_TYPES", "RULES", "Authority", "Gate", "Outgoing", "Rule", "Sent", "action_id", "authority_of",
           "give_back", "instance_of", "launch_request", "node_command", "proof_of", "release", "retire_of",
           "shadow_plan", "shadow_signature", "terminate_request", "verdict"]
