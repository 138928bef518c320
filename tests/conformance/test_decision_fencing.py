"""One brain per domain: a lease with an epoch in the shared store, checked by every commit of a
plan (services/decision/lease.py), on SQLite, PostgreSQL and the simulator's store. Two engines share one store;
the one that lost the lease cannot commit, hence cannot send — even with a fresh cached
snapshot. Also: anti-entropy from the provisioner's instance reports, and the ceilings every
policy change is checked against."""

from __future__ import annotations

import pytest
from epu.common.clock import ManualClock
from epu.common.messages import InstanceEvent, InstanceReport, PolicyChange
from epu.services.decision.engine import Engine
from epu.services.decision.lease import Fenced, Leases
from epu.services.decision.store import Store

from epu.sim.decision_memstore import MemoryDecisionDatabase, MemoryLeases, MemoryStore
from tests.decision.helpers import T0, Bus, config, jobs, snapshot

TTL = 10.0


def engine(store_url: str | MemoryDecisionDatabase, holder: str, clock: ManualClock, cfg=None) -> tuple[Engine, Bus]:
    bus = Bus()
    if isinstance(store_url, MemoryDecisionDatabase):
        mem = MemoryStore(store_url)
        return Engine(cfg or config(), mem, bus, clock, leases=MemoryLeases(store_url, holder, TTL)), bus  # type: ignore[arg-type]
    store = Store(store_url).create()
    leases = Leases(store.engine, holder, TTL).create()
    return Engine(cfg or config(), store, bus, clock, leases=leases), bus


def launches(bus: Bus) -> list[str]:
    return [m.launch_id for m in bus.of("instance.launch")]


def test_the_engine_that_lost_the_lease_cannot_commit_or_send(store_url: str) -> None:
    clock = ManualClock(T0)
    a, bus_a = engine(store_url, "A", clock)
    b, bus_b = engine(store_url, "B", clock)
    # both see the domain (A was active; B has just been handed the snapshot queue)
    a.on_snapshot(snapshot(queued=jobs(3), at=clock.now()))
    b.on_snapshot(snapshot(queued=jobs(3), at=clock.now()))
    a.iterate()
    b.iterate()
    assert len(launches(bus_a)) == 3 and launches(bus_b) == []
    assert (a.leadership("d"), b.leadership("d")) == ("active", "standby")

    # A stalls (a long GC, a hung disk) past its lease; B, still fed, takes the domain: epoch 2
    clock.advance(TTL + 1)
    b.on_snapshot(snapshot(queued=jobs(5), at=clock.now()))
    b.iterate()
    assert b.leadership("d") == "active" and b.leases.held["d"].epoch == 2
    assert len(set(launches(bus_b))) == 2, "B launched only the difference (A's three are in the store)"
    # A wakes with its cached snapshot — still fresh — and more demand: fenced, nothing stored or sent
    a.on_snapshot(snapshot(queued=jobs(9), at=clock.now()))
    bus_a.clear()
    a.iterate()
    assert launches(bus_a) == [] and bus_a.of("decision.record") == []
    assert a.leadership("d") == "fenced"
    assert len(a.store.actions(kind="launch")) == 5, "only B's plan was committed"

    # B stops cleanly (releases); A, fed again, takes the domain with a new epoch
    b.leases.release()
    a.on_snapshot(snapshot(queued=jobs(5), at=clock.now()))
    a.iterate()
    assert a.leadership("d") == "active" and a.leases.held["d"].epoch == 3


def test_a_commit_racing_a_takeover_is_refused(store_url: str) -> None:
    """The check is in the plan's own transaction: A passed its lease check at the start of the
    iteration, B took the lease before A committed — A's commit fails as a whole."""
    clock = ManualClock(T0)
    a, bus_a = engine(store_url, "A", clock)
    b, _ = engine(store_url, "B", clock)
    a.on_snapshot(snapshot(queued=jobs(2), at=clock.now()))
    assert a.acting("d", clock.now())
    clock.advance(TTL + 1)  # A's lease ran out between its check and its commit...
    assert b.leases.hold("d", clock.now())  # ...and B took it
    with pytest.raises(Fenced, match="taken by another engine"):
        a.iterate_domain("d", clock.now())
    assert a.store.actions() == [] and launches(bus_a) == []


