"""In-memory view of the store for the hot path: cached lists, long-poll wake-ups, replica sync.

Why a cache: 10,000 agents long-polling one context all wake on the same new entry. Reading
the database 10,000 times, or even encoding the same JSON 10,000 times, is what would make
the broker slow; so each process keeps every context's current members and the kept tail of
its list in memory, wakes waiters with one ``asyncio.Event`` per context, and caches the
encoded answer (entries after an id, or the snapshot) until the list changes. The store stays
the source of truth: the cache only ever appends what the store returned, in id order.

How a replica learns about entries another replica appended (documented in docs/ctxbroker.md):

* PostgreSQL: each append ``NOTIFY``s ``epu_ctxbroker`` with the context id in its
  transaction; a listener thread here ``LISTEN``s and refreshes that context at once.
* Both stores: a re-check every ``refresh_interval`` seconds of ``contexts.last_id`` (one
  small query) catches anything missed (a notification lost while reconnecting, or two
  processes on one SQLite file).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from epu.services.ctxbroker.core import Entry, answer_kind, entries_after
from epu.services.ctxbroker.store import NOTIFY_CHANNEL, ContextRow, Loaded, Store

log = logging.getLogger("epu.ctxbroker.hub")


@dataclass
class CtxState:
    """One context as this process serves it: the row, the current members (as the joins that
    made them, for snapshots) and the entries kept after ``horizon`` (for agents a few behind)."""

    row: ContextRow
    entries: list[Entry] = field(default_factory=list)
    joined: dict[str, Entry] = field(default_factory=dict)
    horizon: int = 0
    last_id: int = 0
    event: asyncio.Event = field(default_factory=asyncio.Event)
    encoded: dict[int, bytes] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    deleted: bool = False

    @classmethod
    def of(cls, loaded: Loaded) -> CtxState:
        st = cls(row=loaded.row, horizon=loaded.row.horizon, last_id=loaded.row.last_id)
        st.joined = {e.hostname: e for e in loaded.members}
        st.entries = list(loaded.entries)
        return st

    def extend(self, new: list[Entry], keep: int) -> None:
        """Append entries (ids ``last_id + 1 ...``) and fold them into the members; drop the
        oldest kept entries once there are a tenth more than ``keep`` (as the store does)."""
        for e in new:
            if e.kind == "join":
                self.joined[e.hostname] = e
            else:
                self.joined.pop(e.hostname, None)
        self.entries.extend(new)
        if new:
            self.last_id = new[-1].entry_id
        if len(self.entries) > keep + keep // 10 + 1:
            cut = len(self.entries) - keep
            self.horizon = self.entries[cut - 1].entry_id
            del self.entries[:cut]

    def wake(self) -> None:
        """Wake every parked long-poll (each then sends the cached answer for its ``after``)."""
        old, self.event = self.event, asyncio.Event()
        self.encoded.clear()
        old.set()

    def encode_after(self, after: int) -> bytes:
        """The JSON answer to "entries after ``after``", cached while the list does not change:
        the entries, or a snapshot of the members (``core.answer_kind``)."""
        kind = answer_kind(after, self.last_id, self.horizon, len(self.joined))
        cache_key = -1 if kind == "snapshot" else after
        body = self.encoded.get(cache_key)
        if body is None:
            if kind == "snapshot":
                items = sorted(self.joined.values(), key=lambda e: e.entry_id)
            else:
                items = entries_after(self.entries, after) if kind == "entries" else []
            body = json.dumps({"context_id": self.row.id, "last_id": self.last_id, "snapshot": kind == "snapshot",
                               "entries": [e.as_dict() for e in items]}, separators=(",", ":")).encode()
            if len(self.encoded) > 256:
                self.encoded.clear()
            self.encoded[cache_key] = body
        return body


class Hub:
    """Cache + waiters for one broker process. Async methods run on the server's event loop."""

    def __init__(self, store: Store, refresh_interval: float = 0.5) -> None:
        self.store = store
        self.keep = store.history_entries
        self.refresh_interval = refresh_interval
        self.contexts: dict[str, CtxState] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._closing = False
        self._listen_stop = threading.Event()
        self._listener: threading.Thread | None = None
        self.waiting = 0
        self.requests = 0
        self.last_wake: dict[str, float] = {}

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        rows = await asyncio.to_thread(self.store.list_contexts)
        for row in rows:
            await self._load(row.id)
        self._tasks.append(asyncio.create_task(self._recheck_loop(), name="ctx-recheck"))
        if self.store.is_postgres:
            self._listener = threading.Thread(target=self._listen, name="ctx-listen", daemon=True)
            self._listener.start()

    async def stop(self) -> None:
        """Wake every long-poll (so shutdown does not wait for them) and stop background work."""
        self._closing = True
        self._listen_stop.set()
        for t in self._tasks:
            t.cancel()
        for st in self.contexts.values():
            st.wake()

    @property
    def closing(self) -> bool:
        return self._closing

    # ------------------------------------------------------------------ reads
    async def get(self, context_id: str) -> CtxState | None:
        """The cached context, loading it on a miss (it may have been created by another replica)."""
        st = self.contexts.get(context_id)
        if st is not None:
            return st
        return await self._load(context_id)

    async def wait_after(self, st: CtxState, after: int, wait: float) -> bytes:
        """The answer for an agent at ``after``; if there is nothing new and ``wait`` > 0, wait
        up to ``wait`` s for a new entry first."""
        if st.last_id <= after and wait > 0 and not self._closing:
            ev = st.event
            self.waiting += 1
            try:
                async with asyncio.timeout(wait):
                    await ev.wait()
            except TimeoutError:
                pass
            finally:
                self.waiting -= 1
        return st.encode_after(after)

    # ------------------------------------------------------------------ changes
    async def refresh(self, context_id: str) -> None:
        """Bring one context up to date with the store and wake its waiters if it moved."""
        st = self.contexts.get(context_id)
        if st is None:
            await self._load(context_id)
            return
        async with st.lock:
            row = await asyncio.to_thread(self.store.get_context, context_id)
            if row is None:
                self.drop(context_id)
                return
            if row.last_id > st.last_id:
                new = await asyncio.to_thread(self.store.entries, context_id, st.last_id)
                # only append in order; a gap (entries compacted away by another replica, or a
                # concurrent append not yet visible) means: reload the whole context
                if new and new[0].entry_id == st.last_id + 1 and new[-1].entry_id - new[0].entry_id == len(new) - 1:
                    st.extend(new, self.keep)
                else:
                    loaded = await asyncio.to_thread(self.store.load, context_id)
                    if loaded is None:
                        self.drop(context_id)
                        return
                    fresh = CtxState.of(loaded)
                    st.row, st.entries, st.joined = fresh.row, fresh.entries, fresh.joined
                    st.horizon, st.last_id = fresh.horizon, fresh.last_id
                waiting = self.waiting
                t0 = time.perf_counter()
                st.wake()
                self.last_wake = {"waiting": waiting, "seconds": round(time.perf_counter() - t0, 4)}

    def drop(self, context_id: str) -> None:
        st = self.contexts.pop(context_id, None)
        if st is not None:
            st.deleted = True
            st.wake()

    def changed_threadsafe(self, context_id: str) -> concurrent.futures.Future[None] | None:
        """Called from other threads (the AMQP consumer, the LISTEN thread) after a store change.
        Returns a future done once the cache shows the change (callers that must not announce a
        change before agents can read it wait on it); ``None`` when no loop runs."""
        loop = self.loop
        if loop is None or loop.is_closed():
            return None
        return asyncio.run_coroutine_threadsafe(self._safe_refresh(context_id), loop)

    async def _safe_refresh(self, context_id: str) -> None:
        try:
            await self.refresh(context_id)
        except Exception:
            log.exception("refreshing a context failed", extra={"context": context_id})

    async def _load(self, context_id: str) -> CtxState | None:
        existing = self.contexts.get(context_id)
        if existing is not None:
            return existing
        loaded = await asyncio.to_thread(self.store.load, context_id)
        if loaded is None:
            return None
        return self.contexts.setdefault(context_id, CtxState.of(loaded))

    async def _recheck_loop(self) -> None:
        while not self._closing:
            await asyncio.sleep(self.refresh_interval)
            try:
                heads = await asyncio.to_thread(self.store.heads)
            except Exception as exc:
                log.warning("store re-check failed", extra={"error": f"{type(exc).__name__}: {exc}"})
                continue
            for cid in list(self.contexts):
                if cid not in heads:
                    self.drop(cid)
                elif heads[cid] != self.contexts[cid].last_id:
                    await self._safe_refresh(cid)

    # ------------------------------------------------------------------ PostgreSQL LISTEN
    def _listen(self) -> None:
        import psycopg

        url = self.store.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
        delay = 0.5
        while not self._listen_stop.is_set():
            try:
                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                    delay = 0.5
                    while not self._listen_stop.is_set():
                        for note in conn.notifies(timeout=0.5):
                            self.changed_threadsafe(note.payload)
            except Exception as exc:
                log.warning("LISTEN connection lost, retrying",
                            extra={"error": type(exc).__name__, "retry_in": delay})
                self._listen_stop.wait(delay)
                delay = min(delay * 2, 10.0)
