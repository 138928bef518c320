"""The census: what a snapshot says about the engine's instances (joined, idle, lost). Pure.

One definition (``refresh_census``), one entry point for the engine's iteration
(``CensusKeeper.for_iteration``: the kept census, ``CensusKeeper.take``, then the gangs complete
now dissolved).
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
  ``node_results.on_node_result``), and an unavailable snapshot changes nothing (it shows nothing,
  which is not an empty cluster).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from itertools import filterfalse

from epu.common.messages import NodeInfo
from epu.services.decision.view import (
    IN_SERVICE,
    PENDING_STATES,
    Instance,
    NodeIndex,
    Parts,
    dissolve_complete_gangs,
    evolve,
    partition,
    short_name,
)


@dataclass
class Census:
    """``refresh_census``'s result: the refreshed instances and what the engine needs of them
    next, gathered in the same pass."""

    instances: list[Instance]
    parts: Parts | None
    """active/pending/joined/draining of ``instances`` (``None``: not computed yet, ``partition``)."""
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
    quiet: tuple[dict[str, Instance], ...] | None = None
    """Node name → the instance ``refresh_census_again`` found unchanged on it, found by its own
    (short) node name: joined on a busy node with no timer running (most of them); joined and
    idle on an idle node; draining on a node the snapshot lists; joined and lost on a down node;
    pending with no node in the snapshot. On the next snapshot only those whose node left that
    class (set differences: ``NodeIndex.busy_short``, ``idle_short``, ``by_short``,
    ``down_short``; for the last, the names now listed) and ``rest`` are looked at. ``None``: not
    gathered (the full census does not; nor when nodes carry instance ids)."""
    rest: list[Instance] | None = None
    """With ``quiet``: every other instance (looked at on each new snapshot)."""
    gathered_at: int | None = None
    """With ``quiet``: the ``NodeIndex.serial`` it was gathered on (each quiet busy name was busy
    there: on the next index, built with that one ``before``, only its ``left_busy`` names can leave)."""


@dataclass
class Refreshed:
    """A domain's instances refreshed from its latest snapshot for an iteration
    (``CensusKeeper.for_iteration``): the census, with the gangs complete now dissolved."""

    before: list[Instance]
    """The store's instances, as the census found them."""
    instances: list[Instance]
    parts: Parts
    """active/pending/joined/draining of ``instances``."""
    changed: list[Instance]
    """The instances replaced (new timers or states, gangs dissolved: to be stored)."""
    joined: list[Instance]
    """Of ``instances``, those that joined in this refresh."""
    census: Census
    """The census itself (the circuit breaker's counts; ``gangs``: before any was dissolved)."""


def refresh(instances: list[Instance], nodes: dict[str, NodeInfo] | NodeIndex, now: float,
            available: bool) -> list[Instance]:
    """The refreshed instances alone (``refresh_census``)."""
    return refresh_census(instances, nodes, now, available).instances


def refresh_parts(instances: list[Instance], nodes: dict[str, NodeInfo] | NodeIndex, now: float,
                  available: bool) -> tuple[list[Instance], Parts]:
    """The refreshed instances and their ``partition`` (``refresh_census``)."""
    r = refresh_census(instances, nodes, now, available)
    assert r.parts is not None  # the full census partitions in its pass
    return r.instances, r.parts


def node_idle(node: NodeInfo) -> bool:
    """Is the node idle: free, with no job and no core used? (A joined instance's ``idle_since``
    runs while it is.)"""
    return node.state == "free" and not node.jobs and not node.cores_used


def joins(inst: Instance, node: NodeInfo) -> bool:
    """The join rule, its one statement (both passes call it): a pending instance whose node the
    batch system has *in service* has joined — unless it is on its way out. A name that is merely
    known to the batch system (a pre-declared, powered-down pool slot; a node still offline or
    down) has not joined: the instance still needs its ``add``."""
    return (inst.state in PENDING_STATES and node.state in IN_SERVICE and not inst.terminate_sent
            and not inst.retire)


def counts_missing(inst: Instance) -> bool:
    """The missing rule, its one statement (both passes and ``breaker.check`` call it): a joined
    instance that joined, whose node was not removed and that is not being terminated, is counted
    by the circuit breaker — known, and missing when the snapshot does not show its node. A
    draining one is not: the engine is taking its node out, so its node leaving the batch system
    is the expected outcome, and its end waits for the sensor's confirmed removal whatever the
    snapshot says (htcondor-two-views, seed 85007: six HTCondor masters that exited after a
    peaceful shutdown opened the breaker, which then held the removes that would have confirmed
    them: eleven VMs left at rest for ever)."""
    return inst.state == "joined" and inst.joined_at is not None and not inst.removed and not inst.terminate_sent


