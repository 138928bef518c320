"""The engine's fleet gauges from its own records (services/decision/fleet_metrics.py): instances by
domain, site, type and state, the oldest boot, spend from the catalogue's prices, launches and
retirements counted once, nothing for a domain the engine is not active for."""

from __future__ import annotations

import pytest
from epu.services.decision.fleet_metrics import FleetCollector, FleetObserver
from prometheus_client import CollectorRegistry

from epu.sim.decision_memstore import MemoryDecisionDatabase
from tests.decision.helpers import T0, config, event, jobs, make_engine, snapshot


@pytest.fixture(params=["sqlite", "memory"])
def engine(request):
    store = "sqlite://" if request.param == "sqlite" else MemoryDecisionDatabase()
    cfg = config(domains={"d": {"max_nodes": 10, "sites": ["s1", "s2"], "params": {"stall_seconds": 300}}})
    return make_engine(store, cfg)


def value(reg: CollectorRegistry, name: str, **labels: str) -> float | None:
    return reg.get_sample_value(name, labels)


def test_instances_spend_and_boot_age_follow_the_engines_records(engine) -> None:
    eng, bus, clock = engine
    reg = CollectorRegistry()
    fleet = FleetObserver(eng, clock.now, min_interval=0)
    reg.register(FleetCollector(fleet))
    eng.on_snapshot(snapshot(queued=jobs(3), at=clock.now()))
    fleet.recorded(eng.iterate())
    for launch in bus.of("instance.launch"):
        eng.handle_input(event(launch, "pending", 1, clock.now()))
    fleet.observe()
    assert value(reg, "epu_instances", domain="d", site="s1", type="default", state="pending") == 3
    assert value(reg, "epu_decision_launches_total", domain="d", site="s1", type="default") == 3
    assert value(reg, "epu_spend_rate_per_hour", domain="d", site="s1") == pytest.approx(0.6)
    assert value(reg, "epu_spend_rate_per_hour", domain="d", site="s2") == 0  # a site of the domain, idle
    assert value(reg, "epu_spend_total", domain="d", site="s1") == 0
    assert value(reg, "epu_decision_domain_paused", domain="d") == 0

    clock.advance(1800)  # half an hour at 0.6 per hour; the boots never finish
    assert eng.leadership("d") == "standby"  # the snapshot aged: still paid for, still exported
    fleet.observe()
    assert value(reg, "epu_spend_total", domain="d", site="s1") == pytest.approx(0.3)
    assert value(reg, "epu_instances_booting_oldest_seconds", domain="d", site="s1") == pytest.approx(1800, abs=1)

    for _ in range(7):  # snapshots again: past stall_seconds of healthy pipeline, given up and replaced
        clock.advance(60)
        eng.on_snapshot(snapshot(queued=jobs(3), at=clock.now()))
        fleet.recorded(eng.iterate())
        fleet.observe()
    fleet.observe()  # seen again: not counted again
    assert value(reg, "epu_instances_retired_total", domain="d", reason="stalled") == 3
    # the stalled ones wait for their terminate; their replacements go to s2 (s1 backs off)
    assert value(reg, "epu_instances", domain="d", site="s2", type="default", state="requested") == 3
    assert value(reg, "epu_decision_launches_total", domain="d", site="s2", type="default") == 3
    assert value(reg, "epu_decision_site_failures", site="s1") >= 1


def test_a_domain_the_engine_does_not_act_for_exports_no_fleet(engine) -> None:
    eng, _bus, clock = engine
    fleet = FleetObserver(eng, clock.now, min_interval=0)
    assert fleet.observe().instances == {}  # no snapshot yet: a standby
    eng.on_snapshot(snapshot(queued=jobs(2), at=T0))
    eng.iterate()
    assert sum(fleet.observe().instances.values()) == 2
    eng.forget_snapshots()  # the broker connection lost: another engine may take the domain
    sample = fleet.observe()
    assert sample.instances == {} and sample.spend_rate == {} and sample.paused == {}
    eng.on_snapshot(snapshot(queued=jobs(2), at=clock.now()))
    assert sum(fleet.observe().instances.values()) == 2
    eng.leadership = lambda _d: "fenced"  # another engine holds the lease now
    assert fleet.observe().instances == {}
