"""The in-memory store's read of live and recently ended records (the anti-entropy report's,
every minute) patched from its last answer is exact: over random launches, transitions, ends,
touches of ended records, site moves, a horizon that moves forward (mostly), stands or moves back,
reads through two handles on one database and a change log trimmed often, every answer is the
full scan's — every live record and every ended one stored since the horizon, in row order."""

from __future__ import annotations

import random

import pytest
from epu.common.messages import LaunchRequest
from epu.services.provisioner.store import InstanceRecord

from epu.sim import provisioner_memstore as memstore
from epu.sim.provisioner_memstore import MemoryDatabase, MemoryStore

_NEXT = {"requested": ("pending", "failed", "terminating"), "pending": ("started", "terminating", "failed"),
         "started": ("terminating", "terminated", "failed"), "terminating": ("terminated",)}


def full_scan(db: MemoryDatabase, since: float) -> list[InstanceRecord]:
    return sorted((r for r in db.instances.values() if r.state not in ("terminated", "failed") or r.updated_at >= since),
                  key=lambda r: (r.created_at, r.instance_id))


@pytest.mark.parametrize("seed", range(8))
def test_a_patched_read_is_the_full_scan(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memstore, "_CHANGES_KEPT", 16)  # the log trimmed often: old reads are made afresh
    rng = random.Random(seed)
    db = MemoryDatabase()
    writer, readers, lazy_reader = MemoryStore(db), [MemoryStore(db), MemoryStore(db)], MemoryStore(db)
    now, horizon, n = 1000.0, 60.0, 0
    patched = []
    real = MemoryStore._patched

    def counted(self, *args):  # type: ignore[no-untyped-def]
        out = real(self, *args)
        patched.append(out is not None)
        return out

    monkeypatch.setattr(MemoryStore, "_patched", counted)
    for _ in range(600):
        op = rng.random()
        ids = list(db.instances)
        if op < 0.2 or not ids:
            n += 1
            writer.record_launch(LaunchRequest(launch_id=f"l{n:03d}", domain="d", site=rng.choice("ab"),
                                               node_name=f"w{n}"), now + rng.choice((0.0, 0.0, -5.0)))
        elif op < 0.55:
            rec = db.instances[rng.choice(ids)]
            if rec.state in _NEXT:
                writer.advance(rec.instance_id, rng.choice(_NEXT[rec.state]), now, cloud_id=f"c{rec.instance_id}")
        elif op < 0.62:
            writer.touch(rng.choice(ids), now, "touched")  # ended ones too: a second ``ended`` entry
        elif op < 0.66:
            writer.set_cloud_fields(rng.choice(ids), site=rng.choice("abc"))
        elif op < 0.9:
            now += rng.choice((0.0, 1.0, 7.0, 30.0, 90.0))
        lazy = [lazy_reader] if rng.random() < 0.05 else []  # reads after many writes: the log was trimmed
        for reader in rng.sample(readers, rng.randint(1, 2)) + lazy:
            since = now - horizon + rng.choice((0.0, 0.0, 0.0, -100.0, 5.0))  # the horizon moved back or on
            answer = reader.list(live_or_updated_since=since)
            assert answer == full_scan(db, since)
            assert [id(r) for r in answer] == [id(r) for r in full_scan(db, since)]
    assert sum(patched) > 200 and not all(patched)


@pytest.mark.parametrize("seed", range(4))
def test_a_record_evolved_is_the_one_replace_makes(seed: int) -> None:
    """``memstore._evolve`` (every transition's new record) makes what ``dataclasses.replace``
    makes: the same fields, equal, hashed alike, in the same ``__dict__`` order."""
    import dataclasses

    rng = random.Random(seed)
    names = [f.name for f in dataclasses.fields(InstanceRecord)]
    assert not hasattr(InstanceRecord, "__post_init__")
    rec = InstanceRecord(instance_id="i", domain="d", site="s", node_name="n", cores=1, state="requested", seq=1,
                         cloud_id=None, ip=None, reason="", error_kind=None, created_at=1.0, updated_at=1.0)
    for step in range(200):
        values = {"state": rng.choice(("pending", "started", "terminated")), "seq": step, "cloud_id": f"c{step}",
                  "ip": rng.choice((None, "10.0.0.1")), "updated_at": float(step), "reason": f"r{step}",
                  "presumed_gone_at": rng.choice((None, 3.0)), "site": rng.choice("ab"), "instance_type": "t"}
        changes = dict(rng.sample(sorted(values.items()), rng.randint(0, len(values))))
        made, want = memstore._evolve(rec, **changes), dataclasses.replace(rec, **changes)
        assert made == want and hash(made) == hash(want) and repr(made) == repr(want)
        assert list(made.__dict__.items()) == list(want.__dict__.items()) and list(made.__dict__) == names
        rec = made