def test_losing_the_broker_connection_drops_snapshots_and_releases_the_lease(store_url: str) -> None:
    clock = ManualClock(T0)
    a, _ = engine(store_url, "A", clock)
    b, bus_b = engine(store_url, "B", clock)
    a.on_snapshot(snapshot(queued=jobs(1), at=clock.now()))
    a.iterate()
    a.forget_snapshots()  # the runtime's on_connection_lost hook
    assert a.leadership("d") == "standby" and not a.is_active("d")
    b.on_snapshot(snapshot(queued=jobs(2), at=clock.now()))
    b.iterate()  # no need to wait for A's lease to run out
    assert b.leadership("d") == "active" and len(launches(bus_b)) == 1


def test_instance_reports_repair_the_table_forward_only(store_url: str) -> None:
    clock = ManualClock(T0)
    a, bus = engine(store_url, "A", clock)
    a.on_snapshot(snapshot(queued=jobs(2), at=clock.now()))
    a.iterate()
    first, second = launches(bus)
    ev = dict(domain="d", site="s1", node_name="n", cores=1, at=clock.now())
    a.on_instance_event(InstanceEvent(instance_id=first, state="pending", seq=2, **ev))
    # the "started" of the first and everything about the second were lost; a foreign one appears
    report = InstanceReport(domain="d", as_of=clock.now(), instances=[
        InstanceEvent(instance_id=first, state="started", seq=3, ip="10.0.0.1", **ev),
        InstanceEvent(instance_id=second, state="terminated", seq=4, **ev),
        InstanceEvent(instance_id="adopted-1", state="started", seq=3, ip="10.0.0.9", **ev),
        InstanceEvent(instance_id=first, state="requested", seq=1, **ev),  # stale: ignored
    ])
    assert a.on_instance_report(report) == 3
    got = {i: a.store.instance(i) for i in (first, second, "adopted-1")}
    assert got[first].state == "started" and got[first].ip == "10.0.0.1"
    assert got[second].state == "terminated"
    assert got["adopted-1"].state == "started"
    assert a.on_instance_report(report) == 0, "a repeated report changes nothing"
    assert a.store.site_health() == {} or not any(h.failures for h in a.store.site_health().values())


def test_policy_changes_are_held_to_ceilings_from_the_configuration() -> None:
    clock = ManualClock(T0)
    cfg = config(domains={"d": {"max_nodes": 4, "sites": ["s1", "s2"]},
                          "capped": {"max_nodes": 2, "max_nodes_ceiling": 6, "sites": ["s1"]}})
    store = Store("sqlite://").create()
    e = Engine(cfg, store, Bus(), clock)
    huge = e.on_policy_change(PolicyChange(change_id="x", domain="d", min_nodes=1_000_000, max_nodes=1_000_000))
    assert not huge.applied and "ceiling 10" in huge.reason  # quotas 5 + 5
    assert e.on_policy_change(PolicyChange(change_id="y", domain="d", max_nodes=10)).applied
    assert not e.on_policy_change(PolicyChange(change_id="z", domain="d", sites=["s1"])).applied, \
        "dropping a site lowers the ceiling below max_nodes 10"
    assert not e.on_policy_change(PolicyChange(change_id="c1", domain="capped", max_nodes=7)).applied
    assert e.on_policy_change(PolicyChange(change_id="c2", domain="capped", max_nodes=6)).applied


def leases(store_url: str | MemoryDecisionDatabase, holder: str) -> Leases | MemoryLeases:
    """A ``DecisionLeases`` of ``holder`` on the shared store."""
    if isinstance(store_url, MemoryDecisionDatabase):
        return MemoryLeases(store_url, holder, TTL)
    return Leases(Store(store_url).create().engine, holder, TTL).create()


def test_renewing_many_leases_at_once_renews_only_those_still_held(store_url) -> None:
    """``renew_many`` (one transaction per iteration for every domain held): it extends
    exactly the leases this engine still holds — same holder, same epoch — and leaves a lease
    another engine took to ``hold``, which then reports it lost (fenced)."""
    a, b = leases(store_url, "A"), leases(store_url, "B")
    assert a.hold("d1", T0) and a.hold("d2", T0)
    assert a.renew_many(["d1", "d2"], T0 + 5) == {"d1", "d2"}
    assert a.row("d1")[2] == a.row("d2")[2] == T0 + 5 + TTL
    assert b.hold("d2", T0 + 5 + TTL + 1)  # A's lease on d2 ran out: B takes it (a new epoch)
    assert a.renew_many(["d1", "d2", "d3"], T0 + 5 + TTL + 1) == {"d1"}  # d3: never held, not taken here
    assert a.row("d3") is None
    assert a.row("d2")[0] == "B" and a.row("d1") == ("A", 1, T0 + 6 + 2 * TTL)
    assert not a.hold("d2", T0 + 5 + TTL + 1) and a.state("d2", True) == "fenced"
    assert a.renew_many([], T0) == set()
