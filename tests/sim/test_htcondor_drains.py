"""Issue 26, defect 2, in the simulator: HTCondor drains with each batch system's eviction
semantics. A graceful ``condor_drain`` evicts a busy node's jobs once MaxJobRetirementTime
(default 0) is spent, so the same seeds that pass with EPU's peaceful startd shutdown show
killed jobs (invariant 1) with a backend that drains the graceful way."""

from __future__ import annotations

from dataclasses import replace

from epu.sim.scenarios import get_scenario
from epu.sim.simulation import Simulation

SEEDS = (1, 2)


def run(seed: int, condor_drain: str):
    scenario = get_scenario("htcondor-drains")
    scenario = replace(scenario, domain=replace(scenario.domain, condor_drain=condor_drain))
    sim = Simulation(scenario, seed=seed)
    return sim, sim.run()


def test_a_graceful_drain_evicts_and_the_invariants_catch_it() -> None:
    evicted = []
    for seed in SEEDS:
        sim, result = run(seed, "graceful")
        evicted += [k for k in sim.batch.stats.kills if k.why.startswith("evicted")]
        if evicted:
            assert any(v.invariant == 1 and "evicted" in v.detail for v in result.violations)
            break
    assert evicted, "no busy node was offlined: the scenario tests nothing"


def test_the_peaceful_shutdown_never_evicts() -> None:
    for seed in SEEDS:
        sim, result = run(seed, "peaceful")
        assert not [k for k in sim.batch.stats.kills if k.why.startswith("evicted")]
        assert not result.violations, [str(v) for v in result.violations[:5]]
