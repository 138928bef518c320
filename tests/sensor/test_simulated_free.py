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


@pytest.mark.parametrize("seed", range(6))
def test_reused_node_records_follow_instance_ids_set_from_outside(seed: int) -> None:
    """A node's record is reused while its ``version`` and ``instance_id`` stay: an id given to an
    existing node (a command's ``add``, or ``epu.sim.batch`` setting it as the daemon registers)
    shows in the next read, as in a record built from scratch."""
    rng = random.Random(2000 + seed)
    clock = ManualClock(1000.0)
    batch = SimulatedBatch(clock)
    ids: list[str] = []
    for i in range(400):
        step(rng, clock, [batch], ids)
        names = sorted(batch._nodes)
        if names and rng.random() < 0.3:
            node = batch._nodes[rng.choice(names)]
            if rng.random() < 0.5:
                node.instance_id = f"i-{i}"
            else:
                node.instance_id = None
                batch.execute("add", node.name, instance_id=f"i-{i}")
        if rng.random() < 0.5:
            got = batch.snapshot().nodes
            assert got == [batch._build_node_info(n) for n in sorted(batch._nodes.values(), key=lambda n: n.name)]


@pytest.mark.parametrize("seed", range(4))
def test_the_state_kept_by_touch_is_the_nodes_state(seed: int) -> None:
    """``_touch`` works a node's state out with its free cores; it is ``SimNode.state()``."""
    rng = random.Random(3000 + seed)
    clock = ManualClock(1000.0)
    batch = SimulatedBatch(clock, nodes={"n0": 2})
    ids: list[str] = []
    for _ in range(400):
        step(rng, clock, [batch], ids)
        batch.advance()
        assert all(n.last_state == n.state() for n in batch._nodes.values())
