"""Each invariant can fail: a planted bug per invariant, and the checker must catch it.

(A checker that never fires proves nothing; these keep it honest.)"""

from __future__ import annotations

from collections.abc import Callable

from epu.common.messages import PolicyChange, new_id

from epu.sim import faults as F
from epu.sim.processes import open_decision_store
from epu.sim.scenario import Scenario, SiteSpec, Timing
from epu.sim.simulation import Simulation


def run(setup: Callable[[Simulation], None] | None = None, seed: int = 1, **kw) -> set[int]:
    sc = Scenario("planted", "a planted bug", hours=kw.pop("hours", 2.0), setup=setup, **kw)
    r = Simulation(sc, seed).run()
    return {v.invariant for v in r.violations}


def at(sim: Simulation, seconds: float, fn: Callable[[], None]) -> None:
    sim.world.at(sim.world.start + seconds, fn, "planted bug")


def test_fault_free_planted_nothing() -> None:
    assert run() == set()


def test_2_a_provisioner_destroying_a_known_live_node() -> None:
    def setup(sim: Simulation) -> None:
        def strike() -> None:
            for vm in sim.clouds["cloud-a"].live_vms():
                if not sim.batch.jobs_on_vm(vm):
                    sim.clouds["cloud-a"].destroy("prov-1", vm.cloud_id)
                    return

        at(sim, 4000, strike)

    assert 2 in run(setup)


def test_2_a_destroy_without_a_proof_recorded() -> None:
    """The one door to destroy records each call's proof before making it (issue 33); a
    provisioner whose destroys leave no record breaks invariant 2 at its first destroy."""

    def setup(sim: Simulation) -> None:
        def strike() -> None:
            store = sim.provisioners[0].store
            if store is not None:
                store.record_destroy = lambda _d: None  # type: ignore[method-assign]

        at(sim, 600, strike)

    assert 2 in run(setup)


def test_3_two_vms_for_one_launch() -> None:
    def setup(sim: Simulation) -> None:
        def strike() -> None:
            vm = sim.clouds["cloud-a"].live_vms()[0]
            sim.clouds["cloud-a"].create("prov-1", vm.name, dict(vm.tags), token=None)

        at(sim, 4000, strike)

    assert 3 in run(setup)


def test_4_a_standby_that_acts() -> None:
    def setup(sim: Simulation) -> None:
        standby = sim.engines[1]

        def strike() -> None:  # the standby gets a snapshot behind the broker's back and ignores fencing
            snap = sim.sensor.core.last_snapshot if sim.sensor.core else None
            if snap is not None and standby.engine is not None:
                standby.engine.leases = None
                standby.engine.handle_input(snap.model_copy(update={"taken_at": sim.world.t}))
                standby.engine.iterate()

        for t in range(3600, 6000, 60):
            at(sim, t, strike)

    assert 4 in run(setup, engines=2)


def test_5_an_orphan_vm_nobody_knows() -> None:
    def setup(sim: Simulation) -> None:
        at(sim, sim.scenario.hours * 3600 + 600, lambda: sim.clouds["cloud-a"].create(
            "prov-1", "alpha-stray", {"epu-domain": "alpha", "epu-launch-id": "stray"}, token=None))

    assert 5 in run(setup)


def test_6_an_engine_that_cannot_see_our_outage() -> None:
    """With the outage detection effectively off, a long provisioner outage is blamed on the site."""
    sc_kw = dict(hours=3.0, timing=Timing(), sites=[SiteSpec("cloud-a", boot_seconds=(60.0, 120.0))],
                 faults=[F.crashes("provisioner", 1.5, (900.0, 1500.0), mid_step=0.0)])
    found = set()
    for seed in (1, 2, 3):
        sc = Scenario("planted", "engine blind to outages", **sc_kw)
        sim = Simulation(sc, seed)
        blind = sim.config.model_copy(update={"decision": sim.config.decision.model_copy(
            update={"pipeline_gap_seconds": 1e9})})
        for e in sim.engines:  # the engines only: the checker keeps the deployment's resolution
            e.config = blind
        found |= {v.invariant for v in sim.run().violations}
    assert 6 in found


def test_7_a_pause_undone_behind_the_operators_back() -> None:
    def setup(sim: Simulation) -> None:
        at(sim, 1800, lambda: sim.operator.send(PolicyChange(change_id=new_id(), domain="alpha", paused=True)))

        def undo() -> None:  # a store edit that drops the pause (what a file re-seed used to do)
            store = open_decision_store(sim.decision_db)
            _, cfg = store.current_config("alpha")
            store.put_config("alpha", cfg.model_copy(update={"paused": False}), source="file", now=sim.world.t)
            for e in sim.engines:
                if e.engine is not None:
                    e.engine.store.invalidate()

        at(sim, 1900, undo)

    assert 7 in run(setup)
