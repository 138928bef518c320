"""``MemoryStore.live_per_site`` and ``live_per_type`` are counted once and then kept current by
``save_instances``: over random launches, state changes (site and type too), endings, several
instances in one write, another engine writing to the shared store, syncs, reloads and a fault
refusing a write, they answer exactly what counting every live instance anew answers (a site or
type counted down to 0 has no key, as in a full count)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from epu.services.decision.lease import StaleWrite
from epu.services.decision.store import count_per_site, count_per_type
from epu.services.decision.view import Instance

from epu.sim.decision_memstore import MemoryDecisionDatabase, MemoryStore

STATES = ("requested", "pending", "started", "joined", "draining", "terminating", "terminated", "failed")


def _check(store: MemoryStore) -> None:
    live = [store.db.instances[iid] for iid in store.db.live]
    per, unproven = count_per_site(live)
    got_per, got_unproven = store.live_per_site()
    assert got_per == per
    assert got_unproven == unproven
    assert store.live_per_type() == count_per_type(live)


class _Refused(Exception):
    pass


def _save(writer: MemoryStore, items: list[Instance]) -> None:
    """A write, refused (``StaleWrite``) when the other handle wrote since this one read: then
    read again and write, as the engine does."""
    try:
        writer.save_instances(items)
    except StaleWrite:
        writer.sync()
        writer.save_instances(items)


@pytest.mark.parametrize("seed", range(8))
def test_kept_counts_are_a_full_count(seed: int) -> None:
    rng = random.Random(seed)
    db = MemoryDecisionDatabase()
    mine, other = MemoryStore(db), MemoryStore(db)
    known: list[str] = []
    for i in range(500):
        op = rng.random()
        writer = other if rng.random() < 0.2 else mine
        if rng.random() < 0.9:
            writer.sync()  # reads what the other wrote, as an engine does before it writes; else:
        if op < 0.2:
            iid = f"i{i}"
            known.append(iid)
            _save(writer, [Instance(iid, rng.choice("ab"), rng.choice(("s", "t", "u")), f"w{i}", 4,
                                            rng.choice(STATES[:4]), float(i), float(i),
                                            instance_type=rng.choice(("", "small", "big")))])
        elif op < 0.6 and known:
            batch = []
            for iid in rng.sample(known, min(len(known), rng.randint(1, 3))):
                inst = db.instances[iid]
                batch.append(replace(inst, state=rng.choice(STATES), seq=inst.seq + 1,
                                     site=rng.choice((inst.site, inst.site, "t")),
                                     instance_type=rng.choice((inst.instance_type, "big"))))
            if rng.random() < 0.1:
                def refuse() -> None:
                    raise _Refused

                db.before_write = refuse
                with pytest.raises(_Refused):
                    writer.save_instances(batch)
                db.before_write = None
            else:
                _save(writer, batch)
        elif op < 0.65:
            mine.sync()
        elif op < 0.68:
            mine.invalidate()
        if rng.random() < 0.5:  # counted at random moments: some writes land before the first count
            _check(mine if rng.random() < 0.7 else other)
    _check(mine)


def test_answers_are_copies() -> None:
    """The engine adds its planned launches to the answers: they must not move the kept counts."""
    store = MemoryStore()
    store.save_instances([Instance("i1", "a", "s", "w1", 4, "pending", 1.0, 1.0, instance_type="small")])
    per, unproven = store.live_per_site()
    per["s"] += 5
    unproven["s"] += 5
    store.live_per_type()[("s", "small")] += 5
    assert store.live_per_site() == ({"s": 1}, {"s": 1})
    assert store.live_per_type() == {("s", "small"): 1}
