"""An iteration's plans stored in one transaction (``Engine.iterate`` → ``Store.commit_plans``),
one savepoint and one lease check per domain, on SQLite, PostgreSQL and the simulators' store.

What must hold, as with one transaction per domain: every command sent was durable first, under
the domain's lease; a domain whose write fails, or whose lease another engine took meanwhile,
stores nothing and sends nothing — and does not stop the other domains' plans; its plan is made
again at the next iteration."""

from __future__ import annotations

from typing import Any

from epu.common.clock import ManualClock
from epu.common.messages import Message
from epu.services.decision.engine import Engine
from epu.services.decision.lease import Leases
from epu.services.decision.lease import leases as lease_rows
from epu.services.decision.store import Store, actions
from sqlalchemy import insert, update
from sqlalchemy.exc import IntegrityError

from epu.sim.decision_memstore import MemoryDecisionDatabase, MemoryLeases, MemoryStore
from tests.decision.helpers import T0, Bus, config, jobs, snapshot

TTL = 10.0
DOMAINS = ("a", "b", "c")


class DurableBus(Bus):
    """A bus that checks, at each send, that the command is in the store already — read through
    a connection of its own, so it sees committed rows only (store-before-send)."""

    def __init__(self, store_url: str | MemoryDecisionDatabase) -> None:
        super().__init__()
        self.reader = None if isinstance(store_url, MemoryDecisionDatabase) else Store(store_url)

    def __call__(self, msg: Message) -> None:
        aid = getattr(msg, "launch_id", None) or getattr(msg, "command_id", None)
        if self.reader is not None and aid is not None:
            assert self.reader.action(aid) is not None, f"{msg.TYPE} {aid} sent before it was committed"
        super().__call__(msg)


def engine(store_url: str | MemoryDecisionDatabase, holder: str, clock: ManualClock) -> tuple[Engine, DurableBus]:
    cfg = config(domains={d: {"max_nodes": 3, "sites": ["s1", "s2"]} for d in DOMAINS},
                 sites={"s1": {"driver": "epu-sim", "quota": 20, "price_per_hour": 0.2},
                        "s2": {"driver": "epu-sim", "quota": 20, "price_per_hour": 0.1}})
    bus = DurableBus(store_url)
    if isinstance(store_url, MemoryDecisionDatabase):
        return Engine(cfg, MemoryStore(store_url), bus, clock,  # type: ignore[arg-type]
                      leases=MemoryLeases(store_url, holder, TTL)), bus
    store = Store(store_url).create()
    return Engine(cfg, store, bus, clock, leases=Leases(store.engine, holder, TTL).create()), bus


def feed(e: Engine, clock: ManualClock, n: int) -> None:
    for d in DOMAINS:
        e.on_snapshot(snapshot(d, queued=jobs(n, prefix=f"{d}-"), at=clock.now()))


def launched(bus: Bus) -> dict[str, int]:
    out = dict.fromkeys(DOMAINS, 0)
    for m in bus.of("instance.launch"):
        out[m.domain] += 1
    return out


def stored(store_url: str | MemoryDecisionDatabase, e: Engine) -> dict[str, int]:
    """Launches in the store, per domain, as a fresh handle reads them (not the engine's cache)."""
    fresh = MemoryStore(store_url) if isinstance(store_url, MemoryDecisionDatabase) else Store(store_url)
    out = dict.fromkeys(DOMAINS, 0)
    for row in fresh.actions(kind="launch"):
        out[row["domain"]] += 1
    return out


