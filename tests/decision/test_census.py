"""The census (``census.refresh_census``, one pass per instance), its shorter pass on a new
snapshot when the instances did not change (``census.refresh_census_again``) and the engine's
keeper of it (``census.CensusKeeper``) must give exactly what the plain definitions give — each
instance's rules written plainly here (``refreshed_one``: the oracle), then partition, then the
circuit breaker's counts by looking each node up — on random instance tables and snapshots
(names with domains and upper case, nodes with and without identities, every state)."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

import pytest
from epu.common.messages import NodeInfo
from epu.services.decision.census import Census, CensusKeeper, refresh_census, refresh_census_again
from epu.services.decision.view import ACTIVE_STATES, Instance, NodeIndex, partition

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
    """The definitions, one after the other: the oracle's refresh, partition, the breaker's counts."""
    out = [refreshed_one(i, index, now) for i in insts]
    out = [b if a == b else a for a, b in zip(out, insts, strict=True)]  # unchanged: the same object
    # in service: a draining node leaving the batch system is what its drain asks for
    known = [i for i in out if i.state == "joined" and i.joined_at is not None and not i.removed
             and not i.terminate_sent]
    return Census(out, partition(out), [a for a, b in zip(out, insts, strict=True) if a is not b],
                  [a for a, b in zip(out, insts, strict=True) if a.state == "joined" and b.state != "joined"],
                  len(known), sum(1 for i in known if index.find(i) is None), any(i.gang for i in out))


def refreshed_one(inst: Instance, index: NodeIndex, now: float) -> Instance:
    """The census's rules for one instance, written plainly (``census`` module docstring)."""
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


@pytest.mark.parametrize("seed", range(60))
def test_the_shorter_pass_chained_over_snapshots_gives_the_census(seed: int) -> None:
    """Snapshot after snapshot, each shorter pass from the last one's result — the quiet
    instances (joined on a busy or an idle node, draining on a listed one) found by set
    differences of the snapshot's names — gives what the full census gives; mostly busy or idle
    nodes, node names shared by several instances, nodes with
    identities in some snapshots (no quiet set then)."""
    rnd = random.Random(seed)
    insts = table(rnd, 60)
    insts = [Instance(**{**_fields(i), "node_name": rnd.choice([i.node_name, f"n{rnd.randrange(60)}"])})
             if rnd.random() < 0.2 else i for i in insts]
    # few launches under way (one joining ends the chain: the full census takes over)
    insts = [Instance(**{**_fields(i), "state": "joined"}) if i.state in ACTIVE_STATES and rnd.random() < 0.95
             else i for i in insts]

    def nodes() -> NodeIndex:
        ix = snapshot_nodes(rnd, 60, ids=rnd.random() < 0.2)
        out = []
        for n in ix.by_name.values():
            r = rnd.random()
            if r < 0.6:
                n = NodeInfo(**{**n.model_dump(), "state": "busy"})
            elif r < 0.8:  # idle
                n = NodeInfo(**{**n.model_dump(), "state": "free", "jobs": [], "cores_used": 0})
            out.append(n)
        return NodeIndex(out)

    prev = refresh_census(insts, nodes(), T0 + 10, True)
    for got, full in _chained(prev, nodes, 6):
        if got is None:
            assert full.joined
            return
        if rnd.random() < 0.3:
            got.parts = None  # as the engine leaves it after the store reordered (partitioned when needed)


