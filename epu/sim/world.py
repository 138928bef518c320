"""The world: one virtual clock, one event queue, random streams derived from one seed.

Why everything goes through here: a run must replay bit for bit from its seed. So nothing in
a run reads the wall clock, nothing sleeps, no thread runs, and every random choice comes
from a stream named after what it decides (``world.rng("cloud/boot")``), derived from the
seed — adding a new random choice somewhere does not shift the draws of the others. Events
at the same virtual instant run in the order they were scheduled (a sequence number breaks
ties), and the ``digest`` folds every event's time and label into a hash, which the replay
test compares between two runs of the same seed.

Identifiers: the cores make ids with ``uuid.uuid4()`` (launch ids, command ids, message
ids). Inside ``World.running()`` that function draws from the world's ``ids`` stream instead,
so ids are part of the replay too; outside it, nothing is changed.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import random
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

_push = heapq.heappush
_new, _set, _UUID, _UNKNOWN = object.__new__, object.__setattr__, uuid.UUID, uuid.SafeUUID.unknown
get_ident = threading.get_ident
_CLEAR = ~((0xC000 << 48) | (0xF000 << 64))
"""The variant and version bits of a UUID's int (``uuid.UUID.__init__`` with ``version``)."""
_V4 = (0x8000 << 48) | (4 << 76)

T0 = 1_700_000_000.0
"""Virtual epoch of every run (2023-11-14): timestamps look like real ones in traces."""


class Event:
    """One scheduled call that can be cancelled (``World.at``/``after``). A plain slotted class,
    not a dataclass (the heap orders ``(at, seq, event, None)`` tuples: it is never compared)."""

    __slots__ = ("at", "seq", "fn", "label", "cancelled")

    def __init__(self, at: float, seq: int, fn: Callable[[], None], label: str = "",
                 cancelled: bool = False) -> None:
        self.at = at
        self.seq = seq
        self.fn = fn
        self.label = label
        self.cancelled = cancelled

    def __repr__(self) -> str:
        return f"Event(at={self.at!r}, seq={self.seq!r}, label={self.label!r}, cancelled={self.cancelled!r})"

    def cancel(self) -> None:
        self.cancelled = True


