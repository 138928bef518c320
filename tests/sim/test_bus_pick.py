"""``SimQueue.pick``'s single-consumer path gives the consumer, ``active`` and ``rr`` the general
rule gives, over random registrations and modes (the broker's choice decides who handles what,
so a different pick would change a run)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from epu.sim.bus import Consumer, SimQueue


@dataclass
class Owner:
    registered: bool = True


def general_pick(q: SimQueue) -> Consumer | None:
    """The rule as written for any number of consumers."""
    live = [c for c in q.consumers if c.owner.registered]
    if not live:
        q.active = None
        return None
    if q.mode == "sac":
        if q.active is None or q.active not in live:
            q.active = live[0]
        return q.active
    q.rr = (q.rr + 1) % len(live)
    return live[q.rr]


@pytest.mark.parametrize("seed", range(6))
def test_one_consumer_pick_is_the_general_rule(seed: int) -> None:
    rng = random.Random(seed)
    for mode in ("sac", "competing", "single"):
        owners = [Owner() for _ in range(3)]
        start = rng.randint(0, 4)  # any state the queue may be in
        fast, ref = SimQueue("q", mode, rr=start), SimQueue("q", mode, rr=start)
        for step in range(300):
            if step % 100 == 0 and len(fast.consumers) < 3:  # one consumer, then two, then three
                k = len(fast.consumers)
                fast.consumers.append(Consumer(owners[k], print))
                ref.consumers.append(fast.consumers[-1])
            for o in owners:
                if rng.random() < 0.2:
                    o.registered = not o.registered
            got, want = fast.pick(), general_pick(ref)
            assert got is want and fast.active is ref.active and fast.rr == ref.rr
