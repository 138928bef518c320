"""``heap.HeapKeeper``: the decision service's working set frozen out of the collector's walks,
and cyclic garbage still collected at the full settles (after the first, every ``full_every``
iterations — snapshots do not count — and after a failed iteration)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest
from epu.services.decision.heap import HeapKeeper


@pytest.fixture(autouse=True)
def _gc_state() -> Iterator[None]:
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def _cycle() -> weakref.ref[_Node]:
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_settles_freeze_and_full_ones_collect_frozen_cycles() -> None:
    keeper = HeapKeeper(full_every=3)
    keeper.install()
    assert gc.get_threshold()[0] >= keeper.threshold0
    keeper.settle(iteration=False)  # the first settle is a full one
    assert keeper.full_settles == 1 and gc.get_freeze_count() > 0
    gone = _cycle()  # frozen while alive, garbage after the freeze
    keeper.settle()
    gc.collect()  # a collection does not walk frozen objects: the cycle stays
    assert gone() is not None
    for _ in range(5):
        keeper.settle(iteration=False)  # snapshots do not count towards the full settle
    assert keeper.full_settles == 1 and gone() is not None
    keeper.settle()
    keeper.settle()  # the third iteration since the last full settle
    assert keeper.full_settles == 2 and gone() is None


def test_a_failed_iteration_makes_the_next_settle_a_full_one() -> None:
    keeper = HeapKeeper(full_every=100)
    keeper.settle()
    gone = _cycle()
    keeper.settle()
    assert gone() is not None
    keeper.failed()
    keeper.settle(iteration=False)
    assert keeper.full_settles == 2 and gone() is None
