"""Skipping idle engine iterations is exact in every scenario: the fault simulator's engine skips
an iteration only before the earliest deadline the engine itself names (``Engine.next_deadlines``)
and the stored data's thresholds (``fastpath.next_wake``), so a run with skipping must be the run
without it, event for event. A timer the engine keeps but does not name would make the skipping
run miss the iteration where it turns, and its digest differ here."""

from __future__ import annotations

import pytest

from epu.sim import scenarios
from epu.sim.lazy import SimLazyEngineProc
from epu.sim.simulation import Simulation

HOURS = 2.0
"""Each scenario over at most its first two hours (its faults start within them): enough to
cover each one's faults, short enough to run all of them twice in CI."""


@pytest.mark.parametrize("name", scenarios.names())
def test_a_run_with_skipping_is_the_run_without(name: str) -> None:
    def sim(skip: bool) -> Simulation:
        sc = scenarios.get_scenario(name)
        sc.hours = min(sc.hours, HOURS)
        return Simulation(sc, 1, skip_idle=skip)

    lazy = sim(True)
    if lazy.scenario.engines > 1:  # a lapsed lease would hand the domain over: no skipping then
        assert not any(isinstance(e, SimLazyEngineProc) for e in lazy.engines)
        return
    assert isinstance(lazy.engines[0], SimLazyEngineProc)
    full = sim(False)
    a, b = lazy.run(), full.run()
    assert lazy.engines[0].skip_stats.skipped > 0  # it did skip
    assert a.digest == b.digest and a.events == b.events and a.stats == b.stats
    assert [str(v) for v in a.violations] == [str(v) for v in b.violations]
