"""Deciding by shapes: the engine and the five policies with instance-type catalogues.

Table-driven over the pure policies (a view with a ``Catalogue``), and end to end through the
engine (the LaunchRequest carries the type, the decision record shows it, a limit-blocked job
holds no node, a legacy single-type config is untouched)."""

from __future__ import annotations

import re

import pytest
from epu.common.messages import JobShape, NodeInfo, SensorSnapshot
from epu.services.decision.actions import Launch, Node, Terminate
from epu.services.decision.packing import Offer
from epu.services.decision.policies import PolicyError, get_policy, validate_params
from epu.services.decision.shaped import Catalogue, build_catalogue, uses_catalogue
from epu.services.decision.view import DomainView, JobDigest

from tests.decision.helpers import T0, config, event, inst, make_engine

CPU = Offer("ec2", "c4", 4, 8000, 0, frozenset(), frozenset({"cpu"}), 0.2, False, 10)
BIG = Offer("ec2", "r16", 16, 512_000, 0, frozenset({"bigmem"}), frozenset({"bigmem"}), 1.5, False, 10)
GPU = Offer("ec2", "g8", 8, 60_000, 1, frozenset({"gpu"}), frozenset({"gpu"}), 3.0, False, 10)


def cat(*offers: Offer, default: str = "cpu") -> Catalogue:
    offers = offers or (CPU, BIG, GPU)
    return Catalogue(tuple(offers), {"ec2": 100}, default, {(o.site, o.type): o for o in offers})


def shape(count: int, cores: int = 1, *, memory: int = 0, gpus: int = 0, partition: str = "cpu",
          features: tuple[str, ...] = (), nodes: int = 1, demand: bool = True, reason: str = "Resources") -> JobShape:
    return JobShape(count=count, cores=cores, memory_mb=memory, gpus=gpus, partition=partition,
                    features=list(features), nodes=nodes, demand=demand, reason=reason)


def sview(shapes: list[JobShape], *, nodes: list[NodeInfo] = (), instances=(), catalogue: Catalogue | None = None,
          max_nodes: int = 100, min_nodes: int = 0, memory: dict | None = None) -> DomainView:
    v = DomainView("d", T0, True, JobDigest.of_shapes(shapes), {n.name: n for n in nodes}, list(instances),
                   min_nodes, max_nodes, 1, dict(memory or {}))
    v.catalogue = catalogue or cat()
    return v


def free(name: str, cores: int = 4, memory: int = 8000, partitions: tuple[str, ...] = ("cpu",), used: int = 0,
         features: tuple[str, ...] = ()) -> NodeInfo:
    return NodeInfo(name=name, state="free" if not used else "busy", cores=cores, cores_used=used,
                    jobs=["x"] if used else [], memory_mb=memory, partitions=list(partitions), features=list(features))


def decide(policy: str, v: DomainView, **params):
    return get_policy(policy).decide(v, validate_params(policy, params), v.now)


def launched(decision) -> list[str]:
    return sorted(a.instance_type for a in decision.actions if isinstance(a, Launch))


def offlined(decision) -> list[str]:
    return sorted(a.instance_id for a in decision.actions if isinstance(a, Node) and a.op == "offline")


# --------------------------------------------------------------------------- queue-demand


@pytest.mark.parametrize(("shapes", "expected"), [
    ([shape(8)], ["c4", "c4"]),                                          # 8 x 1c on 4-core types
    ([shape(1, 4, memory=400_000, partition="bigmem", features=("bigmem",))], ["r16"]),
    ([shape(2, 1, gpus=1, partition="gpu")], ["g8", "g8"]),              # one GPU per g8: one job each
    ([shape(3, 2, partition="cpu", nodes=2)], ["c4", "c4", "c4"]),       # 3 jobs x 2 nodes x 2c: 12 chunks of 2c
    ([shape(5, demand=False, reason="QOSMaxJobsPerUserLimit")], []),     # limit-blocked: never launched for
    ([shape(1, 64)], []),                                                # unsatisfiable: no type has 64 cores
    ([shape(1, partition="nope")], []),                                  # no type serves the partition
])
def test_queue_demand_launches_the_cheapest_fitting_types(shapes, expected) -> None:
    assert launched(decide("queue-demand", sview(shapes))) == expected