class World:
    """Virtual time and the event queue. ``run_until`` pops events in time order.

    The queue holds ``(at, seq, fn, label)`` tuples. ``call_at``/``call_after`` push those and
    return nothing: the commonest scheduling (a delivery, a timer's next tick), without an
    ``Event`` object per call. ``at``/``after`` return an ``Event`` that can be cancelled: they
    push ``(at, seq, event, None)`` and ``run_until`` reads the event when it pops it. Both kinds
    share one sequence counter, so the order is exactly that of one kind alone."""

    _FLUSH = 2048
    """Digest lines kept before they are hashed (``_fold``): bounded memory on long chunks."""

    def __init__(self, seed: int, start: float = T0, id_prefix_bits: int = 0) -> None:
        self.seed = seed
        self.start = start
        self.id_prefix_bits = id_prefix_bits
        """When set (1..60): the first 64 bits of every id drawn inside ``running`` — the part a
        generated node name carries (``planner.NAME_ID_CHARS``) — come from this many random bits
        only, so names collide; the rest stays random, so ids stay unique."""
        self.t = start
        self._queue: list[tuple[float, int, Any, str | None]] = []
        """(at, seq, fn, label) or (at, seq, event, None): the heap compares the tuple's numbers in
        C (``seq`` is unique, so what follows it is never compared)."""
        self._next_seq = itertools.count().__next__
        """The next sequence number (bound once: every scheduled event takes one)."""
        self._rngs: dict[str, random.Random] = {}
        self._digest = hashlib.blake2b(digest_size=16)
        self._lines: list[str] = []
        """Digest lines not yet hashed. Why: BLAKE2b is a stream, so hashing their concatenation
        once gives the same bytes as one ``update`` per line, for one call per ``_FLUSH`` lines."""
        self.events = 0
        """Events run so far (exact whenever no ``run_until`` is running: it counts locally)."""
        self.after_event: list[Callable[[], None]] = []
        """Called after every event (the invariant checkers hook in here)."""
        self.trace: list[str] | None = None
        """When a list, every labelled event and note is appended to it (``epu sim --trace``)."""

    # ------------------------------------------------------------------ randomness
    def rng(self, name: str) -> random.Random:
        """The random stream named ``name``: seeded from (seed, name) with SHA-512 (``random``'s
        string seeding), so it does not depend on PYTHONHASHSEED or on other streams."""
        r = self._rngs.get(name)
        if r is None:
            r = self._rngs[name] = random.Random(f"{self.seed}/{name}")
        return r

    # ------------------------------------------------------------------ scheduling
    def at(self, when: float, fn: Callable[[], None], label: str = "") -> Event:
        """Run ``fn`` at ``when`` (not before now); the returned event can be cancelled."""
        t = self.t
        if when < t:
            when = t
        seq = self._next_seq()
        ev = Event(when, seq, fn, label)
        _push(self._queue, (when, seq, ev, None))
        return ev

    def after(self, delay: float, fn: Callable[[], None], label: str = "") -> Event:
        """``at(t + max(0, delay))``; the returned event can be cancelled."""
        when = self.t + delay if delay > 0.0 else self.t + 0.0
        seq = self._next_seq()
        ev = Event(when, seq, fn, label)
        _push(self._queue, (when, seq, ev, None))
        return ev

    def call_at(self, when: float, fn: Callable[[], None], label: str = "") -> None:
        """``at`` without an event to cancel (cheaper: nothing but the queue's tuple)."""
        t = self.t
        _push(self._queue, (t if when < t else when, self._next_seq(), fn, label))

    def call_after(self, delay: float, fn: Callable[[], None], label: str = "") -> None:
        """``after`` without an event to cancel (the commonest call of a run: deliveries, timers)."""
        _push(self._queue, (self.t + delay if delay > 0.0 else self.t + 0.0, self._next_seq(), fn, label))

    def note(self, text: str) -> None:
        """Fold something that happened into the run's digest (replay check)."""
        self._lines.append(f"{self.t:.6f} {text}\n")
        if self.trace is not None:
            self.trace.append(f"{self.t - self.start:10.3f}  {text}")

    def _fold(self) -> None:
        """Hash the lines kept so far, in order (see ``_lines``)."""
        lines = self._lines
        if lines:
            self._digest.update("".join(lines).encode())
            lines.clear()

    @property
    def digest(self) -> str:
        self._fold()
        return self._digest.hexdigest()

    @property
    def elapsed(self) -> float:
        return self.t - self.start

    def run_until(self, end: float) -> None:
        queue = self._queue
        hooks = self.after_event
        pop = heapq.heappop  # a month's run pops millions of events
        lines = self._lines
        add = lines.append
        flush = self._FLUSH
        n = 0
        try:
            while queue and queue[0][0] <= end:
                at, _, fn, label = pop(queue)
                if label is None:  # an Event (``at``/``after``)
                    if fn.cancelled:
                        continue
                    label = fn.label
                    fn = fn.fn
                self.t = at
                n += 1
                if label:
                    add(f"{at:.6f} {label}\n")
                    if len(lines) >= flush:
                        self._fold()
                    if self.trace is not None:
                        self.trace.append(f"{at - self.start:10.3f}  {label}")
                fn()
                if hooks:
                    for hook in hooks:
                        hook()
        finally:
            self.events += n
        self.t = max(self.t, end)

    # ------------------------------------------------------------------ ids
    @contextmanager
    def running(self) -> Iterator[World]:
        """Make ``uuid.uuid4`` draw from this world's ``ids`` stream while the run lasts — for
        the thread that runs it only: the patch is process-wide, and another thread's id (a
        service thread of a test that ran before, still reconnecting) must neither come from the
        stream nor move it, or the run's ids, and its digest, would depend on that thread."""
        draw = self.rng("ids").getrandbits
        original = uuid.uuid4
        small = self.id_prefix_bits
        owner = threading.get_ident()

        def few(_n: int) -> int:
            """128 bits whose upper half (a generated name's part) has only ``small`` random bits."""
            return (draw(small) << 64) | draw(64)

        bits = few if small else draw

        def uuid4() -> uuid.UUID:
            """``uuid.UUID(int=bits(128), version=4)``, as its ``__init__`` builds it (variant and
            version bits set, ``is_safe`` unknown) without its argument checks: a run makes an id
            for every message and launch."""
            if get_ident() != owner:
                return original()
            u = _new(_UUID)
            _set(u, "int", bits(128) & _CLEAR | _V4)
            _set(u, "is_safe", _UNKNOWN)
            return u

        uuid.uuid4 = uuid4  # type: ignore[assignment]
        try:
            yield self
        finally:
            uuid.uuid4 = original  # type: ignore[assignment]


class WorldClock:
    """The ``Clock`` every simulated process gets: its host's wall clock — virtual time plus an
    ``offset`` (a skew, or a step by NTP either way) and a ``drift`` (a crystal running fast or
    slow) — and a ``monotonic`` clock that neither steps nor drifts (as CLOCK_MONOTONIC does not
    step; its real drift, the same crystal's, is not modelled). Nothing may sleep in the simulator."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.offset = 0.0
        self.drift = 0.0
        """Seconds the wall clock gains per second (1e-4: a crystal 100 ppm fast)."""
        self._drift_since = 0.0

    def now(self) -> float:
        t = self.world.t
        if self.drift:
            return t + self.offset + self.drift * (t - self._drift_since)
        return t + self.offset

    def set_drift(self, rate: float) -> None:
        """Run ``rate`` seconds per second fast (negative: slow) from now on; ``now()`` does not jump."""
        t = self.world.t
        self.offset += self.drift * (t - self._drift_since)
        self._drift_since, self.drift = t, rate

    def step(self, seconds: float) -> None:
        """The clock is set ``seconds`` forward (negative: back), as NTP steps it."""
        self.offset += seconds

    def error(self) -> float:
        """How far this wall clock is from the world's true time now (seconds, + ahead)."""
        return self.now() - self.world.t

    def monotonic(self) -> float:
        return self.world.t

    def sleep(self, seconds: float) -> None:
        """Waits inside a core (a retry's backoff) take no virtual time: the simulator models
        API latency with the delay before a cloud task runs instead."""


def no_sleep(_seconds: float) -> None:
    """A ``sleep`` for code paths that would wait in real time (retries): no time passes."""