@pytest.mark.parametrize("seed", range(60))
def test_the_shorter_pass_chained_with_launches_waiting_and_nodes_down(seed: int) -> None:
    """The quiet classes of launches whose node is not in the snapshot yet (looked at again
    when their name shows) and of joined instances on down nodes (again when the node is no
    longer down): chained, with names showing up, nodes going down and coming back."""
    rnd = random.Random(seed)
    states = ["requested", "pending", "started", "joined", "joined", "joined"]
    insts = [Instance(f"i{i}", "d", "s1", rnd.choice([f"n{i}", f"n{i}", f"N{i}.x"]), 4, st, T0, T0,
                      joined_at=T0 if st == "joined" else None, seen_at=T0 if st == "joined" else None,
                      missing_since=rnd.choice([None, T0]) if st == "joined" else None,
                      terminate_sent=rnd.random() < 0.05)
             for i, st in ((i, rnd.choice(states)) for i in range(60))]
    pending = {f"n{i}" for i, x in enumerate(insts) if x.state != "joined"}

    def nodes() -> NodeIndex:
        out = []
        for i in range(60):
            name = f"n{i}"
            if name in pending:  # mostly still absent; else listed but not in service (no join)
                if rnd.random() < 0.8:
                    continue
                state = rnd.choice(["offline", "down", "unknown"])
            else:
                if rnd.random() < 0.1:
                    continue
                state = rnd.choice(["busy", "busy", "down", "down", "free"])
            used = 1 if state == "busy" else 0
            out.append(NodeInfo(name=name, state=state, cores=4, cores_used=used, jobs=["j"] if used else []))
        return NodeIndex(out)

    prev = refresh_census(insts, nodes(), T0 + 10, True)
    for got, full in _chained(prev, nodes, 8):
        assert got is not None and not full.joined


def _chained(prev: Census, nodes: Callable[[], NodeIndex], steps: int) -> Iterator[tuple[Census | None, Census]]:
    """Shorter passes snapshot after snapshot, each from the last one's result: (its result,
    the full census's), compared (``same``) before the caller looks; stops at a join (None).
    Each index is built, as the engine does on arrival, with the one before (``NodeIndex``'s
    ``before``: the busy names that left are kept) — mostly the one the last pass ran on, at
    times an older one or one it never saw (the plain set difference then), or none."""
    rnd = random.Random(len(prev.instances))
    seen: list[NodeIndex] = []
    for step in range(steps):
        index = nodes()
        r = rnd.random()
        before = (seen[-1] if seen and r < 0.7 else rnd.choice(seen) if seen and r < 0.8
                  else nodes() if r < 0.9 else None)
        index = NodeIndex(list(index.by_name.values()), before=before)
        seen.append(index)
        got = refresh_census_again(prev, index, T0 + 20 + step)
        full = refresh_census(prev.instances, index, T0 + 20 + step, True)
        if got is not None:
            same(got, full)
        yield got, full
        if got is None:
            return
        prev = got


def test_the_shorter_pass_declines_what_an_unavailable_snapshot_left_uncounted() -> None:
    rnd = random.Random(1)
    prev = refresh_census(table(rnd, 10), NodeIndex([]), T0, False)
    assert refresh_census_again(prev, NodeIndex([]), T0) is None


@pytest.mark.parametrize("seed", range(60))
def test_the_keeper_gives_the_census_of_its_inputs(seed: int) -> None:
    """``CensusKeeper.take`` over a run of snapshots (the same one again, one over the very node
    objects of the last one as a quiet cluster's are, or a new one) and instance tables (stored
    back after each census, told or not, in the store's order or another; or changed otherwise,
    with a new stamp) gives what the census of those inputs gives, each time."""
    rnd = random.Random(seed)
    keeper = CensusKeeper()
    insts, stamp = table(rnd, 40), 1
    if seed % 2:  # mostly quiet: joined (the shorter pass's sets), busy nodes
        insts = [Instance(**{**_fields(i), "state": "joined"}) if rnd.random() < 0.8 else i for i in insts]
    index, available = snapshot_nodes(rnd, 40, ids=seed % 3 == 0), True
    for step in range(16):
        r = rnd.random()
        if r < 0.3 and available:  # a snapshot over the same node objects
            index = NodeIndex(list(index.items), before=index)
        elif r < 0.6:
            index = NodeIndex(list(snapshot_nodes(rnd, 40, ids=seed % 3 == 0 and rnd.random() < 0.5).items),
                              before=index if rnd.random() < 0.8 else None)
            available = True
        elif r < 0.65:  # an unavailable snapshot (the engine indexes no node of it)
            index, available = NodeIndex([]), False
        # (else the same snapshot again)
        now = T0 + 10 * step
        want = refresh_census(insts, index, now, available)
        before, got = keeper.take("d", stamp, index, available, now, lambda insts=insts: list(insts))
        assert before == insts
        same(got, want)
        assert got.counted == want.counted
        result = list(got.instances)
        got.instances.clear(), got.parts[0].clear()  # the caller's copy: the keeper's stays as it was
        r = rnd.random()
        if (want.changed and r < 0.7) or r < 0.15:  # the census's changes stored (else a failed commit)
            insts, stamp = result, stamp + 1  # (the store keeps the objects written, as the engine's do)
            if rnd.random() < 0.3:  # the store lists written instances in its own order
                rnd.shuffle(insts)
            if rnd.random() < 0.5:
                keeper.stored("d", stamp)
        elif r < 0.25:  # changed otherwise (a plan's instances, another engine)
            insts, stamp = table(rnd, 40), stamp + 1
        if rnd.random() < 0.05:
            keeper.forget()


