"""The simulated slurmctld's power saving (epu/sim/power.py) answers as Slurm does: a job on a
powered-down CLOUD node powers it up and waits for it, ResumeRate paces the calls, ResumeTimeout
puts the node DOWN and requeues the job, SuspendTime powers idle nodes down, a give-back is
POWER_DOWN_FORCE of a node powering up only."""

from __future__ import annotations

from epu.common.messages import SlurmPower

from epu.sim.batch import SimBatchSystem
from epu.sim.cloud import VM
from epu.sim.power import DOWN, DOWN_PENDING, FAILED, UP, UP_PENDING, PowerSpec, SlurmPowerSaving
from epu.sim.world import World, WorldClock

TAG = "epu-launch-id"


def world(slots: int = 4, **spec: float) -> tuple[World, SimBatchSystem, SlurmPowerSaving, list[SlurmPower]]:
    w = World(7)
    batch = SimBatchSystem(w, WorldClock(w), register_seconds=(1.0, 1.0))
    calls: list[SlurmPower] = []

    def publish(msg: SlurmPower) -> bool:
        calls.append(msg)
        return True

    power = SlurmPowerSaving(batch, PowerSpec(slots=[f"c{i}" for i in range(1, slots + 1)], **spec), "alpha",
                             publish, lambda _n: 4)
    batch.power = power
    return w, batch, power, calls


def boot(w: World, batch: SimBatchSystem, name: str, launch_id: str = "L1") -> VM:
    vm = VM(cloud_id=f"i-{name}", name=name, tags={TAG: launch_id}, token=None, created_at=w.t, boot_at=w.t,
            boot_fails=False, created_by="p")
    batch.vm_running(vm)
    return vm


def test_a_job_powers_its_node_up_and_waits_for_it() -> None:
    w, batch, power, calls = world()
    batch.inner.submit(cores=4, nodes=1, duration=100.0)
    w.run_until(w.t + 10)
    (call,) = calls
    assert call.action == "resume" and len(call.nodes) == 1
    name = call.nodes[0]
    assert power.state[name] == UP_PENDING
    node = next(n for n in batch.snapshot().nodes if n.name == name)
    assert "POWERING_UP" in node.native_state and node.state == "down"
    w.run_until(w.t + 300)  # no machine: the job's clock has not started
    assert batch.inner.completed == 0
    boot(w, batch, name)
    w.run_until(w.t + 2)
    assert power.state[name] == UP
    w.run_until(w.t + 97)  # registered 1 s after boot: 98 s of its 100 have run
    assert batch.inner.completed == 0, "the job runs its whole duration from registration"
    w.run_until(w.t + 3)
    assert batch.inner.completed == 1


def test_powered_down_idle_nodes_are_not_in_the_snapshot() -> None:
    _w, batch, _power, _calls = world()
    assert batch.snapshot().nodes == []


def test_resume_rate_paces_the_calls() -> None:
    w, batch, _power, calls = world(slots=10, resume_rate=60, tick=5.0)
    batch.inner.submit(cores=4, nodes=1, duration=100.0, count=10)
    w.run_until(w.t + 5)
    assert [len(c.nodes) for c in calls] == [5], "60 a minute: 5 per 5-second look"
    w.run_until(w.t + 5)
    assert sum(len(c.nodes) for c in calls) == 10


def test_resume_timeout_downs_the_node_and_requeues_the_job() -> None:
    w, batch, power, calls = world(slots=1, resume_timeout=600.0, down_seconds=120.0)
    batch.inner.submit(cores=4, nodes=1, duration=100.0)
    w.run_until(w.t + 10)
    name = calls[0].nodes[0]
    w.run_until(w.t + 600)
    assert power.state[name] == FAILED
    assert calls[-1].action == "resume_fail" and calls[-1].nodes == [name]
    assert batch.inner.running == 0 and batch.inner.queued == 1, "its job back in the queue"
    w.run_until(w.t + 121)
    assert power.state[name] in (DOWN, UP_PENDING), "back in service after down_seconds (and scheduled again)"


def test_idle_nodes_are_suspended() -> None:
    w, batch, power, calls = world(suspend_time=300.0, suspend_timeout=60.0)
    batch.inner.submit(cores=4, nodes=1, duration=50.0)
    w.run_until(w.t + 10)
    name = calls[0].nodes[0]
    vm = boot(w, batch, name)
    w.run_until(w.t + 100)
    assert batch.inner.completed == 1
    w.run_until(w.t + 320)
    assert power.state[name] == DOWN_PENDING and calls[-1].action == "suspend" and calls[-1].nodes == [name]
    w.run_until(w.t + 61)
    assert power.state[name] == DOWN and batch.serving.get(name) is not vm


