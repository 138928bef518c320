"""Issue 26, defect 1, as a seeded scenario: HTCondor as two views. The collector loses live
workers' ads for 15–60 minutes while the schedd still lists their jobs, and a peaceful shutdown
lasts as long as the jobs. The simulated HTCondor answers ``remove`` through the real backend's
decision (``htcondor/removal.py``) from those views. With the decision the backend had before —
"no master ad: already gone", a peaceful shutdown answered ok at once — the engine terminates
workers with their jobs on every seed; with today's, no invariant is violated."""

from __future__ import annotations

from epu.services.sensor.backend import CommandOutcome
from epu.services.sensor.htcondor.removal import RemovalFacts, RemovalStep

from epu.sim.scenarios import get_scenario, names
from epu.sim.simulation import Simulation

SEEDS = (1, 2)


def trusting_the_collector(f: RemovalFacts) -> RemovalStep:
    """The HTCondor backend's ``remove`` before issue 26: only the collector's view."""
    if f.busy_slots and not f.force:
        return RemovalStep(False, CommandOutcome(False, error="claimed slots"))
    if not f.master_seen:
        return RemovalStep(False, CommandOutcome(True, output="no master ad: already gone"))
    return RemovalStep(True, CommandOutcome(True, changed=True, output="DaemonsOffPeaceful sent"))


def test_the_scenario_is_registered() -> None:
    assert "htcondor-two-views" in names() and "htcondor-drains" in names()


def test_a_remove_that_trusts_the_collector_kills_jobs_on_every_seed() -> None:
    for seed in SEEDS:
        sim = Simulation(get_scenario("htcondor-two-views"), seed=seed)
        sim.batch.remove_decision = trusting_the_collector
        result = sim.run()
        killed = [v for v in result.violations if v.invariant == 1]
        assert killed, f"seed {seed}: the scenario did not catch the collector-trusting remove"


def test_remove_confirmed_by_the_schedd_and_the_masters_exit_violates_nothing() -> None:
    for seed in SEEDS:
        sim = Simulation(get_scenario("htcondor-two-views"), seed=seed)
        result = sim.run()
        assert not result.violations, [str(v) for v in result.violations[:5]]
        assert sim.batch.exited, "no peaceful shutdown ran to its end: the scenario tests nothing"
        inner = sim.batch.inner
        assert inner.completed == inner.submitted