def joined_timers(inst: Instance, node: NodeInfo | None, now: float) -> Instance:
    """A joined instance's idle and lost timers on a snapshot, the rule's one statement (both
    passes call it): idle (``idle_since``) while its node is idle (``node_idle``), lost
    (``missing_since``) while its node is absent (``None``) or ``down``; each starts when its
    condition starts and clears when it ends. The same object when neither moves."""
    if node is None:
        idle, lost = False, True
    else:
        idle, lost = node_idle(node), node.state == "down"
    if idle != (inst.idle_since is not None):
        inst = evolve(inst, idle_since=now if idle else None)
    if lost != (inst.missing_since is not None):
        inst = evolve(inst, missing_since=now if lost else None)
    return inst


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
            new = joined_timers(new, node, now)
        elif node is not None and state in PENDING_STATES and joins(inst, node):
            new = evolve(new, state="joined", state_at=now, joined_at=now,
                         idle_since=now if node_idle(node) else None)
            came.append(new)
        if new is not inst:
            changed.append(new)
        append(new)
        if new.gang:
            gangs = True
        if new.terminate_sent:
            continue
        state = new.state
        if state == "joined" or state == "draining":
            if state == "draining" or new.retire:
                draining.append(new)  # on its way out (given up, or drained)
            else:
                joined.append(new)
                active.append(new)
            if counts_missing(new):
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


def refresh_census_again(prev: Census, index: NodeIndex, now: float) -> Census | None:
    """``refresh_census(prev.instances, index, ...)`` for a new snapshot when the instances are
    the very objects ``prev`` lists: which part each instance is in and ``known`` depend on the
    instance alone, so only the timers and ``missing`` are looked at again — a shorter pass.

    Why it exists (the census's one incremental implementation, used only by ``CensusKeeper``):
    at 50,000 nodes the full census is ~30 ms of pure Python, and the engine's iteration right
    after a snapshot in which 1 % of the nodes changed went from ~35 ms to ~55 ms without it
    (``bench/bench_decision.py --scale-only``), beyond the +10 % the engine's figures may move.
    ``tests/decision/test_census.py`` compares it with ``refresh_census`` (itself compared with
    the rules written plainly) on random tables and chains of snapshots.
    ``None`` when an instance joins in this refresh (its part changes: the full census does it)
    or ``prev`` counted nothing (an unavailable snapshot).

    When ``prev`` gathered its quiet instances (``Census.quiet``) and the snapshot's nodes carry
    no instance ids, a quiet instance whose short node name is still a busy node's changes
    nothing: only the others are looked at (``quiet`` minus the busy names, and ``rest``)."""
    if not prev.counted:
        return None
    ids, shorts = index.by_id, index.by_short
    busy, idle_names, down = index.busy_short, index.idle_short, index.down_short
    gather = busy is not None and idle_names is not None and down is not None
    quiet_before = prev.quiet if gather else None
    if quiet_before is not None and prev.rest is not None:
        assert busy is not None and idle_names is not None and down is not None
        # taken over, not copied (a copy of 50,000 entries is milliseconds): ``prev`` keeps no
        # quiet set, so a second use of it takes the plain pass (the same result)
        quiet, quiet_idle, quiet_drain, quiet_down, quiet_absent = quiet_before
        look = list(prev.rest)
        left = index.left_busy if index.since is not None and index.since == prev.gathered_at else None
        prev.quiet = prev.rest = prev.gathered_at = None
        if left is not None:  # quiet ⊆ the busy names of the index it was gathered on: only these left
            for n in sorted(n for n in left if n in quiet):  # sorted: the same order in every process
                look.append(quiet.pop(n))
        for names, q in (((busy, quiet),) if left is None else ()) + (
                (idle_names, quiet_idle), (shorts, quiet_drain), (down, quiet_down)):
            for n in list(filterfalse(names.__contains__, q)):
                look.append(q.pop(n))
        for n in list(filter(shorts.__contains__, quiet_absent)):  # its node showed up
            look.append(quiet_absent.pop(n))
    else:
        look = prev.instances
        quiet, quiet_idle, quiet_drain, quiet_down, quiet_absent = {}, {}, {}, {}, {}
    rest: list[Instance] = []
    changed: list[Instance] = []
    olds: list[Instance] = []  # the instances ``changed`` replaces, in the same order
    missing = 0
    for inst in look:  # the same steps as refresh_census's, for speed too
        node = ids.get(inst.instance_id) if ids else None
        name = inst.node_name
        if node is None and shorts:
            node = shorts.get(name)
            if node is None:
                node = shorts.get(short_name(name))
        state = inst.state
        if (node is not None and node.state == "busy" and state == "joined" and inst.idle_since is None
                and inst.missing_since is None and inst.seen_at is not None):
            # most of them: joined, on a busy node, nothing to change (busy: not idle, not down)
            if gather:
                if name in busy and name not in quiet:  # found by its own name: a set look-up next time
                    quiet[name] = inst
                else:
                    rest.append(inst)
            continue
        if gather and node is not None and inst.seen_at is not None and inst.missing_since is None:
            if state == "joined" and inst.idle_since is not None and node_idle(node):
                # idle, and its node still is: nothing to change
                if name in idle_names and name not in quiet_idle:
                    quiet_idle[name] = inst
                else:
                    rest.append(inst)
                continue
            if state == "draining":  # listed and seen: nothing to change, not missing
                if name in shorts and name not in quiet_drain:
                    quiet_drain[name] = inst
                else:
                    rest.append(inst)
                continue
        if (gather and node is not None and state == "joined" and node.state == "down" and inst.idle_since is None
                and inst.missing_since is not None and inst.seen_at is not None):
            # lost, and known to be (missing_since runs): nothing to change while it stays down
            if name in down and name not in quiet_down:  # type: ignore[operator]
                quiet_down[name] = inst
            else:
                rest.append(inst)
            continue
        if (gather and node is None and state in PENDING_STATES and name not in quiet_absent
                and name.islower() and "." not in name):
            # launched, its node not in the batch system yet: nothing to change, not missing, until
            # its name shows (its own short name: a look-up by it finds the node then)
            quiet_absent[name] = inst
            continue
        new = inst
        if node is None:
            if state == "joined":
                new = joined_timers(new, None, now)
            if counts_missing(inst):
                missing += 1
        else:
            if inst.seen_at is None:
                new = evolve(new, seen_at=now)
            if state == "joined":
                new = joined_timers(new, node, now)
            elif joins(inst, node):
                return None  # it joins
        if gather:
            rest.append(new)
        if new is not inst:
            changed.append(new)
            olds.append(inst)
    q, r = ((quiet, quiet_idle, quiet_drain, quiet_down, quiet_absent), rest) if gather else (None, None)
    if not changed:
        was = prev.parts if prev.parts is not None else partition(prev.instances)
        parts: Parts = (list(was[0]), list(was[1]), list(was[2]), list(was[3]))
        return Census(list(prev.instances), parts, [], [], prev.known, missing, prev.gangs, quiet=q, rest=r,
                      gathered_at=index.serial if gather else None)
    # the changed ones put in their places (their parts do not change: a new timer or seen_at
    # only), listed in the instances' order, and the parts again — all in one pass
    after, parts, changed = _swap_partition(prev.instances, dict(zip(map(id, olds), changed, strict=True)))
    return Census(after, parts, changed, [], prev.known, missing, prev.gangs, quiet=q, rest=r,
                  gathered_at=index.serial if gather else None)


