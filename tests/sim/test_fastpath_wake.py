"""``fastpath.least_sum`` and ``instance_stamps`` against the pairwise scan they replace."""

from __future__ import annotations

import math
import random
from dataclasses import replace

from epu.services.decision.view import Instance

from epu.sim.fastpath import instance_stamps, least_sum


def pairwise(stamps: list[float], ds: list[float], now: float) -> float:
    return min([x for d in ds for t in stamps if (x := t + d) > now], default=math.inf)


def test_least_sum_is_the_pairwise_minimum() -> None:
    rng = random.Random(7)
    for _ in range(3000):
        base = 1_700_000_000.0 + rng.uniform(0, 1e6)
        stamps = [base + rng.choice([rng.uniform(-4000, 4000), rng.randint(-50, 50) * 0.1, 0.0])
                  for _ in range(rng.randint(0, 40))]
        if stamps and rng.random() < 0.3:
            stamps.append(math.inf)
        ds = [rng.choice([rng.uniform(0.001, 3600), 60.0, 300.0, 0.1]) for _ in range(rng.randint(0, 5))]
        # now on a stamp + duration exactly, or just around one (rounding at the boundary)
        if stamps and ds and rng.random() < 0.5:
            t, d = rng.choice(stamps), rng.choice(ds)
            now = math.nextafter(t + d, rng.choice([-math.inf, math.inf])) if rng.random() < 0.5 else t + d
        else:
            now = base + rng.uniform(-5000, 5000)
        assert least_sum(sorted(stamps), ds, now) == pairwise(stamps, ds, now)


def test_least_sum_where_rounding_moves_the_boundary() -> None:
    """Magnitudes far apart: ``t <= now - d`` and ``t + d > now`` disagree often here."""
    rng = random.Random(11)
    for _ in range(3000):
        stamps = [rng.uniform(-10, 10) * 10 ** rng.randint(-3, 17) for _ in range(rng.randint(1, 12))]
        ds = [rng.uniform(0.001, 10) * 10 ** rng.randint(-3, 17) for _ in range(rng.randint(1, 4))]
        x = rng.choice(stamps) + rng.choice(ds)
        now = rng.choice([x, math.nextafter(x, -math.inf), math.nextafter(x, math.inf),
                          x + rng.uniform(-1, 1) * abs(x) * 1e-15])
        assert least_sum(sorted(stamps), ds, now) == pairwise(stamps, ds, now)


def _inst(rng: random.Random, i: int) -> Instance:
    t = 1_700_000_000.0 + rng.uniform(0, 1e5)
    maybe = lambda: t + rng.uniform(0, 100) if rng.random() < 0.5 else None  # noqa: E731
    return Instance(instance_id=f"i{i}", domain="d", site="s", node_name=f"n{i}", cores=1, state="running",
                    launched_at=t, state_at=t + 1, joined_at=maybe(), idle_since=maybe(), drain_at=maybe(),
                    add_sent_at=maybe(), missing_since=maybe())


def test_instance_stamps_memo_follows_the_instances() -> None:
    rng = random.Random(3)
    memo: dict = {}
    insts = [_inst(rng, i) for i in range(20)]
    for step in range(500):
        r = rng.random()
        if r < 0.3 and insts:
            k = rng.randrange(len(insts))
            insts[k] = replace(insts[k], idle_since=rng.choice([None, insts[k].launched_at + rng.uniform(0, 50)]))
        elif r < 0.4:
            insts.append(_inst(rng, 100 + step))
        elif r < 0.5 and insts:
            insts.pop(rng.randrange(len(insts)))
        fresh = sorted(t for i in insts for t in (i.launched_at, i.state_at, i.joined_at, i.idle_since,
                                                  i.drain_at, i.add_sent_at, i.missing_since) if t is not None)
        assert instance_stamps(list(insts), memo, "d") == fresh
