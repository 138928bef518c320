"""The simulator's world as hostile as production (issue 26): per-process clocks and an untrusted
bus. Each check here can fail: the adversary's forgeries, let through, are caught by invariant 10;
a sensor clock skewed beyond the active window, with snapshots aged by it, starves the domain."""

from __future__ import annotations

import pytest
from epu.common.messages import InstanceEvent, SensorSnapshot

from epu.sim.adversary import AdversaryProc
from epu.sim.bus import Identities
from epu.sim.scenarios import get_scenario
from epu.sim.simulation import Simulation
from epu.sim.world import World, WorldClock


def test_a_world_clock_skews_drifts_and_steps_both_ways() -> None:
    world = World(1)
    clock = WorldClock(world)
    clock.offset = -300.0
    clock.set_drift(1e-4)
    world.t += 10_000.0
    assert clock.now() == pytest.approx(world.t - 300.0 + 1.0)
    clock.step(3600.0)
    assert clock.error() == pytest.approx(3301.0)
    clock.step(-3600.0)
    clock.set_drift(0.0)
    world.t += 10_000.0
    assert clock.error() == pytest.approx(-299.0), "a drift stopped keeps what it gained"
    assert clock.monotonic() == world.t, "monotonic time neither steps nor drifts"


def test_the_broker_refuses_what_a_user_may_not_publish() -> None:
    ids = Identities(["alpha", "intruder"])
    ev = "epu.events"
    assert ids.may_publish("epu-sensor-intruder", ev, "node.result.intruder")
    assert not ids.may_publish("epu-sensor-intruder", ev, "sensor.snapshot.alpha")
    assert not ids.may_publish("epu-sensor-intruder", ev, "instance.state.alpha.terminated")
    assert ids.may_publish("epu-provisioner", ev, "instance.state.alpha.terminated")
    assert ids.may_publish("epu-decision", "epu.commands", "provisioner.launch")
    assert not ids.may_publish("epu-operator", "epu.commands", "provisioner.launch")


def run(seed: int, bind: bool = True) -> tuple[Simulation, list]:
    sim = Simulation(get_scenario("untrusted-bus"), seed)
    sim.bus.bind_senders = bind
    return sim, sim.run().violations


def test_an_adversary_within_its_permissions_is_refused_and_nobody_acts_on_its_word() -> None:
    sim, violations = run(1)
    adv = sim.adversary  # type: ignore[attr-defined]
    assert adv.sent > 50 and adv.refused > 50, "it forged, and the broker refused what it may not publish"
    assert sim.bus.stats.refused_senders > 50, "consumers dead-lettered the forged results"
    assert violations == []


def test_invariant_8_catches_a_consumer_that_believes_the_body() -> None:
    """The code before issue 26: the engine took a result's domain from its body."""
    _sim, violations = run(1, bind=False)
    eight = [v for v in violations if v.invariant == 10]
    assert eight and "node.result of alpha sent by epu-sensor-intruder" in eight[0].detail


def test_forged_state_is_refused_at_the_broker() -> None:
    sim = Simulation(get_scenario("untrusted-bus"), 2)
    sim.bus.identities = Identities([sim.domain, "intruder"])
    adv = AdversaryProc(sim.world, sim.bus, "intruder", sim.domain)
    with pytest.raises(PermissionError):
        sim.bus.publish(adv, InstanceEvent(instance_id="i-1", domain=sim.domain, site="cloud-a", state="terminated",
                                           seq=9, at=0.0))
    with pytest.raises(PermissionError):
        sim.bus.publish(adv, SensorSnapshot(domain=sim.domain, backend="simulated", taken_at=0.0))


def test_per_process_clocks_do_not_freeze_a_domain() -> None:
    """Seed 4 of process-clocks froze the domain when snapshots were aged by the head node's clock
    (invariant 5: 210 jobs queued at the end with no node); now no snapshot is discarded as stale."""
    sim = Simulation(get_scenario("process-clocks"), 4)
    result = sim.run()
    assert result.violations == []
    assert max(abs(p.clock.error()) for p in sim.procs) > 1.0, "the clocks were off"
    assert sum(e.stale_snapshots for e in sim.engines) == 0


def test_invariant_8_catches_an_engine_that_takes_any_result_for_its_command(monkeypatch: pytest.MonkeyPatch) -> None:
    """The adversary also answers the victim's commands in its own name (a message it may send):
    an engine that took any result with the right command id for the answer completes alpha's
    commands on the intruder's word — which the engine's own check (domain and action) refuses."""
    from epu.services.decision.engine import Engine

    original = Engine.on_node_result

    def unguarded(self: Engine, res: object) -> None:
        row = self.store.action(res.command_id)  # type: ignore[attr-defined]
        if row is not None:
            res = res.model_copy(update={"domain": row["domain"]})  # type: ignore[attr-defined]
        original(self, res)  # type: ignore[arg-type]

    monkeypatch.setattr(Engine, "on_node_result", unguarded)
    _sim, violations = run(1)
    assert any("completed alpha's" in v.detail for v in violations if v.invariant == 10), violations[:3]
