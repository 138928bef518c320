"""``MemoryStore._tx`` (a class-based context manager now, no generator): a committed write
applies the pending publish marks, a rolled-back one (``_Rollback``) is swallowed and loses
them, a failed one propagates and loses them, a refused one (``before_write``) too — and the
database lock is released every time (another thread can take it)."""

from __future__ import annotations

import threading

import pytest

from epu.sim.provisioner_memstore import MemoryStore, _Rollback


def _free(store: MemoryStore) -> bool:
    """Can another thread take the database lock right now?"""
    got: list[bool] = []
    t = threading.Thread(target=lambda: got.append(store.db.lock.acquire(timeout=1.0)) or store.db.lock.release())
    t.start()
    t.join()
    return got == [True]


def _store_with_marks() -> MemoryStore:
    store = MemoryStore()
    store.db.transitions += [{"published": False}, {"published": False}]
    store.db.unpublished.update({1: None, 2: None})
    store.mark_published([1, 2])
    return store


def test_a_committed_write_applies_the_marks() -> None:
    store = _store_with_marks()
    with store._tx() as write:
        write()
    assert store.db.unpublished == {} and all(t["published"] for t in store.db.transitions)
    assert store._marks == [] and _free(store)


def test_a_rollback_is_swallowed_and_loses_the_marks() -> None:
    store = _store_with_marks()
    with store._tx():
        raise _Rollback
    assert list(store.db.unpublished) == [1, 2] and store._marks == [] and _free(store)


def test_a_failure_propagates_and_loses_the_marks() -> None:
    store = _store_with_marks()
    with pytest.raises(KeyError), store._tx():
        raise KeyError("x")
    assert list(store.db.unpublished) == [1, 2] and store._marks == [] and _free(store)


def test_a_refused_write_releases_the_lock() -> None:
    store = _store_with_marks()
    calls: list[int] = []

    def refuse() -> None:
        calls.append(1)
        raise PermissionError("fenced")

    store.before_write = refuse
    with pytest.raises(PermissionError), store._tx():  # marks pending: refused on entry
        pass
    assert calls == [1] and list(store.db.unpublished) == [1, 2] and _free(store)
    with pytest.raises(PermissionError), store._tx() as write:  # no marks: refused at the first change
        write()
    assert calls == [1, 1] and _free(store)
    store.before_write = None
    with store._tx() as write:  # write() called twice asks before_write once
        write()
        write()
    assert _free(store)