def test_give_back_only_of_a_node_powering_up() -> None:
    w, batch, power, calls = world()
    batch.inner.submit(cores=4, nodes=1, duration=100.0)
    w.run_until(w.t + 10)
    name = calls[0].nodes[0]
    out = batch.execute("give_back", name, reason="epu: cannot serve: max_nodes")
    assert out.ok and power.state[name] == DOWN_PENDING
    assert not batch.inner.node(name).jobs, "its job requeued (and scheduled on another node)"
    # a node that is up is never given back
    w.run_until(w.t + 70)
    up = next(n for n, st in power.state.items() if st == UP_PENDING)
    boot(w, batch, up)
    w.run_until(w.t + 2)
    refused = batch.execute("give_back", up, reason="x")
    assert not refused.ok and power.state[up] == UP


def test_a_removed_slot_is_held_until_released_and_its_live_machine_answers_a_power_up() -> None:
    """``remove`` holds the slot (drained, the identity kept): Slurm puts no job there while its
    machine may still run. A release that came too early is seen: the machine, still running,
    answers the power-up, so the judge finds a destroy that follows it (seed 950014)."""
    w, batch, power, calls = world(slots=1, suspend_time=300.0, suspend_timeout=60.0)
    batch.inner.submit(cores=4, nodes=1, duration=50.0)
    w.run_until(w.t + 10)
    vm = boot(w, batch, "c1")
    w.run_until(w.t + 100)
    assert batch.inner.completed == 1 and power.state["c1"] == UP
    out = batch.execute("remove", "c1", instance_id="L1")
    assert out.ok and "DRAIN" in out.output and power.state["c1"] == DOWN_PENDING
    w.run_until(w.t + 61)
    assert power.state["c1"] == DOWN
    (held,) = power.decorate(batch.inner.snapshot()).nodes
    assert held.native_state == "IDLE+CLOUD+DRAIN+POWERED_DOWN" and held.instance_id == "L1"
    batch.inner.submit(cores=4, nodes=1, duration=50.0)
    w.run_until(w.t + 30)
    assert power.state["c1"] == DOWN and not batch.inner.node("c1").jobs, "no job on a held slot"
    assert batch.execute("remove", "c1", instance_id="L1").output.startswith("node c1 already powered down and held")
    released = batch.execute("release", "c1")
    assert released.ok and released.changed and "UNDRAIN" in released.output
    w.run_until(w.t + 10)
    assert power.state["c1"] in (UP_PENDING, UP) and batch.inner.node("c1").jobs, "schedulable again"
    assert vm.terminated_at is None and batch.serving.get("c1") is vm, "its machine, still running, answers"
    assert batch.execute("release", "c1").output.startswith("node c1 not held")


def test_an_add_waits_while_the_slot_is_held_for_another_instance() -> None:
    """A replacement under the same name is not added while the slot is held for the machine
    before it (which may still run): the add fails, transient, until the release."""
    w, batch, power, _calls = world(slots=1)
    assert batch.execute("remove", "c1", instance_id="L1").ok
    refused = batch.execute("add", "c1", instance_id="L2")
    assert not refused.ok and refused.transient and "held for instance L1" in (refused.error or "")
    assert batch.execute("add", "c1", instance_id="L1").ok, "its own identity: nothing to wait for"
    assert batch.execute("release", "c1").ok
    assert batch.execute("add", "c1", instance_id="L2").ok


def test_a_late_release_never_lifts_the_hold_of_a_later_instance() -> None:
    """A release re-sent from a stale snapshot may arrive after the slot was held again for the
    next instance of the name: it names the old instance and is a no-op."""
    _w, batch, power, _calls = world(slots=1)
    assert batch.execute("remove", "c1", instance_id="L1").ok
    assert batch.execute("release", "c1", instance_id="L1").ok
    assert batch.execute("remove", "c1", instance_id="L2").ok
    late = batch.execute("release", "c1", instance_id="L1")
    assert late.ok and not late.changed and "held for instance L2" in late.output
    assert power.held == {"c1": "L2"} and batch.inner.node("c1").offline
