"""Issue 33, defect 6, as a seeded scenario: HTCondor preemption without a drain. The cloud
reclaims running workers at once (half named as spot preemptions, half just dropping out of the
listings) and their daemons withdraw their ads; an operator force-terminates now and then. The
simulated HTCondor answers ``remove`` through the real backend's decision and memory
(``htcondor/removal.py``: ``removal_step``, ``Absences``). With "no ad" unknown for ever (the
decision before the fix: ``absent_confirm_seconds`` infinite) such a node is sent ``remove``
hundreds of times and the domain never converges (invariant 5: instances left in the engine's
cleanup, ghost records); with today's, removes per node are bounded and nothing is violated."""

from __future__ import annotations

from collections import Counter

from epu.common.messages import NodeCommand
from epu.services.sensor.htcondor.removal import ABSENT_CONFIRM_SECONDS

from epu.sim.scenarios import get_scenario, names
from epu.sim.simulation import Simulation

SEEDS = (1, 2, 3)
#: A dead daemon's ad lingers up to 900 s in the simulated collector (``SimBatchSystem._expire``),
#: then the node must stay absent ``ABSENT_CONFIRM_SECONDS``; the engine asks once per iteration.
LINGER = 900.0


def _run(seed: int, unknown_for_ever: bool) -> tuple[list, Counter, Simulation]:
    sim = Simulation(get_scenario("htcondor-preemption"), seed)
    if unknown_for_ever:
        sim.batch.absent_confirm_seconds = float("inf")
    removes: Counter = Counter()
    sim.bus.taps.append(lambda m, _s: removes.update([m.instance_id])
                        if isinstance(m, NodeCommand) and m.action == "remove" else None)
    return sim.run().violations, removes, sim


def test_the_scenario_is_registered() -> None:
    assert "htcondor-preemption" in names()


def test_no_ad_unknown_for_ever_sends_remove_for_ever_and_never_converges() -> None:
    for seed in SEEDS:
        violations, removes, _sim = _run(seed, unknown_for_ever=True)
        assert [v for v in violations if v.invariant == 5], f"seed {seed}: the scenario did not catch it"
        # asked for ever: every few minutes once the failed answers' backoff reached its maximum
        # (services/decision/retries.py; every iteration, over 500 times, before it)
        assert max(removes.values()) > 12, removes.most_common(3)


def test_every_reclaimed_node_is_removed_within_a_bound() -> None:
    for seed in SEEDS:
        violations, removes, sim = _run(seed, unknown_for_ever=False)
        assert not violations, [str(v) for v in violations[:5]]
        iteration = sim.scenario.timing.iteration_seconds
        bound = 1.3 * (LINGER + ABSENT_CONFIRM_SECONDS) / iteration
        assert max(removes.values()) <= bound, (removes.most_common(3), bound)
        assert sim.clouds["cloud-a"].stats.preempted and sim.clouds["cloud-a"].stats.vanished  # both kinds ran