def test_an_unsatisfiable_job_is_named_in_the_notes_with_its_constraint() -> None:
    d = decide("queue-demand", sview([shape(1, 64), shape(1, memory=900_000, partition="bigmem",
                                                          features=("bigmem",))]))
    text = "\n".join(d.notes)
    assert "unsatisfiable (cores): 1 x 64c" in text and "unsatisfiable (memory)" in text
    assert launched(d) == []


def test_a_free_node_absorbs_demand_and_more_supply_never_launches_more() -> None:
    shapes = [shape(6)]
    without = launched(decide("queue-demand", sview(shapes)))
    with_node = launched(decide("queue-demand", sview(shapes, nodes=[free("static-1")])))
    assert without == ["c4", "c4"] and with_node == ["c4"]


def test_a_pending_instance_of_a_type_is_supply_of_that_type() -> None:
    pending = inst("p1", "pending", site="ec2", cores=16, instance_type="r16")
    d = decide("queue-demand", sview([shape(1, 4, memory=400_000, partition="bigmem", features=("bigmem",))],
                                     instances=[pending]))
    assert launched(d) == []


def test_idle_node_drained_when_pending_jobs_fit_without_it_and_kept_when_they_need_it() -> None:
    a = inst("a", "joined", site="ec2", cores=4, idle_since=T0 - 100, instance_type="c4")
    b = inst("b", "joined", site="ec2", cores=4, idle_since=T0 - 100, instance_type="c4")
    nodes = [free("n-a"), free("n-b")]
    # 3 x 1c pending: one node holds them, the other is drained
    d = decide("queue-demand", sview([shape(3)], nodes=nodes, instances=[a, b]))
    assert launched(d) == [] and len(offlined(d)) == 1
    # a job only a bigmem node could run (and a limit-blocked one) pins neither cpu node
    d = decide("queue-demand", sview([shape(1, 4, memory=400_000, partition="bigmem", features=("bigmem",)),
                                      shape(9, demand=False, reason="AssocGrpCpuLimit")], nodes=nodes, instances=[a, b]))
    assert launched(d) == ["r16"] and offlined(d) == ["a", "b"]
    # an unsatisfiable job never blocks scale-down
    d = decide("queue-demand", sview([shape(2, 64)], nodes=nodes, instances=[a, b]))
    assert launched(d) == [] and offlined(d) == ["a", "b"]


def test_a_drained_node_the_demand_needs_is_put_back_online_instead_of_launching() -> None:
    a = inst("a", "draining", site="ec2", cores=4, instance_type="c4", retire="scale-down", drain_at=T0 - 10,
             seen_at=T0 - 100, joined_at=T0 - 100)
    offline = NodeInfo(name="n-a", state="offline", cores=4, memory_mb=8000, partitions=["cpu"])
    d = decide("queue-demand", sview([shape(2)], nodes=[offline], instances=[a]))
    assert launched(d) == []
    assert [(x.op, x.instance_id) for x in d.actions if isinstance(x, Node)] == [("online", "a")]


def test_max_nodes_caps_the_plan() -> None:
    d = decide("queue-demand", sview([shape(40)], max_nodes=3))
    assert launched(d) == ["c4", "c4", "c4"]


# --------------------------------------------------------------------------- the other policies


def test_threshold_counts_only_satisfiable_jobs_and_launches_their_types() -> None:
    shapes = [shape(4, gpus=1, partition="gpu"), shape(50, 64), shape(20, demand=False, reason="JobHeldUser")]
    v = sview(shapes, memory={"above_since": T0 - 100})
    d = decide("threshold", v, waiting_jobs_threshold=0, waiting_jobs_time_s=0, jobs_per_vm=4)
    assert launched(d) == ["g8"]  # ceil(4 / 4): the 50 unsatisfiable and 20 held jobs do not count


