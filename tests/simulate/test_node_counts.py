"""``node_counts`` (a sample's nodes per state and cores in use, from the batch's kept free cores)
equals the count from every node's own ``state()`` and ``used``, in the same key order, over
random sequences of submissions, node commands, failures, requeues and time."""

from __future__ import annotations

import random

import pytest
from epu.common.clock import ManualClock
from epu.services.sensor.simulated import SimulatedBatch

from epu.simulate.run import node_counts
from tests.sensor.test_simulated_kept import step


def from_every_node(b: SimulatedBatch) -> tuple[dict[str, int], int]:
    nodes: dict[str, int] = {}
    for n in b._nodes.values():
        nodes[n.state()] = nodes.get(n.state(), 0) + 1
    return nodes, sum(n.used for n in b._nodes.values())


@pytest.mark.parametrize("seed", range(6))
def test_node_counts_equal_every_nodes_own_state(seed: int) -> None:
    rng = random.Random(4000 + seed)
    clock = ManualClock(1000.0)
    batch = SimulatedBatch(clock, nodes={"n0": 2})
    ids: list[str] = []
    for _ in range(400):
        step(rng, clock, [batch], ids)
        batch.advance()
        got, want = node_counts(batch), from_every_node(batch)
        assert got == want and list(got[0]) == list(want[0])
