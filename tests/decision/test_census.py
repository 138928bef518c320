"""The engine's one pass per instance (``view.refresh_census``) and its shorter pass on a new
snapshot when the instances did not change (``refresh_census_again``): both must give exactly
what the plain definitions give — refresh, then partition, then the circuit breaker's counts by
looking each node up — on random instance tables and snapshots (names with domains and upper
case, nodes with and without identities, every state)."""

from __future__ import annotations

import random

import pytest
from epu.common.messages import NodeInfo
from epu.services.decision.view import (
    ACTIVE_STATES,
    Census,
    Instance,
    NodeIndex,
    partition,
    refresh_census,
    refresh_census_again,
)

T0 = 1_700_000_000.0
STATES = ["requested", "pending", "started", "joined", "draining", "terminating"]
NODE_STATES = ["free", "busy", "offline", "down", "unknown"]


def table(rnd: random.Random, n: int) -> list[Instance]:
    out = []
    for i in range(n):
        state = rnd.choice(STATES)
        out.append(Instance(
            f"i{i}", "d", "s1", rnd.choice([f"n{i}", f"N{i}.example.org", f"n{i}.cluster"]), 4, state, T0, T0,
            joined_at=rnd.choice([None, T0]), idle_since=rnd.choice([None, T0]),
            missing_since=rnd.choice([None, T0]), seen_at=rnd.choice([None, T0]),
            removed=rnd.random() < 0.1, terminate_sent=rnd.random() < 0.1,
            retire=rnd.choice(["", "", "", "scale-down"]), gang=rnd.choice(["", "", "", "g1:2"])))
    return out


def snapshot_nodes(rnd: random.Random, n: int, ids: bool) -> NodeIndex:
    nodes = []
    for i in range(n):
        if rnd.random() < 0.2:
            continue  # absent
        state = rnd.choice(NODE_STATES)
        jobs = ["j"] if rnd.random() < 0.4 else []
        nodes.append(NodeInfo(name=rnd.choice([f"n{i}", f"n{i}.example.org"]), state=state, cores=4,
                              cores_used=rnd.choice([0, 0, 2]), jobs=jobs,
                              instance_id=f"i{i}" if ids and rnd.random() < 0.5 else None))
    return NodeIndex(nodes)


def expected(insts: list[Instance], index: NodeIndex, now: float) -> Census:
    """The definitions, one after the other (what the engine did before the census)."""
    out = refresh_census(insts, index, now, True).instances  # refresh itself is checked below
    known = [i for i in out if i.state in ("joined", "draining") and i.joined_at is not None and not i.removed
             and not i.terminate_sent]
    return Census(out, partition(out), [a for a, b in zip(out, insts, strict=True) if a is not b],
                  [a for a, b in zip(out, insts, strict=True) if a.state == "joined" and b.state != "joined"],
                  len(known), sum(1 for i in known if index.find(i) is None), any(i.gang for i in out))


def refreshed_one(inst: Instance, index: NodeIndex, now: float) -> Instance:
    """``refresh``'s rules for one instance, written plainly (docs of ``view.refresh_parts``)."""
    node = index.find(inst)
    if node is not None and inst.seen_at is None:
        inst = Instance(**{**_fields(inst), "seen_at": now})
    if inst.state == "joined":
        idle = node is not None and node.state == "free" and not node.jobs and not node.cores_used
        if idle != (inst.idle_since is not None):
            inst = Instance(**{**_fields(inst), "idle_since": now if idle else None})
        lost = node is None or node.state == "down"
        if lost != (inst.missing_since is not None):
            inst = Instance(**{**_fields(inst), "missing_since": now if lost else None})
    elif (inst.state in ("requested", "pending", "started") and node is not None and node.state in ("free", "busy")
          and not inst.terminate_sent and not inst.retire):
        idle = node.state == "free" and not node.jobs and not node.cores_used
        inst = Instance(**{**_fields(inst), "state": "joined", "state_at": now, "joined_at": now,
                           "idle_since": now if idle else None})
    return inst


def _fields(inst: Instance) -> dict:
    return {f: getattr(inst, f) for f in Instance.__dataclass_fields__}


def same(a: Census, b: Census) -> None:
    assert a.instances == b.instances
    assert a.parts == b.parts
    assert a.changed == b.changed and a.joined == b.joined
    assert (a.known, a.missing, a.gangs) == (b.known, b.missing, b.gangs)


@pytest.mark.parametrize("seed", range(40))
def test_the_census_is_refresh_then_partition_then_the_breakers_counts(seed: int) -> None:
    rnd = random.Random(seed)
    insts = table(rnd, 60)
    index = snapshot_nodes(rnd, 60, ids=seed % 2 == 0)
    got = refresh_census(insts, index, T0 + 10, True)
    assert got.instances == [refreshed_one(i, index, T0 + 10) for i in insts]
    assert all(a is b for a, b in zip(got.instances, insts, strict=True) if a == b)  # unchanged: the same object
    same(got, expected(insts, index, T0 + 10))
    again = refresh_census(got.instances, index, T0 + 20, True)
    if not got.joined:  # a fixed point, whatever the time (what the engine's memo relies on)
        assert again.changed == [] and again.instances == got.instances
    assert all(i.state not in ACTIVE_STATES or i in got.parts[0] or i.retire or i.terminate_sent
               for i in got.instances)


@pytest.mark.parametrize("seed", range(60))
def test_the_shorter_pass_on_a_new_snapshot_gives_the_census(seed: int) -> None:
    rnd = random.Random(seed)
    first = snapshot_nodes(rnd, 60, ids=seed % 3 == 0)
    prev = refresh_census(table(rnd, 60), first, T0 + 10, True)
    later = snapshot_nodes(rnd, 60, ids=seed % 3 == 0)
    got = refresh_census_again(prev, later, T0 + 20)
    full = refresh_census(prev.instances, later, T0 + 20, True)
    if got is None:  # only when an instance joins (its part changes)
        assert full.joined
        return
    assert not full.joined
    same(got, full)


def test_the_shorter_pass_declines_what_an_unavailable_snapshot_left_uncounted() -> None:
    rnd = random.Random(1)
    prev = refresh_census(table(rnd, 10), NodeIndex([]), T0, False)
    assert refresh_census_again(prev, NodeIndex([]), T0) is None
