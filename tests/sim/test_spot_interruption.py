"""The spot-interruption scenario: the cloud announces each preemption two minutes ahead (EC2's
spot interruption notice). EPU drains the node at once — its jobs requeued by EPU's command, the
node removed and the instance terminated — so no job is left to die with the machine, every job
completes and no invariant is violated."""

from __future__ import annotations

from epu.sim.scenarios import get_scenario
from epu.sim.simulation import Simulation


def test_an_interruption_notice_drains_the_node_before_the_cloud_takes_it() -> None:
    sim = Simulation(get_scenario("spot-interruption"), seed=1)
    result = sim.run()
    assert not result.violations, [str(v) for v in result.violations[:5]]
    cloud = sim.clouds["cloud-a"]
    announced = [vm for vm in cloud.vms.values() if vm.interruption_at is not None]
    assert len(announced) >= 3, "the scenario really announces preemptions"
    batch = sim.batch
    early = {k.job_id for k in batch.stats.kills if k.why.startswith("requeued: interruption notice")}
    assert early, "no job was running on an announced node: the scenario tests nothing"
    # given back before the reclaim: the cloud found most announced nodes already gone
    ours_first = [vm for vm in announced if vm.cause != "preempt"]
    assert len(ours_first) >= len(announced) // 2, [(vm.cloud_id, vm.cause) for vm in announced]
    assert all(vm.terminated_at <= vm.interruption_at for vm in ours_first)
    # no job died with a machine (spot-preemption, without notices, seed 1: 30 did and waited for EPU's
    # requeue after the node's death)
    assert not batch.preempted_jobs and not [k for k in batch.stats.kills if "preempted by the cloud" in k.why]
    inner = batch.inner
    assert inner.completed == inner.submitted and not inner._queue and not inner._running
    assert all(vm.terminated_at is not None for vm in cloud.vms.values())  # back to zero
