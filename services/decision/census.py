"""The census: what a snapshot says about the engine's instances (joined, idle, lost). Pure.

One definition (``refresh_census``), one entry point for the engine (``CensusKeeper.take``).
The rules, per instance (``tests/decision/test_census.py`` keeps them written plainly as the
oracle the code is compared with on random tables and snapshots):

- its node is found by ``NodeIndex.find`` (identity, then short name); one seen for the first
  time sets ``seen_at``;
- a launched instance (requested, pending, started; not given up) whose node is in service
  (free or busy) has *joined*: ``joined_at``, and ``idle_since`` if the node is idle;
- a joined instance is idle (``idle_since``) while its node is free with no job and no core
  used, and lost (``missing_since``) while its node is absent or ``down``; the timers start
  when the condition starts and clear when it ends (the store keeps them, so a restarted engine
  keeps counting);
- absence never removes anything (only the sensor's successful ``remove`` does,
  ``Engine.on_node_result``), and an unavailable snapshot changes nothing (it shows nothing,
  which is not an empty cluster).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from epu.common.messages import NodeInfo
from epu.services.decision.view import (
    IN_SERVICE,
    PENDING_STATES,
    Instance,
    NodeIndex,
    Parts,
    evolve,
    partition,
    short_name,
)


@dataclass
class Census:
    """``refresh_census``'s result: the refreshed instances and what the engine needs of them
    next, gathered in the same pass."""

    instances: list[Instance]
    parts: Parts
    """active/pending/joined/draining of ``instances``."""
    changed: list[Instance]
    """The instances refresh replaced (new timers or states: to be stored)."""
    joined: list[Instance] = field(default_factory=list)
    """Of ``changed``, those that joined in this refresh (pending before)."""
    known: int = 0
    """Joined or draining instances the batch system had joined, not removed or being
    terminated: the circuit breaker's denominator (``breaker.missing_verdict``)."""
    missing: int = 0
    """Of ``known``, those whose node the snapshot does not list."""
    gangs: bool = False
    """Some instance belongs to a gang (``dissolve_complete_gangs`` has work to look at)."""
    counted: bool = True
    """``known`` was counted (not on an unavailable snapshot, which refreshes nothing)."""

    def copy(self) -> Census:
        """A copy whose lists the caller may change (the keeper's stays as it is)."""
        a, p, j, d = self.parts
        return Census(list(self.instances), (list(a), list(p), list(j), list(d)), list(self.changed),
                      list(self.joined), self.known, self.missing, self.gangs, self.counted)


def refresh(instances: list[Instance], nodes: dict[str, NodeInfo] | NodeIndex, now: float,
            available: bool) -> list[Instance]:
    """The refreshed instances alone (``refresh_census``)."""
    return refresh_census(instances, nodes, now, available).instances


def refresh_parts(instances: list[Instance], nodes: dict[str, NodeInfo] | NodeIndex, now: float,
                  available: bool) -> tuple[list[Instance], Parts]:
    """The refreshed instances and their ``partition`` (``refresh_census``)."""
    r = refresh_census(instances, nodes, now, available)
    return r.instances, r.parts


