"""``MemoryStore.instances(domain)`` keeps its sorted list while the domain's stamp stands: over
random launches, state changes, endings, another engine writing to the shared store, syncs and
reloads, it lists what sorting the working set anew lists — the same instances, in the same
order (ties of launch time in working-set order). The engine's census and its terminate
decisions read this list."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from epu.services.decision.store import _LAUNCHED
from epu.services.decision.view import Instance

from epu.sim.decision_memstore import MemoryDecisionDatabase, MemoryStore


def sorted_anew(store: MemoryStore, domain: str) -> list[Instance]:
    return sorted((i for i in store._live() if i.domain == domain), key=_LAUNCHED)


@pytest.mark.parametrize("seed", range(6))
def test_kept_instance_lists_are_the_sorted_working_set(seed: int) -> None:
    rng = random.Random(seed)
    db = MemoryDecisionDatabase()
    mine, other = MemoryStore(db), MemoryStore(db)
    known: list[str] = []
    kept = 0
    for i in range(400):
        op = rng.random()
        writer = other if rng.random() < 0.2 else mine
        writer.sync()  # an engine reads the store before it writes (a write on a stale read is refused)
        if op < 0.2:
            iid = f"i{i}"
            known.append(iid)
            writer.save_instances([Instance(iid, rng.choice("ab"), "s", f"w{i}", 4, "requested",
                                            float(rng.choice((100, 100, 200, 300))), 100.0)])
        elif op < 0.45 and known:
            inst = db.instances[rng.choice(known)]
            state = rng.choice(("pending", "started", "joined", "draining", "terminating", "terminated", "failed"))
            writer.save_instances([replace(inst, state=state, seq=inst.seq + 1)])
        elif op < 0.5:
            mine.sync()
        elif op < 0.53:
            mine.invalidate()
        for d in "ab":
            before = mine._listed.get(d)
            got = mine.instances(d)
            assert got == sorted_anew(mine, d)
            assert [x.instance_id for x in got] == [x.instance_id for x in sorted_anew(mine, d)]
            kept += before is not None and mine._listed[d] is before
    assert kept > 100
