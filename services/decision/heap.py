"""Keeping the cyclic garbage collector off the decision engine's long-lived working set.

Why: at 50,000 nodes a new snapshot brings big young containers (the node index, the name sets,
lists of 50,000 entries) and the iteration after it builds more (the view's parts); CPython's
young-generation collections then walk them again and again — ~10 ms of a ~75 ms iteration — and
every few snapshots a full collection walks the whole working set (~250 ms at 50,000 nodes, ~1 s
at 1,000 domains). Almost none of it is cyclic garbage (tens of objects per iteration): the
working set dies by reference counting when the next snapshot or write replaces it.

So the service *settles* the heap after each accepted snapshot and after each iteration:
``gc.freeze()`` moves every object the collector tracks into the permanent generation, which no
collection walks (constant time: the generations' lists are spliced). Frozen objects are still
freed by reference counting as usual; only a frozen *cycle* that becomes garbage waits — until the
next full settle, which unfreezes, collects everything once and freezes again: the first settle,
then every ``full_every`` iterations (~250 ms at 50,000 nodes: ~1 ms per iteration; counted per
iteration, not per snapshot — 1,000 domains send 1,000 snapshots a round), and the settle
after an iteration that raised (a traceback is a cycle that may hold a frame's big locals). So
leaked cycles stay bounded (tens of objects per iteration measured). The settle does not look at
how many objects are frozen: ``gc.get_freeze_count()`` walks the whole frozen list (~30 ms at
50,000 nodes — measured, it made the iteration slower than no freezing at all). A larger first
threshold keeps the young collections that still run (inside one iteration) from re-walking the
iteration's own new lists.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass


@dataclass
class HeapKeeper:
    """Freezes the working set after snapshots and iterations; a full collection now and then
    (see module)."""

    threshold0: int = 10_000
    full_every: int = 240
    _settles: int = 0
    _dirty: bool = True
    full_settles: int = 0

    def install(self) -> None:
        """Raise the young generation's threshold (the older two keep the interpreter's)."""
        t0, t1, t2 = gc.get_threshold()
        gc.set_threshold(max(self.threshold0, t0), t1, t2)

    def failed(self) -> None:
        """An iteration raised: the next settle collects everything (see module)."""
        self._dirty = True

    def settle(self, *, iteration: bool = True) -> None:
        """Freeze what is live now (constant time); collect everything first when due. After a
        snapshot (``iteration=False``) only a pending full settle (the first, after a failure) runs."""
        if iteration:
            self._settles += 1
        if self._dirty or self._settles >= self.full_every:
            self.full()
        else:
            gc.freeze()

    def full(self) -> None:
        """One full collection of everything (frozen included), then freeze the survivors."""
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        self._settles = 0
        self._dirty = False
        self.full_settles += 1
