"""Durable engine state (``DecisionStore``) on SQLite, PostgreSQL and the simulator's in-memory store: the same scenarios on every back end."""

from __future__ import annotations

import pytest
from epu.common.messages import NodeCommandResult, PolicyChange
from epu.services.decision.placement import SiteHealth
from epu.services.decision.store import Store
from epu.services.decision.view import Instance

from epu.sim.decision_memstore import MemoryDecisionDatabase
from tests.decision.helpers import config, event, jobs, make_engine, node, open_store, snapshot


def test_state_survives_a_restart(store_url):
    cfg = config(domains={"d": {"max_nodes": 10, "sites": ["s1", "s2"],
                                "params": {"idle_seconds": 30}}})
    e, bus, clock = make_engine(store_url, cfg)
    e.on_policy_change(PolicyChange(change_id="c1", domain="d", max_nodes=8))
    e.on_snapshot(snapshot(queued=jobs(2)))
    e.iterate()
    a, b = bus.of("instance.launch")
    e.on_instance_event(event(a, "started", 1, clock.now()))
    e.on_instance_event(event(b, "failed", 1, clock.now(), error_kind="transient", reason="API timeout"))
    clock.advance(5)
    e.on_snapshot(snapshot(queued=jobs(2), at=clock.now()))
    e.iterate()
    (add,) = [c for c in bus.of("node.command") if c.action == "add"]
    e.on_node_result(NodeCommandResult(command_id=add.command_id, domain="d", action="add", node=add.node, ok=True))
    clock.advance(5)
    e.on_snapshot(snapshot(at=clock.now(), nodes=[node(a.node_name)]))
    e.iterate()
    idle_since = e.store.instance(a.launch_id).idle_since
    assert idle_since == clock.now()
    if hasattr(e.store, "engine"):
        e.store.engine.dispose()

    # a fresh engine on the same store sees everything the first one knew
    e2, bus2, _ = make_engine(store_url, cfg, clock=clock)
    version, current = e2.store.current_config("d")
    assert current.max_nodes == 8 and version == 2  # operator change kept over the file seed
    assert e2.store.instance(a.launch_id).idle_since == idle_since  # timer kept
    assert e2.store.site_health()["s1"].failures == 0  # b failed there, then a joined: reset
    assert e2.store.memory("d")[1] == 3  # iteration count
    assert e2.store.change_outcome("c1")["applied"]
    clock.advance(31)
    e2.on_snapshot(snapshot(at=clock.now(), nodes=[node(a.node_name)]))
    e2.iterate()
    # idle for 36 s since the first engine started the timer: offlined; no launch repeated
    assert [c.action for c in bus2.of("node.command")] == ["offline"]
    launches = [m for m in bus2.of("instance.launch")]
    assert all(m.launch_id not in (a.launch_id, b.launch_id) for m in launches)
    history = e2.store.config_history("d")
    assert [h["source"] for h in history] == ["file", "operator"]


def test_file_change_seeds_a_new_version(store_url):
    store = open_store(store_url)
    from epu.common.config.decision import DomainConfig

    assert store.seed_config("d", DomainConfig(max_nodes=3), 1.0) == 1
    assert store.seed_config("d", DomainConfig(max_nodes=3), 2.0) == 1
    assert store.seed_config("d", DomainConfig(max_nodes=4), 3.0) == 2
    store.save_sites([SiteHealth("s", failures=2, backoff_until=9.0, last_error="x", stalls=1)])
    assert store.site_health()["s"].stalls == 1


def test_store_from_an_earlier_version_gains_new_columns(sqlite_url):
    from sqlalchemy import text

    store = Store(sqlite_url).create()
    with store.engine.begin() as conn:
        conn.execute(text("ALTER TABLE decision_instances DROP COLUMN missing_since"))
    Store(sqlite_url).create()
    assert Store(sqlite_url).create().instances() == []
    with store.engine.connect() as conn:
        cols = [r[1] for r in conn.execute(text("PRAGMA table_info(decision_instances)"))]
    assert "missing_since" in cols


def test_a_change_recorded_twice_is_refused_whole(store_url):
    """A change id is a primary key: the second record fails and stores nothing (not even the
    config version it would have made), on every store."""
    from epu.common.config.decision import DomainConfig
    from sqlalchemy.exc import IntegrityError

    store = open_store(store_url)
    store.seed_config("d", DomainConfig(max_nodes=3), 1.0)
    assert store.record_change("c1", "d", True, "", 2.0, cfg=DomainConfig(max_nodes=5)) == 2
    with pytest.raises(IntegrityError):
        store.record_change("c1", "d", True, "", 3.0, cfg=DomainConfig(max_nodes=7))
    assert store.current_config("d")[0] == 2 and store.current_config("d")[1].max_nodes == 5
    assert [h["version"] for h in store.config_history("d")] == [1, 2]


def test_a_write_the_memory_database_refuses_changes_nothing():
    """The in-memory store's fault hook runs before a write touches anything (as a database
    refusing the first statement of a transaction): the simulator's store faults rely on it."""
    from epu.common.config.decision import DomainConfig
    from sqlalchemy.exc import OperationalError

    from epu.sim.decision_memstore import MemoryLeases, MemoryStore

    db = MemoryDecisionDatabase()
    store = MemoryStore(db)
    store.seed_config("d", DomainConfig(max_nodes=3), 1.0)
    leases = MemoryLeases(db, "A", 10.0)
    assert leases.hold("d", 1.0)
    generation = db.generation

    def refuse() -> None:
        raise OperationalError("UPDATE", None, Exception("simulated: database is locked"))

    db.before_write = refuse
    with pytest.raises(OperationalError):
        store.record_change("c1", "d", True, "", 2.0, cfg=DomainConfig(max_nodes=5))
    with pytest.raises(OperationalError):
        leases.hold("d", 5.0)
    assert store.current_config("d")[0] == 1 and store.change_outcome("c1") is None
    assert db.generation == generation and leases.row("d") == ("A", 1, 11.0)
    db.before_write = None
    assert store.record_change("c1", "d", True, "", 3.0, cfg=DomainConfig(max_nodes=5)) == 2


