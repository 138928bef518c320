"""The engine's record of which job ran on which instance (``occupancy``, for ``epu cost``), on
SQLite, PostgreSQL and the simulator's memory store: opened, seen and closed by the snapshots the
engine admits, continued by a restarted engine, closed where last seen across a gap."""

from __future__ import annotations

from epu.common.messages import NodeInfo, SensorSnapshot
from epu.services.decision.occupancy import JobSpan

from tests.decision.helpers import config, event, jobs, make_engine, snapshot

OWNERS = {"j1": ["phys", "alice", "cpu"], "j2": ["chem", "bob", "cpu"]}


def _snap(at: float, on: dict[str, list[str]], names: dict[str, str], *, identity: bool = True,
          static: list[str] | None = None) -> SensorSnapshot:
    nodes = [NodeInfo(name=names[iid], state="busy" if js else "free", cores=2, cores_used=len(js), jobs=js,
                      instance_id=iid if identity else None) for iid, js in on.items()]
    nodes += [NodeInfo(name="static01", state="busy", cores=2, cores_used=1, jobs=static)] if static else []
    return SensorSnapshot(domain="d", backend="test", taken_at=at, nodes=nodes, owners=OWNERS)


def _two_instances(store_url):
    cfg = config(domains={"d": {"max_nodes": 4, "sites": ["s1"], "params": {"idle_seconds": 600}}},
                 active_window_seconds=180)
    e, bus, clock = make_engine(store_url, cfg)
    e.on_snapshot(snapshot(queued=jobs(2)))
    e.iterate()
    a, b = bus.of("instance.launch")
    for la in (a, b):
        e.on_instance_event(event(la, "started", 1, clock.now()))
    return e, clock, cfg, {a.launch_id: a.node_name, b.launch_id: b.node_name}, a.launch_id, b.launch_id


def _spans(e, since=0.0, until=float("inf")) -> list[tuple[str, str, float, float | None]]:
    return [(s.instance_id, s.job_id, s.start, s.end) for s in e.store.job_spans(since, until, "d")]


def test_snapshots_open_see_and_close_job_spans(store_url) -> None:
    e, clock, _cfg, names, a, b = _two_instances(store_url)
    t0 = clock.now()
    clock.advance(60)
    e.on_snapshot(_snap(clock.now(), {a: ["j1"], b: []}, names, static=["j9"]))
    clock.advance(60)
    e.on_snapshot(_snap(clock.now(), {a: ["j1", "j2"], b: ["j2"]}, names, identity=False))  # by node name
    clock.advance(60)
    e.on_snapshot(_snap(clock.now(), {a: ["j2"], b: []}, names))
    e.on_snapshot(_snap(clock.now() - 30, {a: [], b: []}, names))  # older than the one kept: nothing
    assert sorted(_spans(e)) == sorted([(a, "j1", t0 + 60, t0 + 180), (a, "j2", t0 + 120, None),
                                        (b, "j2", t0 + 120, t0 + 180)])  # the static node's job is no instance's
    (open_,) = e.store.open_jobs("d").values()
    assert (open_.job_id, open_.seen, open_.account, open_.user, open_.partition) == \
        ("j2", t0 + 180, "chem", "bob", "cpu")
    assert [s.job_id for s in e.store.job_spans(t0 + 185, t0 + 200, "d")] == ["j2"]  # open: still counts
    assert e.store.job_spans(t0, t0 + 60, "d") == []
    assert open_.until(horizon=180, now=t0 + 10_000) == t0 + 360  # a stopped engine: not for ever


def test_a_restarted_engine_continues_the_spans_and_a_gap_bills_no_job(store_url) -> None:
    e, clock, cfg, names, a, _b = _two_instances(store_url)
    t0 = clock.now()
    clock.advance(60)
    e.on_snapshot(_snap(t0 + 60, {a: ["j1", "j2"]}, names))
    clock.advance(60)
    e.on_snapshot(_snap(t0 + 120, {a: ["j1", "j2"]}, names))
    if hasattr(e.store, "engine"):
        e.store.engine.dispose()
    # the engine is down 20 minutes: j2 ended meanwhile, j1 still runs
    clock.advance(1200)
    e2, _bus, _ = make_engine(store_url, cfg, clock=clock)
    e2.on_snapshot(_snap(clock.now(), {a: ["j1"]}, names))
    assert sorted(_spans(e2)) == [(a, "j1", t0 + 60, None), (a, "j2", t0 + 60, t0 + 120)]  # closed where last seen
    clock.advance(60)
    e2.on_snapshot(_snap(clock.now(), {a: []}, names))
    assert sorted(_spans(e2)) == [(a, "j1", t0 + 60, clock.now()), (a, "j2", t0 + 60, t0 + 120)]


def test_a_span_opened_twice_is_closed_once_taken_up_again(store_url) -> None:
    """Two engines at a handover opened the same job's span: the one that reads them back keeps one."""
    e, clock, cfg, names, a, _b = _two_instances(store_url)
    t0 = clock.now()
    e.store.note_jobs("d", t0, [JobSpan("d", a, "j1", t0, t0), JobSpan("d", a, "j1", t0 + 1, t0 + 1)], [])
    e.job_spans.forget()  # read back from the store, as an engine taking the domain over
    clock.advance(60)
    e.on_snapshot(_snap(clock.now(), {a: ["j1"]}, names))
    assert [s for s in _spans(e) if s[3] is None] == [(a, "j1", t0, None)]


def test_a_snapshot_that_cannot_read_the_batch_system_changes_nothing(store_url) -> None:
    e, clock, _cfg, names, a, _b = _two_instances(store_url)
    clock.advance(60)
    e.on_snapshot(_snap(clock.now(), {a: ["j1"]}, names))
    clock.advance(60)
    e.on_snapshot(snapshot(at=clock.now(), available=False))
    assert [s[3] for s in _spans(e)] == [None]