def _step_nodes(rnd: random.Random, names: list[str]) -> list[NodeInfo]:
    out = []
    for name in names:
        if rnd.random() < 0.15:
            continue
        state = rnd.choice(["free", "free", "busy", "busy", "offline", "down"])
        used = 1 if state == "busy" or (state == "offline" and rnd.random() < 0.5) else 0
        out.append(NodeInfo(name=name, state=state, cores=1, cores_used=used, jobs=["j"] if used else []))
    return out


@pytest.mark.parametrize("seed", range(10))
def test_the_engine_decides_the_same_with_and_without_its_memo(seed: int) -> None:
    """Two engines on the same inputs — instance rows, snapshots (often the same one again),
    node-command results, time — one with its census keeper (``Engine.census``, kept while
    ``Store.domain_stamp`` and the snapshot's node content are the same), one with it emptied
    before every iteration: every iteration sends the same commands and leaves the same table."""
    from epu.common.messages import NodeCommandResult

    from tests.decision.helpers import config, make_engine, snapshot

    rnd = random.Random(seed)
    cfg = config(domains={"d": {"max_nodes": 12, "sites": ["s1", "s2"],
                                "params": {"idle_seconds": 30, "stall_seconds": 300}}})
    seeded = [Instance(f"i{k}", "d", "s1" if k % 2 else "s2", f"n-i{k}", 1, rnd.choice(["joined", "pending", "started"]),
                       T0 - 500, T0 - 500, joined_at=T0 - 400 if k % 3 else None, add_sent_at=T0 - 450,
                       seen_at=T0 - 400) for k in range(10)]
    engines = []
    for memo in (True, False):
        engine, bus, clock = make_engine(cfg=cfg)
        engine.store.save_instances(seeded)
        engines.append((engine, bus, clock, memo))
    names = [i.node_name for i in seeded]
    snap = snapshot(nodes=_step_nodes(rnd, names), at=T0)
    for step in range(60):
        dt = rnd.choice([1, 5, 5, 20, 60])
        if rnd.random() < 0.3:
            snap = snapshot(nodes=_step_nodes(rnd, names), at=T0 + step * 100 + dt)
        answer = rnd.random() < 0.5
        deliver = rnd.random() < 0.5  # else the engine iterates on the snapshot it holds
        seen = []
        for engine, bus, clock, memo in engines:
            clock.advance(dt)
            if deliver:
                engine.on_snapshot(snap.model_copy(update={"taken_at": clock.now()}))  # a new object
            bus.clear()
            if not memo:  # keeper off: every iteration takes the census from nothing kept
                engine.census.forget()
                engine.events.forget()
            engine.iterate()
            # re-sends go out in action-id order, and ids are random: compare and answer sorted
            sent = sorted(bus.of("node.command"), key=lambda m: (m.action, m.instance_id))
            commands = [(m.action, m.instance_id) for m in sent]
            terminates = sorted(m.instance_id for m in bus.of("instance.terminate"))
            if answer:
                for m in sent:
                    engine.on_node_result(NodeCommandResult(command_id=m.command_id, domain="d", action=m.action,
                                                            node=m.node, ok=True))
            seen.append((commands, terminates, engine.store.instances("d")))
        assert seen[0] == seen[1], f"step {step}"