def refresh_census(instances: list[Instance], nodes: dict[str, NodeInfo] | NodeIndex, now: float,
                   available: bool) -> Census:
    """The census's one definition: the instances refreshed from the snapshot (module
    docstring's rules), partitioned, what changed and joined listed, and the circuit breaker's
    counts — in one pass, one node look-up per instance (each pass over 50,000 instances is
    milliseconds). An unavailable snapshot refreshes nothing and counts nothing."""
    if not available:
        return Census(list(instances), partition(instances), [], gangs=any(i.gang for i in instances),
                      counted=False)
    index = nodes if isinstance(nodes, NodeIndex) else NodeIndex(nodes)
    ids, shorts = index.by_id, index.by_short
    out: list[Instance] = []
    active: list[Instance] = []
    pending: list[Instance] = []
    joined: list[Instance] = []
    draining: list[Instance] = []
    changed: list[Instance] = []
    came: list[Instance] = []
    known = missing = 0
    gangs = False
    append = out.append
    for inst in instances:  # written for speed: at 50,000 instances each step here is milliseconds
        node = ids.get(inst.instance_id) if ids else None  # NodeIndex.find, inlined
        if node is None and shorts:
            name = inst.node_name
            # a name found as it is is short already (every key is): short_name would not change it
            node = shorts.get(name)
            if node is None:
                node = shorts.get(short_name(name))
        state = inst.state
        new = inst
        if node is not None and inst.seen_at is None:
            new = evolve(new, seen_at=now)
        if state == "joined":
            if node is None:
                idle, lost = False, True
            else:
                ns = node.state
                idle = ns == "free" and not node.jobs and not node.cores_used
                lost = ns == "down"
            if idle != (inst.idle_since is not None):
                new = evolve(new, idle_since=now if idle else None)
            if lost != (inst.missing_since is not None):
                new = evolve(new, missing_since=now if lost else None)
        elif (node is not None and state in PENDING_STATES and node.state in IN_SERVICE
              and not inst.terminate_sent and not inst.retire):
            # joined = in service. A name that is merely known to the batch system (a
            # pre-declared, powered-down pool slot; a node still offline or down) has not
            # joined: the instance still needs its "add".
            idle = node.state == "free" and not node.jobs and not node.cores_used
            new = evolve(new, state="joined", state_at=now, joined_at=now, idle_since=now if idle else None)
            came.append(new)
        if new is not inst:
            changed.append(new)
        append(new)
        if new.gang:
            gangs = True
        if new.terminate_sent:
            continue
        state = new.state
        if state == "joined":
            if new.retire:
                draining.append(new)  # on its way out (given up)
            else:
                joined.append(new)
                active.append(new)
            if new.joined_at is not None and not new.removed:
                known += 1
                if node is None:
                    missing += 1
        elif state == "draining":
            draining.append(new)
            if new.joined_at is not None and not new.removed:
                known += 1
                if node is None:
                    missing += 1
        elif state in PENDING_STATES:
            if new.retire:
                draining.append(new)
            else:
                pending.append(new)
                active.append(new)
    return Census(out, (active, pending, joined, draining), changed, came, known, missing, gangs)


@dataclass
class _Kept:
    stamp: int
    nodes: int
    census: Census


class CensusKeeper:
    """The engine's census per domain, taken again only when its inputs changed.

    Why it keeps one: at 50,000 instances the census is a pass of tens of milliseconds, and an
    engine iterates every few seconds on the same snapshot and the same instances (the sensor
    polls every minute; most of its snapshots repeat the last one's node objects, which
    ``NodeIndex.content`` then names alike). A census in which nothing changed is a fixed point
    of the rules whatever the time (no timer starts or ends without its node's state changing),
    so while the store's stamp of the domain's instances (``DecisionStore.domain_stamp``) and the
    snapshot's node content are the ones it was taken on, taking it again gives the same result.
    A census that changed instances is not kept: they are stored, which gives a new stamp.
    ``tests/decision/test_census.py`` runs engines with and without the keeper side by side."""

    def __init__(self) -> None:
        self._kept: dict[str, _Kept] = {}

    def take(self, domain: str, stamp: int | None, index: NodeIndex, available: bool, now: float,
             instances: Callable[[], list[Instance]]) -> Census:
        """The census of ``domain``'s instances (``instances()``: the store's, at ``stamp``) on the
        snapshot's nodes ``index``; a copy the caller may change."""
        kept = self._kept.get(domain)
        if kept is not None and stamp is not None and kept.stamp == stamp and kept.nodes == index.content \
                and available:
            return kept.census.copy()
        self._kept.pop(domain, None)
        census = refresh_census(instances(), index, now, available)
        if stamp is not None and available and not census.changed:
            self._kept[domain] = _Kept(stamp, index.content, census.copy())
        return census

    def forget(self) -> None:
        """Every domain's census (the store's working set may be another engine's now)."""
        self._kept.clear()
