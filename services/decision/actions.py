"""What a policy may ask for. Pure data: the planner turns these into messages.

A policy speaks in instances and node operations, never in sites or message ids: where a
launch goes is placement's business (``placement.py``), and ids, intent records and
re-sends are the engine's (``planner.py``, ``engine.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from epu.common.retire import RetireReason
from epu.services.decision.packing import Offer

NodeOp = Literal["add", "offline", "online", "remove"]


@dataclass(frozen=True)
class Launch:
    """Start one instance able to hold ``cores`` cores — of one catalogue type when ``offers`` is
    set (equal offers of that type at one or more sites: placement picks the site among them)."""

    cores: int
    reason: str
    kind: Literal["launch"] = "launch"
    offers: tuple[Offer, ...] = ()
    """Empty: the domain's single-type launch (any of its sites, the site's size)."""
    gang: str = ""
    """``KEY:SIZE`` when this launch is one of SIZE new instances that multi-node jobs need all
    together (launches of one decision with the same key are one group)."""
    name: str = ""
    """The node name the instance must have ("" = from the domain's names or pattern): native
    mode launches exactly the node Slurm resumed (``slurm_native``)."""

    @property
    def instance_type(self) -> str:
        return self.offers[0].type if self.offers else ""


@dataclass(frozen=True)
class Node:
    """A batch-system operation on the node of one of our instances."""

    op: NodeOp
    instance_id: str
    reason: str
    retire: RetireReason | Literal[""] = ""
    """Set on the first step of taking an instance out (scale-down, stalled, lost, operator)."""
    requeue: bool = False
    """For remove: requeue the node's jobs first (the cloud preempted its machine: they died
    with it, not by our hand)."""

    @property
    def kind(self) -> str:
        return self.op


@dataclass(frozen=True)
class Terminate:
    """Give an instance back to its cloud. ``force`` allows it while a job still runs there."""

    instance_id: str
    reason: str
    force: bool = False
    stalled: bool = False
    kind: Literal["terminate"] = "terminate"
    retire: RetireReason | Literal[""] = ""


Action = Launch | Node | Terminate


@dataclass
class Decision:
    """What ``decide`` returns: the actions, the policy's new memory (timers such as
    "waiting above threshold since", utilisation samples; ``None`` = unchanged) and notes
    explaining the arithmetic, which end up in the decision record."""

    actions: list[Action] = field(default_factory=list)
    memory: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    failed_sites: dict[str, str] = field(default_factory=dict)
    """Sites to count one failure against (an instance stalled there), with why: at most one
    per site per iteration, so one outage never jumps a site to the longest backoff."""
