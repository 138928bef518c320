"""The in-memory store's ``list`` reads an index of live and recently ended records, not every
record ever (``MemoryDatabase.ended``): its answers must be the full scan's, for every filter."""

from __future__ import annotations

import random

from epu.common.messages import LaunchRequest
from epu.services.provisioner.store import InstanceRecord

from epu.sim.provisioner_memstore import _ENDED, MemoryDatabase, MemoryStore


def full_scan(db: MemoryDatabase, *, domain: str | None = None, site: str | None = None,
              states: tuple[str, ...] | None = None, active_only: bool = False,
              since: float | None = None) -> list[InstanceRecord]:
    out = [r for r in db.instances.values()
           if (since is None or r.state not in _ENDED or r.updated_at >= since)
           and (not domain or r.domain == domain) and (not site or r.site == site)
           and (not states or r.state in states) and (not active_only or r.state not in _ENDED)]
    return sorted(out, key=lambda r: (r.created_at, r.instance_id))


def test_list_answers_as_the_full_scan_over_a_random_history() -> None:
    rng = random.Random(7)
    store = MemoryStore()
    now = 1000.0
    ids: list[str] = []
    for step in range(600):
        now += rng.choice((0.0, 1.0, 5.0))
        if rng.random() < 0.4 or not ids:
            iid = f"i{step}"
            store.record_launch(LaunchRequest(launch_id=iid, domain=rng.choice("ab"), site=rng.choice(("s1", "s2")),
                                              node_name=iid), now)
            ids.append(iid)
        else:
            iid = rng.choice(ids)
            store.advance(iid, rng.choice(("pending", "started", "terminating", "terminated", "failed")), now)
        if step % 25 == 0:
            db = store.db
            for kw in ({}, {"active_only": True}, {"states": ("terminating",)}, {"states": ("failed",)},
                       {"domain": "a", "active_only": True}, {"site": "s2"}):
                assert store.list(**kw) == full_scan(db, **kw)  # type: ignore[arg-type]
            for back in (0.0, 10.0, 100.0, 10_000.0):
                assert store.list(live_or_updated_since=now - back) == full_scan(db, since=now - back)
                assert (store.list(live_or_updated_since=now - back, domain="b")
                        == full_scan(db, since=now - back, domain="b"))
    assert len(store.db.ended) > 50 and sum(map(len, store.db.live.values())) > 20  # both kinds seen
    copy = MemoryStore(store.db.copy())
    assert copy.list(live_or_updated_since=now - 50.0) == full_scan(store.db, since=now - 50.0)


def test_the_reports_read_kept_between_writes_is_the_full_scans() -> None:
    """The anti-entropy report's read (``live_or_updated_since`` alone) is answered again from
    the last one while no record was stored and the horizon passed no ended record: over random
    writes, reads at a horizon that moves with time (often past nothing, sometimes past ended
    records) and a copied database, every answer is the full scan's."""
    rng = random.Random(11)
    store = MemoryStore()
    now = 1000.0
    ids: list[str] = []
    kept = 0
    for step in range(3000):
        op = rng.random()
        if op < 0.15 or not ids:
            iid = f"i{step}"
            store.record_launch(LaunchRequest(launch_id=iid, domain="d", site=rng.choice(("s1", "s2")), node_name=iid),
                                now)
            ids.append(iid)
        elif op < 0.35:
            store.advance(rng.choice(ids), rng.choice(("pending", "started", "terminating", "terminated", "failed")),
                          now)
        elif op < 0.5:
            now += rng.choice((0.5, 1.0, 5.0, 30.0))
        else:
            since = now - rng.choice((60.0, 60.0, 60.0, 0.0, 1e9))
            before = store._recent
            got = store.list(live_or_updated_since=since)
            kept += before is not None and store._recent is before
            assert got == full_scan(store.db, since=since)
            got.clear()  # a caller's change to its answer is not the next one's
        if step == 2000:
            store = MemoryStore(store.db.copy())
    assert kept > 200