def test_a_domain_whose_write_fails_stores_and_sends_nothing_and_stops_no_other(store_url, monkeypatch) -> None:
    clock = ManualClock(T0)
    e, bus = engine(store_url, "A", clock)
    feed(e, clock, 2)
    store: Any = e.store
    real = store._insert_actions

    if isinstance(store_url, MemoryDecisionDatabase):
        check = store._new_actions

        def refused(plan: Any) -> None:
            # the memory store checks before it writes: b's action ids are refused (duplicates)
            if any(getattr(p.message, "domain", "") == "b" for p in plan.actions):
                raise IntegrityError("INSERT INTO decision_actions", None, Exception("duplicate"))
            check(plan)

        monkeypatch.setattr(store, "_new_actions", refused)
    else:
        def failing(conn: Any, domain: str, plan: Any, now: float) -> None:  # type: ignore[misc]
            real(conn, domain, plan, now)
            if domain == "b":  # after b's rows were written: the database refuses a duplicate key
                # (on PostgreSQL this aborts the transaction — but for the savepoint)
                p = plan.actions[0]
                conn.execute(insert(actions), [dict(action_id=p.action_id, domain="b", kind="launch",
                                                    target="x", type="t", body="{}", created_at=now)])

        monkeypatch.setattr(store, "_insert_actions", failing)
    e.iterate()
    assert launched(bus) == {"a": 2, "b": 0, "c": 2}
    assert stored(store_url, e) == {"a": 2, "b": 0, "c": 2}, "b's rows were rolled back, the others kept"
    assert {r.domain for r in bus.of("decision.record")} == {"a", "c"}
    assert e.store.in_flight("b") == set() and e.store.instances("b") == [], "b's working set untouched"
    assert e.store.memory("b")[1] == 0 and e.store.memory("a")[1] == 1

    monkeypatch.undo()  # the database takes b's rows again: b's plan is made anew and sent
    bus.clear()
    clock.advance(5)
    feed(e, clock, 2)
    e.iterate()
    assert launched(bus) == {"a": 0, "b": 2, "c": 0}
    assert stored(store_url, e) == {"a": 2, "b": 2, "c": 2}


def test_a_domain_fenced_mid_iteration_stores_and_sends_nothing(store_url) -> None:
    """A checked its leases at the start of the iteration; while it was deciding, B took domain
    b's. A's shared commit refuses b's plan (its savepoint), keeps a's and c's, sends those only."""
    clock = ManualClock(T0)
    a, bus_a = engine(store_url, "A", clock)
    b, bus_b = engine(store_url, "B", clock)
    feed(a, clock, 1)
    a.iterate()
    assert launched(bus_a) == {"a": 1, "b": 1, "c": 1}
    bus_a.clear()
    clock.advance(5)
    feed(a, clock, 3)
    decide = a.decide

    def taken_meanwhile(view: Any, cfg: Any) -> Any:
        if view.domain == "b":  # B takes the lease of b now (as if A's had run out)
            if isinstance(store_url, MemoryDecisionDatabase):
                store_url.leases["b"].expires_at = 0.0
            else:
                with b.store.engine.begin() as conn:  # type: ignore[attr-defined]
                    conn.execute(update(lease_rows).where(lease_rows.c.domain == "b").values(expires_at=0.0))
            assert b.leases is not None and b.leases.hold("b", clock.now())
        return decide(view, cfg)

    a.decide = taken_meanwhile  # type: ignore[method-assign]
    a.iterate()
    assert launched(bus_a) == {"a": 2, "b": 0, "c": 2}
    assert stored(store_url, a) == {"a": 3, "b": 1, "c": 3}
    assert {r.domain for r in bus_a.of("decision.record")} == {"a", "c"}
    assert a.leadership("b") == "fenced" and a.leadership("a") == "active"

    # B, now in charge of b, launches what b still needs (A's first launch is in the store)
    b.on_snapshot(snapshot("b", queued=jobs(3, prefix="b-"), at=clock.now()))
    b.iterate()
    assert launched(bus_b) == {"a": 0, "b": 2, "c": 0}
    assert stored(store_url, a) == {"a": 3, "b": 3, "c": 3}


def test_when_the_shared_transaction_fails_nothing_is_sent(store_url, monkeypatch) -> None:
    """The database refuses the transaction itself (its commit, a lost connection): no domain's
    plan was stored, so none is sent; the next iteration makes and sends them all."""
    from sqlalchemy.exc import OperationalError

    clock = ManualClock(T0)
    e, bus = engine(store_url, "A", clock)
    feed(e, clock, 2)

    def refused(writes: Any) -> Any:
        raise OperationalError("COMMIT", None, Exception("database is locked"))

    monkeypatch.setattr(e.store, "commit_plans", refused)
    e.iterate()
    assert launched(bus) == {"a": 0, "b": 0, "c": 0} and bus.of("decision.record") == []
    assert stored(store_url, e) == {"a": 0, "b": 0, "c": 0}
    monkeypatch.undo()
    clock.advance(5)
    feed(e, clock, 2)
    e.iterate()
    assert launched(bus) == {"a": 2, "b": 2, "c": 2}