def _swap_partition(instances: list[Instance], swap: dict[int, Instance]) -> tuple[
        list[Instance], Parts, list[Instance]]:
    """``instances`` with each instance whose ``id()`` ``swap`` holds replaced by ``swap``'s, its
    ``partition``, and the replacements in the instances' order (one pass for the swap, then
    ``partition`` itself: the rule of the parts has one definition)."""
    after: list[Instance] = []
    swapped: list[Instance] = []
    get = swap.get
    for i in instances:
        new = get(id(i))
        if new is not None:
            i = new
            swapped.append(new)
        after.append(i)
    return after, partition(after), swapped


@dataclass
class _Kept:
    """A domain's last census, while it may be taken over (``CensusKeeper``)."""

    nodes: int | None
    """The ``NodeIndex.serial`` it was taken on (None: that snapshot is gone, a new one came)."""
    stamp: int | None
    """The store's stamp of the domain's instances it holds for (None: not confirmed yet)."""
    census: Census
    held: int | None = None
    """A stamp at which the store held exactly ``census.instances``: the stamp right after the
    engine stored this census's own changes and nothing else (``CensusKeeper.stored``). While it
    is the store's stamp, the identity check of 50,000 objects (a set of their ids: ~10 ms) is
    not needed."""


class CensusKeeper:
    """The engine's one entry point to the census, per domain: ``take`` it (``for_iteration``:
    and dissolve the complete gangs), ``stored`` after a commit, ``forget`` when the store may
    have changed under it.

    Why it keeps one: at 50,000 instances the census is ~30 ms, and an engine iterates every few
    seconds on the same snapshot and the same instances (the sensor polls every minute). A census
    taken again on the same snapshot and the same instance objects changes nothing (a fixed point
    of its rules whatever the time, unless an instance joined), so it is reused while the store's
    stamp (``DecisionStore.domain_stamp``) and the snapshot are the ones it was taken on; with
    only a new snapshot, ``refresh_census_again`` makes the shorter pass. ``tests/decision/
    test_census.py`` runs engines with and without the keeper side by side."""

    def __init__(self) -> None:
        self._kept: dict[str, _Kept] = {}

    def take(self, domain: str, stamp: int | None, index: NodeIndex, available: bool, now: float,
             instances: Callable[[], list[Instance]]) -> tuple[list[Instance], Census]:
        """(the instances before, their census on ``index``): ``instances()`` are the store's, at
        ``stamp``. The census's lists are the caller's to change."""
        kept = self._kept.get(domain)
        before = None
        if stamp is not None and kept is not None and kept.stamp != stamp:
            # the instances changed since: if only by the engine storing this census's own
            # changes (its timers), the store now holds exactly its objects, in its own order
            before = instances()
            mine = kept.census.instances
            if len(before) == len(mine):
                if all(map(operator.is_, before, mine)):
                    kept.stamp = stamp
                elif kept.held == stamp or (
                        len(ids := set(map(id, mine))) == len(mine) and ids.issuperset(map(id, before))):
                    # the same objects, in the store's order now (it lists a written instance after
                    # the others launched at the same moment): each is still its own refresh, only
                    # the parts follow the order (partitioned when needed)
                    kept.census = replace(kept.census, instances=list(before), parts=None)
                    kept.stamp = stamp
        same = stamp is not None and kept is not None and kept.stamp == stamp
        if same and kept is not None and kept.nodes == index.serial:
            # same snapshot, same instance objects: the census would change nothing again
            c = kept.census
            if c.parts is None:
                c.parts = partition(c.instances)
            a, p, j, d = c.parts
            return list(c.instances), Census(list(c.instances), (list(a), list(p), list(j), list(d)), [], [],
                                             c.known, c.missing, c.gangs, c.counted)
        self._kept.pop(domain, None)
        census = None
        if same and kept is not None and available:  # a new snapshot, the same instances
            before = list(kept.census.instances)
            census = refresh_census_again(kept.census, index, now)
        if before is None:
            before = instances()
        if census is None:
            census = refresh_census(before, index, now, available)
        assert census.parts is not None  # both passes partition their result
        if stamp is not None and not census.joined:
            # without a join (a joining instance keeps timers a second census may reset) the
            # result is the census's fixed point on this snapshot: valid at once if nothing
            # changed, else once the store holds exactly these objects (checked at the next take)
            a, p, j, d = census.parts
            self._kept[domain] = _Kept(index.serial, stamp if not census.changed else None, Census(
                list(census.instances), (list(a), list(p), list(j), list(d)), [], [], census.known, census.missing,
                census.gangs, census.counted, census.quiet, census.rest, census.gathered_at))
        return before, census

    def for_iteration(self, domain: str, stamp: int | None, index: NodeIndex, available: bool, now: float,
                      instances: Callable[[], list[Instance]]) -> Refreshed:
        """The domain's instances refreshed for an iteration (``take``'s arguments): the census,
        then the gangs whose members have all joined dissolved (``dissolve_complete_gangs``; the
        new list is stored, so the next census starts anew)."""
        before, census = self.take(domain, stamp, index, available, now, instances)
        assert census.parts is not None  # take partitions its result
        dissolved = dissolve_complete_gangs(census.instances) if census.gangs else None
        if dissolved is None:
            return Refreshed(before, census.instances, census.parts, census.changed, census.joined, census)
        self.forget(domain)
        pairs = [(a, b) for a, b in zip(dissolved, before, strict=True) if a is not b]
        return Refreshed(before, dissolved, partition(dissolved), [a for a, b in pairs if a != b],
                         [a for a, b in pairs if a.state == "joined" and b.state != "joined"], census)

    def stored(self, domain: str, stamp: int) -> None:
        """The engine committed exactly the last census's changes of ``domain`` (nothing else):
        the store, now at ``stamp``, holds that census's objects."""
        kept = self._kept.get(domain)
        if kept is not None and kept.stamp is None:
            kept.held = stamp

    def forget(self, domain: str | None = None) -> None:
        """One domain's census (its instances were changed otherwise), or every domain's (the
        store's working set may be another engine's now)."""
        if domain is None:
            self._kept.clear()
        else:
            self._kept.pop(domain, None)
