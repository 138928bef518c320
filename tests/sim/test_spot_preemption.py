"""The spot-preemption scenario, looked at after the run: every job running on a node the cloud
preempted was requeued by EPU (the batch system would notice the dead node only 15 minutes
later) and completed; no kill was ours (the invariants are checked by the run)."""

from __future__ import annotations

from epu.sim.scenarios import get_scenario
from epu.sim.simulation import Simulation


def test_every_job_on_a_preempted_node_is_requeued_by_epu_and_completes() -> None:
    sim = Simulation(get_scenario("spot-preemption"), seed=1)
    result = sim.run()
    assert not result.violations, [str(v) for v in result.violations[:5]]
    cloud = sim.clouds["cloud-a"]
    assert cloud.stats.preempted >= 3  # the scenario really preempts
    batch = sim.batch
    assert batch.preempted_jobs, "no job was running on a preempted node: the scenario tests nothing"
    whys = {}
    for kill in batch.stats.kills:
        if kill.job_id in batch.preempted_jobs:
            whys.setdefault(kill.job_id, kill.why)
    assert set(whys) == set(batch.preempted_jobs), "a preempted node's job was never requeued"
    assert all(why.startswith("requeued: preempted by the cloud") for why in whys.values()), whys
    inner = batch.inner
    assert inner.completed == inner.submitted and not inner._queue and not inner._running
    vms = list(cloud.vms.values())
    assert any(vm.size == "sim.c4" for vm in vms)
    assert all(vm.terminated_at is not None for vm in vms)  # back to zero
