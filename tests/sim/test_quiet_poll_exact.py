"""Skipping a provisioner's quiet polls is exact in every scenario: ``epu.sim.quiet_poll`` skips a
site's poll only when the simulated cloud's listing, the simulated store's records, the misses
and the rules are all what the site's last, steady poll saw, so a run with skipping must be the
run without it, event for event (the same digest, events, statistics and violations). An input
of ``observe`` the skip did not cover would make the runs part here."""

from __future__ import annotations

import pytest

from epu.sim import scenarios
from epu.sim.processes import ProvisionerProc
from epu.sim.simulation import Simulation

HOURS = 2.0
"""Each scenario over at most its first two hours (its faults start within them), as
tests/sim/test_skip_exact.py."""


@pytest.mark.parametrize("name", scenarios.names())
def test_a_run_skipping_quiet_polls_is_the_run_without(name: str) -> None:
    def sim(skip: bool) -> Simulation:
        sc = scenarios.get_scenario(name)
        sc.hours = min(sc.hours, HOURS)
        return Simulation(sc, 1, skip_quiet_polls=skip)

    quiet, full = sim(True), sim(False)
    a, b = quiet.run(), full.run()
    assert a.digest == b.digest and a.events == b.events and a.stats == b.stats
    assert [str(v) for v in a.violations] == [str(v) for v in b.violations]
    assert all(p.quiet.skipped == 0 for p in full.provisioners if isinstance(p, ProvisionerProc))
    if quiet.databases is not None:  # in-memory stores: the only ones with a records version
        assert sum(p.quiet.skipped for p in quiet.provisioners) > 0  # it did skip
