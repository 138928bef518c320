"""The instance state machine — pure, no I/O.

Why a module of its own: rule 4 of the design ("state only moves forward") is the one
invariant every part of the provisioner leans on — the consumer, the poll loop, the
reconciler and a second provisioner process all race to move the same record. Each of them
asks ``check_transition`` and the store applies the answer with a compare-and-set, so the
order is decided here, once, and tested without a database or a cloud.

Who moves which state: the provisioner owns the cloud life cycle (requested, pending,
started, terminating, terminated, failed). ``joined`` and ``draining`` belong to the
decision engine, which sees them in sensor snapshots; they are in the order so a record
that an operator tool advanced there still never moves back.

The states are ``common.messages.InstanceState`` (a ``StrEnum``, the one definition): a member is
its string, so the records a store hands out (plain strings from SQL) are compared with members
as they are, and nothing converts on the hot paths.
"""

from __future__ import annotations

from dataclasses import dataclass

from epu.common.messages import INSTANCE_STATE_ORDER, TERMINAL_INSTANCE_STATES, InstanceState
from libcloud.compute.types import NodeState

S = InstanceState

#: States this service sets from cloud observations and commands.
PROVISIONER_STATES = (S.REQUESTED, S.PENDING, S.STARTED, S.TERMINATING, S.TERMINATED, S.FAILED)

#: libcloud's NodeState → our state. ``None`` means "tells us nothing new" (keep the record).
NODE_STATE_MAP: dict[str, InstanceState | None] = {
    NodeState.PENDING.value: S.PENDING,
    NodeState.STARTING.value: S.PENDING,
    NodeState.REBOOTING.value: None,
    NodeState.RUNNING.value: S.STARTED,
    NodeState.NORMAL.value: S.STARTED,
    NodeState.UPDATING.value: None,
    NodeState.RECONFIGURING.value: None,
    NodeState.MIGRATING.value: None,
    NodeState.STOPPING.value: None,
    NodeState.STOPPED.value: None,
    NodeState.SUSPENDED.value: None,
    NodeState.PAUSED.value: None,
    NodeState.TERMINATED.value: S.TERMINATED,
    NodeState.ERROR.value: S.FAILED,
    NodeState.UNKNOWN.value: None,
}


def map_node_state(state: object) -> InstanceState | None:
    """Map a libcloud ``NodeState`` (enum or its string value) to an instance state."""
    value = state.value if isinstance(state, NodeState) else str(state)
    return NODE_STATE_MAP.get(value)


def is_terminal(state: str) -> bool:
    return state in TERMINAL_INSTANCE_STATES


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    why: str = ""


def check_transition(current: str | None, new: str) -> Verdict:
    """May a record in ``current`` move to ``new``? ``current=None`` is a record being created.

    Forward moves may skip states (a poll can see a node already running). Moving to the
    same state is not a transition (nothing to publish). A terminal record never changes:
    a late "started" after "terminated" is a stale observation, not a resurrection.
    """
    if new not in INSTANCE_STATE_ORDER:
        return Verdict(False, f"unknown state {new!r}")
    if current is None:
        return Verdict(True)
    if current == new:
        return Verdict(False, "no change")
    if is_terminal(current):
        return Verdict(False, f"{current} is terminal")
    if INSTANCE_STATE_ORDER[new] < INSTANCE_STATE_ORDER[current]:
        return Verdict(False, f"{current} -> {new} would move backwards")
    return Verdict(True)