def test_threshold_drains_idle_nodes_only_unsatisfiable_jobs_wait_for() -> None:
    a = inst("a", "joined", site="ec2", cores=4, idle_since=T0 - 7200, instance_type="c4")
    d = decide("threshold", sview([shape(5, 64)], nodes=[free("n-a")], instances=[a]), idle_for_time_s=3600)
    assert offlined(d) == ["a"] and launched(d) == []


def test_spare_keeps_spares_of_the_cheapest_fitting_type() -> None:
    d = decide("spare", sview([shape(4, memory=100_000, partition="bigmem", features=("bigmem",))]), spare_nodes=1)
    # the queue: 4 x (1c, 100 GB) on r16 (512 GB: 5 per instance) -> 1; the spare: the cheapest type
    # that holds the pending shape -> r16
    assert launched(d) == ["r16", "r16"]


def test_load_bootstraps_with_the_plans_type() -> None:
    d = decide("load", sview([shape(1, 2, gpus=1, partition="gpu")]))
    assert launched(d) == ["g8"]


def test_load_never_bootstraps_for_unsatisfiable_jobs() -> None:
    assert launched(decide("load", sview([shape(3, 64)]))) == []


def test_fixed_keeps_its_count_with_the_cheapest_type_that_fits() -> None:
    assert launched(decide("fixed", sview([], min_nodes=0), nodes=2)) == ["c4", "c4"]
    d = decide("fixed", sview([shape(1, 8, partition="gpu", gpus=1)]), nodes=1)
    assert launched(d) == ["g8"]


def test_start_time_by_shapes_launches_typed_and_only_for_satisfiable_jobs() -> None:
    st = {"experimental": True, "boot_seconds": 180, "margin_seconds": 0}
    big = shape(1, 4, memory=400_000, partition="bigmem", features=("bigmem",))
    d = decide("start-time", sview([big, shape(1, 64), shape(3, demand=False, reason="QOSMaxJobsPerUserLimit")]),
               **st)
    assert launched(d) == ["r16"]  # the bigmem job's type; nothing for the 64-core or the blocked jobs
    # a busy cpu node whose job ends in 30 s starts a 1-core job sooner than a new node (180 s)
    busy = free("n1", used=4).model_copy(update={"job_ends": [T0 + 30]})
    assert launched(decide("start-time", sview([shape(1)], nodes=[busy]), **st)) == []
    # ... one ending in an hour does not
    later = busy.model_copy(update={"job_ends": [T0 + 3600]})
    assert launched(decide("start-time", sview([shape(1)], nodes=[later]), **st)) == ["c4"]


def test_start_time_by_shapes_drains_only_what_the_pending_jobs_would_not_use() -> None:
    st = {"experimental": True, "idle_seconds": 0, "keep_seconds": 1}
    idle = [inst(f"i{k}", site="ec2", cores=4, instance_type="c4", idle_since=T0 - 100) for k in range(2)]
    nodes = [free(f"n-i{k}") for k in range(2)]
    d = decide("start-time", sview([shape(1)], nodes=nodes, instances=idle), **st)
    assert len(offlined(d)) == 1 and launched(d) == []  # one node holds the job, the other goes
    d = decide("start-time", sview([], nodes=nodes, instances=idle), **st)
    assert offlined(d) == ["i0", "i1"]


# --------------------------------------------------------------------------- the engine

SITES = {"ec2": {"driver": "epu-sim", "quota": 20, "types": {
    "c4": {"size": "sim.c4", "cores": 4, "memory_mb": 8000, "price_per_hour": 0.2},
    "r16": {"size": "sim.r16", "cores": 16, "memory_mb": 512000, "features": ["bigmem"], "price_per_hour": 1.5},
}}}
DOMAIN = {"d": {"max_nodes": 10, "sites": ["ec2"], "default_partition": "cpu",
                "partitions": {"cpu": ["c4"], "bigmem": ["r16"]}}}


def snap(shapes: list[JobShape], nodes: list[NodeInfo] = (), at: float = T0) -> SensorSnapshot:
    return SensorSnapshot(domain="d", backend="test", taken_at=at, shapes=shapes, nodes=list(nodes))


def test_uses_catalogue_only_with_types_or_partitions() -> None:
    legacy = config()
    assert not uses_catalogue(legacy.domains["d"], legacy.sites)
    typed = config(DOMAIN, SITES)
    assert uses_catalogue(typed.domains["d"], typed.sites)


