"""``estimated_bytes`` with its memo (kept between snapshots, entries added, cut back now and
then) equals the estimate measured from nothing, over random sequences of snapshots whose nodes
are partly the very objects of earlier ones, partly new, and come and go."""

from __future__ import annotations

import random

import pytest
from epu.common.messages import NodeInfo, SensorSnapshot
from epu.services.sensor.core import estimated_bytes


def node(rng: random.Random, name: str) -> NodeInfo:
    jobs = sorted({str(rng.randint(1, 10_000)) for _ in range(rng.randint(0, 4))})
    return NodeInfo(name=name, state="busy" if jobs else "free", cores=4, cores_used=len(jobs), jobs=jobs,
                    instance_id=rng.choice((None, f"i-{rng.randint(0, 99)}")))


@pytest.mark.parametrize("seed", range(6))
def test_the_kept_size_memo_equals_the_estimate_from_nothing(seed: int) -> None:
    rng = random.Random(seed)
    current: dict[str, NodeInfo] = {}
    memo: dict = {}
    for _ in range(300):
        for _ in range(rng.randint(0, 6)):
            name = f"n{rng.randint(0, 40)}"
            if rng.random() < 0.2:
                current.pop(name, None)
            else:
                current[name] = node(rng, name)  # a new object, equal or not to the last
        snap = SensorSnapshot(domain="d", backend="simulated", available=True, taken_at=1.0,
                              nodes=[current[k] for k in sorted(current)])
        assert estimated_bytes(snap, memo) == estimated_bytes(snap)
        assert len(memo) <= 2 * len(snap.nodes) + 64 + len(snap.nodes)
        assert all(memo[id(n)][0] is n for n in snap.nodes)