def test_the_stores_site_and_type_counts_follow_every_write() -> None:
    """``Store.live_per_site``/``live_per_type`` are kept current write by write (not recounted
    each iteration): after any sequence of writes they are what counting the live rows gives."""
    from epu.services.decision.store import count_per_site, count_per_type

    from tests.decision.helpers import open_store

    rnd = random.Random(3)
    store = open_store("sqlite://")
    store.live_per_site(), store.live_per_type()  # the counts exist from now on
    for _round in range(30):
        batch = [Instance(f"i{rnd.randrange(40)}", "d", rnd.choice(["s1", "s2", "s3"]), "n", 1,
                          rnd.choice([*STATES, "terminated", "failed"]), T0, T0,
                          instance_type=rnd.choice(["", "big"])) for _ in range(rnd.randint(1, 6))]
        store.save_instances({i.instance_id: i for i in batch}.values())
        live = store.instances()
        assert store.live_per_site() == count_per_site(live)
        assert store.live_per_type() == count_per_type(live)


_INDEX_PARTS = ("by_name", "by_id", "by_short", "busy_short", "idle_short", "down_short", "left_busy")


@pytest.mark.parametrize("seed", range(40))
def test_an_index_over_the_same_nodes_as_the_one_before_is_the_one_built_anew(seed: int) -> None:
    """``NodeIndex(nodes, before=...)`` over the very node objects of ``before`` (a quiet cluster's
    snapshots repeat them) takes ``before``'s look-ups over: the same as building them anew — each
    look-up in the same order, the name sets, nothing left busy, ``since``, ``free`` — and its
    own copies (changing them leaves ``before`` as it was); over other objects, or a list that
    differs by one node, it is built anew."""
    rnd = random.Random(seed)
    first = snapshot_nodes(rnd, 60, ids=seed % 3 == 0)
    if rnd.random() < 0.5:
        first.free  # noqa: B018  # listed (as the engine does on arrival) or not
    nodes = list(first.items)
    if seed % 4 == 1 and nodes:  # one node a new object (equal or not): not the same nodes
        k = rnd.randrange(len(nodes))
        nodes[k] = NodeInfo(**{**nodes[k].model_dump(), "state": rnd.choice(NODE_STATES)})
    got = NodeIndex(list(nodes), before=first)
    built = NodeIndex(list(nodes))  # anew (no ``before``: built in full), and its ``before`` part by definition
    if first.busy_short is not None and built.busy_short is not None:
        built.since, built.left_busy = first.serial, first.busy_short - built.busy_short
    for name in _INDEX_PARTS:
        assert getattr(got, name) == getattr(built, name), name
    assert [list(getattr(got, n).items()) for n in ("by_name", "by_id", "by_short")] == [
        list(getattr(built, n).items()) for n in ("by_name", "by_id", "by_short")]
    assert got.since == built.since and got.free == built.free and got.serial != first.serial
    longer = NodeIndex([*nodes, NodeInfo(name="zz-extra", state="free", cores=1)], before=first)
    assert len(longer) == len(nodes) + 1 and "zz-extra" in longer.by_short  # a longer list: built anew
    before = {n: dict(getattr(first, n)) for n in ("by_name", "by_id", "by_short")}
    got.by_name.clear(), got.by_short.clear(), got.free.clear()
    assert {n: dict(getattr(first, n)) for n in ("by_name", "by_id", "by_short")} == before


@pytest.mark.parametrize("seed", range(20))
def test_an_index_built_on_the_one_before_keeps_the_busy_names_that_left(seed: int) -> None:
    """``NodeIndex(nodes, before=...)``: ``left_busy`` is the set difference of the two indexes'
    busy short names, ``since`` names the one before; ``free`` is ``free_workers``' definition."""
    rnd = random.Random(seed)
    a, b = snapshot_nodes(rnd, 80, ids=False), snapshot_nodes(rnd, 80, ids=seed % 4 == 0)
    c = NodeIndex(list(b.by_name.values()), before=a)
    assert a.busy_short is not None
    if c.busy_short is None:  # nodes with identities: no quiet sets, nothing kept
        assert c.left_busy is None and c.since is None
    else:
        assert c.left_busy == a.busy_short - c.busy_short and c.since == a.serial != c.serial
    assert c.free == [n for n in c.by_name.values() if n.state == "free" and n.cores_used < n.cores]
    for ix in (a, c):  # the sets of names by node state (one pass) are their definitions
        if ix.busy_short is not None:
            items = ix.by_short.items()
            assert ix.busy_short == {k for k, n in items if n.state == "busy"}
            assert ix.idle_short == {k for k, n in items if n.state == "free" and not n.jobs and not n.cores_used}
            assert ix.down_short == {k for k, n in items if n.state == "down"}
    assert NodeIndex(list(b.by_name.values())).left_busy is None