def test_the_engine_launches_typed_instances_and_records_the_type() -> None:
    e, bus, clock = make_engine(cfg=config(DOMAIN, SITES))
    e.on_snapshot(snap([shape(5), shape(1, 8, memory=300_000, partition="bigmem", features=("bigmem",)),
                        shape(7, demand=False, reason="QOSMaxJobsPerUserLimit")]))
    (rec,) = e.iterate()
    launches = bus.of("instance.launch")
    assert sorted((m.instance_type, m.cores) for m in launches) == [("c4", 4), ("c4", 4), ("r16", 16)]
    assert sorted(a.instance_type for a in rec.actions) == ["c4", "c4", "r16"]
    assert {i.instance_type for i in e.store.instances("d")} == {"c4", "r16"}
    # the next iteration counts them as supply of their type: nothing more
    bus.clear()
    clock.advance(5)
    e.on_snapshot(snap([shape(5), shape(1, 8, memory=300_000, partition="bigmem", features=("bigmem",))],
                       at=clock.now()))
    e.iterate()
    assert bus.of("instance.launch") == []


def test_the_engine_scales_to_zero_with_a_limit_blocked_job_pending() -> None:
    e, bus, clock = make_engine(cfg=config(DOMAIN, SITES))
    e.on_snapshot(snap([shape(1)]))
    e.iterate()
    (launch,) = bus.of("instance.launch")
    e.on_instance_event(event(launch, "pending", 1, clock.now()))
    e.on_instance_event(event(launch, "started", 2, clock.now()))
    blocked = shape(3, demand=False, reason="QOSMaxJobsPerUserLimit")
    idle = NodeInfo(name=launch.node_name, state="free", cores=4, memory_mb=8000, partitions=["cpu"],
                    instance_id=launch.launch_id)
    bus.clear()
    for _ in range(3):
        clock.advance(5)
        e.on_snapshot(snap([blocked], [idle], at=clock.now()))
        e.iterate()
    offs = [c for c in bus.of("node.command") if c.action == "offline"]
    assert [c.node for c in offs] == [launch.node_name]
    assert bus.of("instance.launch") == []


def test_build_catalogue_rooms_count_live_instances_per_type_and_site() -> None:
    cfg = config(DOMAIN, SITES)
    from epu.common.config.catalogue import site_types

    c = build_catalogue(site_types("ec2", cfg.sites["ec2"]), cfg.domains["d"], {"ec2": 20}, {"ec2": 7},
                        {("ec2", "c4"): 5}, excluded=frozenset({("ec2", "r16")}))
    rooms = {o.type: o.room for o in c.offers}
    assert rooms == {"c4": 15, "r16": 0} and c.site_room == {"ec2": 13}
    assert c.known[("ec2", "r16")].cores == 16


# --------------------------------------------------------------------------- unsatisfiable, reported once


@pytest.mark.parametrize(("bad", "constraint"), [
    (shape(2, 64), "cores"),
    (shape(1, 4, memory=900_000, partition="bigmem", features=("bigmem",)), "memory"),
    (shape(1, partition="gpu"), "partition"),
    (shape(1, features=("infiniband",)), "feature"),
])
def test_unsatisfiable_jobs_are_reported_once_per_shape_and_never_launched_for(bad, constraint, caplog) -> None:
    e, bus, clock = make_engine(cfg=config(DOMAIN, SITES))
    caplog.set_level("WARNING", logger="epu.decision")
    records = []
    for _ in range(3):
        clock.advance(5)
        e.on_snapshot(snap([bad], at=clock.now()))
        records += e.iterate()
    assert bus.of("instance.launch") == []
    (rec,) = records  # the report is one event (a record without actions), not one per iteration
    assert rec.actions == [] and [u.constraint for u in rec.saw.unsatisfiable] == [constraint]
    assert rec.saw.unsatisfiable[0].count == bad.count and any("unsatisfiable" in n for n in rec.notes)
    logged = [r for r in caplog.records if r.getMessage().startswith("unsatisfiable jobs")]
    assert len(logged) == 1 and logged[0].constraint == constraint
    assert [(u.constraint, u.count) for u in e.unsatisfiable["d"]] == [(constraint, bad.count)]
    # gone, then back: reported again
    clock.advance(5)
    e.on_snapshot(snap([], at=clock.now()))
    e.iterate()
    assert e.unsatisfiable["d"] == []
    clock.advance(5)
    e.on_snapshot(snap([bad], at=clock.now()))
    assert len(e.iterate()) == 1


