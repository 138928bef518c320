"""The simulated batch's kept free cores (``SimulatedBatch._free``) are exact: over random
sequences of submissions, node commands, failures, requeues and time, they equal the free cores
summed from every usable node's jobs, which is what a scheduling pass used to recompute."""

from __future__ import annotations

import random

import pytest
from epu.common.clock import ManualClock
from epu.services.sensor.simulated import SimulatedBatch

from tests.sensor.test_simulated_kept import FullRefit, step


def recomputed(b: SimulatedBatch) -> dict[str, int]:
    return {n.name: n.cores - sum(n.jobs.values()) for n in b._nodes.values() if not n.offline and not n.down}


@pytest.mark.parametrize("plain", [True, False])
@pytest.mark.parametrize("seed", range(8))
def test_kept_free_cores_equal_the_sum_over_every_node(seed: int, plain: bool) -> None:
    rng = random.Random(1000 + seed)
    clock = ManualClock(1000.0)
    kept, full = SimulatedBatch(clock, nodes={"n0": 4}), FullRefit(clock, nodes={"n0": 4})
    ids: list[str] = []
    for _ in range(500):
        step(rng, clock, [kept, full], ids, plain)
        kept.advance()
        full.advance()
        assert kept._free == recomputed(kept)
        assert {j: job.placed_on for j, job in kept._running.items()} == \
               {j: job.placed_on for j, job in full._running.items()}
    assert kept.submitted > 50 and kept.completed > 0