def test_updates_write_the_changed_columns_and_read_back_whole(store_url):
    """``save_instances`` writes only the columns that differ from the working set (one
    executemany per set of columns, SQL handed to the driver as compiled): what a fresh handle
    reads back is every instance as last saved — live, ended and unknown to the working set."""
    from dataclasses import replace

    from tests.decision.helpers import T0, inst

    s = open_store(store_url)
    base = [inst(f"i{k}", launched_at=T0 + k % 3, joined_at=T0, seen_at=T0) for k in range(6)]
    base.append(inst("gone", state="terminated", seen_at=T0, add_sent_at=T0))  # ended, node not removed
    s.save_instances(base)
    s.instances("d")  # the working set is loaded
    changed = [replace(base[0], idle_since=T0 + 5),  # one column
               replace(base[1], idle_since=T0 + 5),  # the same column: the same statement
               replace(base[2], missing_since=T0 + 6, idle_since=None, state_at=T0 + 6, reason="lost"),
               replace(base[3], terminate_sent=True, retire="scale-down"),  # a boolean and a string
               base[4],  # nothing changed: nothing written
               replace(base[6], removed=True)]  # ended: the working set holds it until removed
    s.save_instances(changed)
    fresh = Store(store_url) if not isinstance(store_url, MemoryDecisionDatabase) else open_store(store_url)
    got = {i.instance_id: i for i in fresh.instances("d", live_only=False)}
    want = {i.instance_id: i for i in base} | {i.instance_id: i for i in changed}
    assert got == want
    assert {i.instance_id: i for i in s.instances("d", live_only=False)} == want
    # ``known`` (an anti-entropy report's lookup) answers live, ended and unknown ids alike,
    # from a warm working set and from a fresh handle's database read.
    ids = [*want, "never-stored"]
    warm = Store(store_url) if not isinstance(store_url, MemoryDecisionDatabase) else open_store(store_url)
    warm.instances("d")
    for handle in (s, fresh, warm):
        known = handle.known(ids)
        assert {k: v for k, v in known.items() if v is not None} == want
        assert known.get("never-stored") is None


def _inst(iid: str, state: str, at: float, domain: str = "d") -> Instance:
    return Instance(iid, domain, "s1", f"n-{iid}", 2, state, at, at)


def test_a_second_handle_sees_the_other_handles_writes_after_sync(store_url):
    """Two engines on one store (an engine pair): each serves reads from its working set, and
    ``sync`` drops it when the other wrote — on every store, so the simulator's engine pairs
    see what production's see."""
    a, b = open_store(store_url), open_store(store_url)
    assert b.instances("d") == [] and b.terminating("d") == []
    stamp = b.domain_stamp("d")
    a.save_instances([_inst("i1", "requested", 1.0), _inst("i2", "terminating", 1.0)])
    b.sync()
    assert sorted(i.instance_id for i in b.instances("d")) == ["i1", "i2"]
    assert [i.instance_id for i in b.terminating("d")] == ["i2"]
    assert b.domain_stamp("d") != stamp
    assert {k: (v.seq, v.state) for k, v in b.known(["i1", "i9"]).items() if v} == {"i1": (-1, "requested")}
    again = b.domain_stamp("d")
    b.sync()
    assert b.domain_stamp("d") == again, "nothing stored since: the same stamp"
    b.invalidate()
    assert sorted(i.instance_id for i in b.instances("d")) == ["i1", "i2"], "reloaded from the store"


def test_a_fenced_write_stores_nothing(store_url):
    """A fence that refuses (the lease was lost) refuses the whole transaction: no instance row,
    no action, on every store — what keeps an engine that lost its lease from sending."""
    from epu.services.decision.lease import Fenced
    from epu.services.decision.planner import Plan

    store = open_store(store_url)

    def refuse(_conn) -> None:
        raise Fenced("lease taken")

    plan = Plan(instances={"i1": _inst("i1", "requested", 1.0)})
    with pytest.raises(Fenced):
        store.store_actions("d", plan, 1.0, fence=refuse)
    with pytest.raises(Fenced):
        store.commit_plan("d", plan, 1.0, {"k": 1}, 1, fence=refuse)
    assert store.instances("d") == [] and store.actions("d") == []
    store.invalidate()
    assert store.instances("d") == [] and store.memory("d")[1] == 0


def test_first_unanswered_is_when_overdue_turns(store_url):
    """``first_unanswered``: the creation time of the oldest sent, still open launch or terminate
    (the engine's ``next_deadlines`` counts ``pipeline_gap_seconds`` from it); ``overdue`` is
    that time against its cut-off, and an answer clears it."""
    e, bus, clock = make_engine(store_url, config(domains={"d": {"max_nodes": 4}}))
    assert e.store.first_unanswered("d") is None and not e.store.overdue("d", clock.now() + 1e6)
    e.on_snapshot(snapshot(queued=jobs(2)))
    sent_at = clock.now()
    e.iterate()
    launches = bus.of("instance.launch")
    assert launches
    assert e.store.first_unanswered("d") == sent_at
    assert e.store.overdue("d", sent_at + 1) and not e.store.overdue("d", sent_at)
    clock.advance(3)
    for launch in launches:
        e.on_instance_event(event(launch, "requested", 1, clock.now()))
    assert e.store.first_unanswered("d") is None and not e.store.overdue("d", clock.now() + 1e6)