def test_status_shows_unsatisfiable_jobs_and_instances_by_type() -> None:
    from epu.services.decision.status import Board, render
    from rich.console import Console

    e, bus, clock = make_engine(cfg=config(DOMAIN, SITES))
    e.on_snapshot(snap([shape(2, 64), shape(3)]))
    e.iterate()
    clock.advance(5)
    e.on_snapshot(snap([shape(2, 64), shape(8)], at=clock.now()))
    (rec,) = e.iterate()  # one more c4 for the 5 more jobs; the record saw the first c4
    assert rec.saw.instances_by_type == {"c4": 1}
    board = Board("d")
    for m in bus.sent:
        board.apply(m)
    (st,) = board.as_json()
    assert [(u["count"], u["constraint"]) for u in st["unsatisfiable"]] == [(2, "cores")]
    console = Console(record=True, width=160)
    console.print(render(board))
    text = console.export_text()
    assert "unsatisfiable" in text and "2 x 64c @cpu (cores)" in text and "c4=1" in text


# --------------------------------------------------------------------------- capacity errors, spot

STOCK = {
    "ec2": {"driver": "epu-sim", "quota": 20, "types": {
        "c4": {"size": "sim.c4", "cores": 4, "memory_mb": 8000, "price_per_hour": 0.2},
        "c4-spot": {"size": "sim.c4", "cores": 4, "memory_mb": 8000, "price_per_hour": 0.06, "spot": True},
    }},
    "os": {"driver": "epu-sim", "quota": 20, "types": {
        "m4": {"size": "m1.large", "cores": 4, "memory_mb": 8000, "price_per_hour": 0.3},
        "m4-spot": {"size": "m1.large", "cores": 4, "memory_mb": 8000, "price_per_hour": 0.08, "spot": True},
    }},
}


def stock_engine(allow_spot: bool, **decision):
    domain = {"d": {"max_nodes": 10, "sites": ["ec2", "os"], "allow_spot": allow_spot}}
    return make_engine(cfg=config(domain, STOCK, **decision))


def capacity_failure(e, launch, clock) -> None:
    e.on_instance_event(event(launch, "failed", 2, clock.now(), error_kind="capacity",
                              reason="capacity: InsufficientInstanceCapacity"))


def step_launches(e, bus, clock, shapes) -> list:
    bus.clear()
    clock.advance(5)
    e.on_snapshot(snap(shapes, at=clock.now()))
    e.iterate()
    return bus.of("instance.launch")


def test_a_capacity_error_cools_the_offering_down_and_fails_over_to_the_next_cheapest() -> None:
    e, bus, clock = stock_engine(False)
    (first,) = step_launches(e, bus, clock, [shape(1, 4)])
    assert (first.site, first.instance_type) == ("ec2", "c4")
    capacity_failure(e, first, clock)
    (second,) = step_launches(e, bus, clock, [shape(1, 4)])  # the very next iteration, no waiting
    assert (second.site, second.instance_type) == ("os", "m4")
    assert e.store.site_health().get("ec2") is None or e.store.site_health()["ec2"].failures == 0  # not the site
    capacity_failure(e, second, clock)
    assert step_launches(e, bus, clock, [shape(1, 4)]) == []  # every offering cooling down: nothing to try
    clock.advance(180)
    (third,) = step_launches(e, bus, clock, [shape(1, 4)])  # the cooldown is over: the cheapest again
    assert (third.site, third.instance_type) == ("ec2", "c4")