@pytest.mark.parametrize("seed", range(12))
def test_the_jobs_question_answered_once_per_node_list_is_the_breakers_answer(seed: int) -> None:
    """The circuit breaker's snapshot-only question (``breaker.jobs_verdict``), taken over from the
    last snapshot when the new one lists the very same node objects with the same running-jobs
    count and availability (``Snapshots.admit``), is what asking it gives — over snapshots
    that repeat the node list, change one node, change ``running_jobs`` or go unavailable."""
    from epu.services.decision import breaker

    from tests.decision.helpers import config, make_engine, snapshot

    rnd = random.Random(seed)
    engine, _bus, clock = make_engine(cfg=config(domains={"d": {"max_nodes": 4, "sites": ["s1"]}}))
    share, ok = engine.settings.breaker_missing_share, engine.settings.breaker_ok_count
    nodes = [NodeInfo(name=f"n{k}", state="busy", cores=2, cores_used=1, jobs=[f"j{k}"]) for k in range(12)]
    taken = 0
    for step in range(40):
        r = rnd.random()
        if r < 0.2:  # a node changes (a new object)
            k = rnd.randrange(len(nodes))
            nodes[k] = NodeInfo(name=f"n{k}", state=rnd.choice(["busy", "free"]), cores=2,
                                cores_used=rnd.choice([0, 1]), jobs=rnd.choice([[], [f"j{k}"]]))
        elif r < 0.3:
            nodes = nodes[:-1] if len(nodes) > 2 else nodes
        snap = snapshot(nodes=nodes, at=clock.now() + step, available=rnd.random() > 0.1)
        snap = snap.model_copy(update={"running_jobs": 30 if rnd.random() < 0.7 else rnd.choice([0, 12, 100])})
        before = engine.snapshots.get("d")
        reuse = before is not None and before.jobs_verdict is not None
        engine.on_snapshot(snap)
        latest = engine.snapshots.latest["d"]
        if latest.jobs_verdict is not None:
            taken += reuse
            assert latest.jobs_verdict == breaker.jobs_verdict(snap, share=share, ok_count=ok)
        engine.health.breaker_check(refresh_census([], latest.nodes, clock.now(), snap.available), latest)
        assert latest.jobs_verdict in (None, breaker.jobs_verdict(snap, share=share, ok_count=ok))
    assert taken > 3


def test_draining_nodes_that_left_do_not_open_the_breaker_but_joined_ones_do() -> None:
    """htcondor-two-views, seed 85007: six draining HTCondor workers whose masters exited after a
    peaceful shutdown left the collector before their removes were answered; counted as lost,
    they opened the breaker, which then held the removes that would have confirmed them (eleven
    VMs at rest for ever). A draining node leaving is what its drain asks for."""
    from epu.services.decision import breaker

    from tests.decision.helpers import inst, snapshot

    def node(iid: str) -> NodeInfo:
        return NodeInfo(name=f"n-{iid}", state="free", cores=1)

    joined = [inst(f"j{k}", "joined", joined_at=0.0) for k in range(4)]
    draining = [inst(f"d{k}", "draining", joined_at=0.0, drain_at=1.0) for k in range(6)]
    listed = [node(i.instance_id) for i in joined]
    shown, snap = NodeIndex(listed), snapshot(nodes=listed)
    assert breaker.check([*joined, *draining], shown, snap, share=0.5, ok_count=2) == ""
    census = refresh_census([*joined, *draining], shown, 10.0, True)
    assert (census.known, census.missing) == (4, 0)
    # the same six absent while the engine holds them in service: a collector that lost them
    lost = [inst(f"d{k}", "joined", joined_at=0.0) for k in range(6)]
    assert breaker.check([*joined, *lost], shown, snap, share=0.5, ok_count=2) == \
        "6 of 10 joined nodes missing from the snapshot at once"
