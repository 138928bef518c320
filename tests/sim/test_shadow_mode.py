"""Shadow mode (``mode = "observe"``): a simulated hour under a bursty workload in which the
engine records every launch it would have made — with reasons — while the cloud sees no call."""

from __future__ import annotations

from epu.common.messages import DecisionRecord, LaunchRequest

from epu.sim.scenario import DomainSpec, Scenario, SiteSpec
from epu.sim.simulation import Simulation


def hour(mode: str) -> tuple[list[DecisionRecord], int, int]:
    sc = Scenario("shadow", "observe mode", hours=1.0, domain=DomainSpec(mode=mode),
                  sites=[SiteSpec("cloud-a", quota=30, price=0.05), SiteSpec("cloud-b", quota=40, price=0.12)])
    sim = Simulation(sc, 4)
    records: list[DecisionRecord] = []
    launches: list[LaunchRequest] = []

    def tap(msg: object, _sender: object) -> None:
        if isinstance(msg, DecisionRecord):
            records.append(msg)
        elif isinstance(msg, LaunchRequest):
            launches.append(msg)

    sim.bus.taps.append(tap)
    try:
        with sim.world.running():
            for p in sim.procs:
                p.start()
            sim.pipeline_changed()
            sim._schedule_workload()
            sim.world.run_until(sim.world.start + 3600.0)
    finally:
        sim.close()
    calls = sum(c.stats.creates for c in sim.clouds.values())
    return records, len(launches), calls


def test_an_hour_in_observe_mode_records_actions_and_the_cloud_sees_none() -> None:
    records, launches, creates = hour("observe")
    assert launches == 0 and creates == 0
    shadow = [r for r in records if r.shadow]
    assert shadow and all(r in shadow for r in records if r.actions)
    kinds = {a.kind for r in shadow for a in r.actions}
    assert "launch" in kinds
    assert all(a.reason for r in shadow for a in r.actions)
    assert any("observe mode:" in n for r in shadow for n in r.notes)


def test_the_same_hour_acting_launches() -> None:
    """The control: the same seed in ``act`` mode makes the launches the shadow only recorded."""
    records, launches, creates = hour("act")
    assert launches > 0 and creates > 0 and not any(r.shadow for r in records)


def test_status_marks_an_observing_domain_and_its_shadow_decision() -> None:
    from epu.services.decision.status import Board, render
    from epu.services.decision.statusfeed import build_status
    from rich.console import Console

    from tests.decision.helpers import config, jobs, make_engine, snapshot

    e, bus, clock = make_engine(cfg=config(domains={"d": {"max_nodes": 10, "sites": ["s1"], "mode": "observe"}}))
    e.on_snapshot(snapshot(queued=jobs(3)))
    (rec,) = e.iterate()
    assert rec.shadow and [a.kind for a in rec.actions] == ["launch"] * 3
    assert bus.of("instance.launch") == [] and e.store.instances("d") == [] and e.store.actions("d") == []
    board = Board()
    board.apply(build_status(e, "d", clock.now(), rec))
    console = Console(record=True, width=200)
    console.print(render(board))
    text = console.export_text()
    assert "OBSERVE" in text and "last decision (shadow)" in text
    assert board.as_json()[0]["last_decision"]["shadow"] is True