def test_the_cooldown_is_configurable() -> None:
    e, bus, clock = stock_engine(False, capacity_cooldown_seconds=20)
    (first,) = step_launches(e, bus, clock, [shape(1, 4)])
    capacity_failure(e, first, clock)
    (second,) = step_launches(e, bus, clock, [shape(1, 4)])
    assert second.instance_type == "m4"
    capacity_failure(e, second, clock)
    clock.advance(20)
    assert step_launches(e, bus, clock, [shape(1, 4)])[0].instance_type == "c4"


def test_spot_falls_back_to_on_demand_after_n_capacity_errors_and_returns_later() -> None:
    e, bus, clock = stock_engine(True, spot_fallback_failures=2, spot_fallback_seconds=300)
    (a,) = step_launches(e, bus, clock, [shape(1, 4)])
    assert a.instance_type == "c4-spot"
    capacity_failure(e, a, clock)
    (b,) = step_launches(e, bus, clock, [shape(1, 4)])
    assert b.instance_type == "m4-spot"  # the other spot offering: one failure is not yet a fallback
    capacity_failure(e, b, clock)
    clock.advance(200)  # both spot offerings are back from their cooldown, but 2 errors in a row
    (c,) = step_launches(e, bus, clock, [shape(1, 4)])
    assert c.instance_type == "c4"  # on-demand
    clock.advance(300)
    step = step_launches(e, bus, clock, [shape(2, 4)])  # one more job: spot is tried again
    assert [m.instance_type for m in step if m.launch_id != c.launch_id] == ["c4-spot"]  # (c: re-sent)


def test_a_started_spot_instance_ends_the_run_of_errors() -> None:
    e, bus, clock = stock_engine(True, spot_fallback_failures=2)
    (a,) = step_launches(e, bus, clock, [shape(1, 4)])
    capacity_failure(e, a, clock)
    (b,) = step_launches(e, bus, clock, [shape(1, 4)])
    e.on_instance_event(event(b, "pending", 1, clock.now()))
    e.on_instance_event(event(b, "started", 2, clock.now()))
    assert "d" not in e.spot_failures


# --------------------------------------------------------------------------- gangs


def test_a_multi_node_job_is_launched_as_one_group_recorded_in_the_decision() -> None:
    e, bus, clock = make_engine(cfg=config(DOMAIN, SITES))
    e.on_snapshot(snap([shape(1, 4, nodes=3), shape(2)]))
    (rec,) = e.iterate()
    gangs = {a.gang for a in rec.actions if a.kind == "launch"}
    [gang] = [g for g in gangs if g]
    assert gang.endswith(":3") and sum(1 for a in rec.actions if a.gang == gang) == 3
    assert {i.gang for i in e.store.instances("d") if i.gang} == {gang}


def gang_view(members, **kw) -> DomainView:
    return sview([shape(1, 4, nodes=3)], instances=members, **kw)


def test_an_incomplete_gang_is_released_whole_and_re_placed() -> None:
    g = "abc:3"
    joined = [inst(f"j{k}", "joined", site="ec2", cores=4, instance_type="c4", gang=g, idle_since=T0 - 50,
                   joined_at=T0 - 50, launched_at=T0 - 200) for k in range(2)]
    nodes = [free(f"n-j{k}") for k in range(2)]
    # the third member failed (gone from the live instances): release both, launch the job anew
    d = decide("queue-demand", gang_view(joined, nodes=nodes))
    released = [(a.op, a.instance_id, a.retire) for a in d.actions if isinstance(a, Node)]
    assert released == [("offline", "j0", "gang"), ("offline", "j1", "gang")]
    assert launched(d) == ["c4", "c4", "c4"]
    assert {a.gang for a in d.actions if isinstance(a, Launch)} == {"g0:3"}


def test_a_gang_not_complete_by_the_deadline_is_released() -> None:
    g = "abc:3"
    members = [inst("j0", "joined", site="ec2", cores=4, instance_type="c4", gang=g, joined_at=T0 - 500,
                    launched_at=T0 - 700, idle_since=T0 - 500),
               inst("p1", "pending", site="ec2", cores=4, instance_type="c4", gang=g, launched_at=T0 - 100),
               inst("p2", "pending", site="ec2", cores=4, instance_type="c4", gang=g, launched_at=T0 - 100)]
    d = decide("queue-demand", gang_view(members, nodes=[free("n-j0")]), stall_seconds=600)
    acts = sorted((a.kind, a.instance_id) for a in d.actions if not isinstance(a, Launch))
    assert acts == [("offline", "j0"), ("terminate", "p1"), ("terminate", "p2")]
    # within the deadline nothing is released
    d = decide("queue-demand", gang_view(members, nodes=[free("n-j0")]), stall_seconds=900)
    assert [a for a in d.actions if not isinstance(a, Launch)] == [] and launched(d) == []


def test_the_gang_deadline_is_its_own_setting() -> None:
    g = "abc:3"
    members = [inst("j0", "joined", site="ec2", cores=4, instance_type="c4", gang=g, joined_at=T0 - 100,
                    launched_at=T0 - 200, idle_since=T0 - 100),
               inst("p1", "pending", site="ec2", cores=4, instance_type="c4", gang=g, launched_at=T0 - 200),
               inst("p2", "pending", site="ec2", cores=4, instance_type="c4", gang=g, launched_at=T0 - 200)]
    # 200 s after launch: within stall_seconds (600), past a 120 s gang deadline: the group goes
    d = decide("queue-demand", gang_view(members, nodes=[free("n-j0")]), gang_deadline_seconds=120)
    acts = sorted((a.kind, a.instance_id) for a in d.actions if not isinstance(a, Launch))
    assert acts == [("offline", "j0"), ("terminate", "p1"), ("terminate", "p2")]
    assert launched(d) == ["c4", "c4", "c4"]
    d = decide("queue-demand", gang_view(members, nodes=[free("n-j0")]), gang_deadline_seconds=300)
    assert [a for a in d.actions if not isinstance(a, Launch)] == []
    for policy in ("threshold", "spare", "load", "fixed", "start-time"):  # every policy's cycle reads it
        extra = {"experimental": True} if policy == "start-time" else {}
        d = decide(policy, gang_view(members, nodes=[free("n-j0")]), gang_deadline_seconds=120, **extra)
        assert {a.instance_id for a in d.actions if isinstance(a, Terminate)} == {"p1", "p2"}, policy


@pytest.mark.parametrize(("params", "error"), [
    ({"gang_deadline_seconds": 0}, "queue-demand.gang_deadline_seconds: Input should be greater than 0"),
    ({"gang_deadline_seconds": 900}, "queue-demand.gang_deadline_seconds: 900 is above stall_seconds (600)"),
    ({"gang_deadline_seconds": 900, "stall_seconds": 300}, "above stall_seconds (300)"),
])
def test_a_bad_gang_deadline_is_refused_naming_the_key(params, error) -> None:
    with pytest.raises(PolicyError, match=re.escape(error)):
        validate_params("queue-demand", params)
    assert validate_params("queue-demand", {"gang_deadline_seconds": 900, "stall_seconds": 1200}).gang_deadline == 900
    assert validate_params("queue-demand", {}).gang_deadline == 600


def test_a_complete_gang_is_dissolved_so_a_later_drain_releases_nothing() -> None:
    from epu.services.decision.view import dissolve_complete_gangs

    g = "abc:2"
    members = [inst(f"j{k}", "joined", site="ec2", cores=4, gang=g) for k in range(2)]
    assert dissolve_complete_gangs([members[0], inst("p", "pending", gang=g)]) is None
    done = dissolve_complete_gangs(members)
    assert done is not None and {i.gang for i in done} == {""}


def test_a_gang_only_partly_placed_is_the_group_of_what_was_launched() -> None:
    # a 3-node job; the site is on probation (one unproven launch at a time): one launch goes out
    from epu.services.decision.placement import SiteHealth

    e, bus, clock = make_engine(cfg=config(DOMAIN, SITES))
    e.store.save_sites([SiteHealth("ec2", failures=1, backoff_until=0.0)])
    e.on_snapshot(snap([shape(1, 4, nodes=3)]))
    (rec,) = e.iterate()
    assert [(a.kind, a.gang) for a in rec.actions] == [("launch", "")]  # a group of one is no group
    assert [i.gang for i in e.store.instances("d")] == [""]
