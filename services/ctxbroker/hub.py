"""In-memory view of the store for the hot path: cached lists, long-poll wake-ups, replica sync.

Why a cache: 10,000 agents long-polling one context all wake on the same new entry. Reading
the database 10,000 times, or even encoding the same JSON 10,000 times, is what would make
the broker slow; so each process keeps every context's list in memory, wakes waiters with
one ``asyncio.Event`` per context, and caches the encoded answer per "after" id until the
list changes. The store stays the source of truth: the cache only ever appends what the
store returned, in id order.

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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from services.ctxbroker.core import Entry, entries_after
from services.ctxbroker.store import NOTIFY_CHANNEL, ContextRow, Store

log = logging.getLogger("epu.ctxbroker.hub")


@dataclass
class Waiter:
    """A parked long-poll. ``direct`` (when given) writes a 200 answer straight to the client's
    transport and returns True if it did; ``answered`` then tells the request's task not to."""

    after: int
    direct: Callable[[bytes], bool] | None
    answered: bool = False


@dataclass
class CtxState:
    row: ContextRow
    entries: list[Entry] = field(default_factory=list)
    event: asyncio.Event = field(default_factory=asyncio.Event)
    encoded: dict[int, bytes] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    deleted: bool = False
    parked: dict[int, Waiter] = field(default_factory=dict)

    @property
    def last_id(self) -> int:
        return self.entries[-1].entry_id if self.entries else 0

    def wake(self, answer: bool = True) -> int:
        """Wake every parked long-poll. With ``answer``, first write each one's answer directly
        (one tight loop over transports) so the last agent is not served only after 10,000 task
        switches; the tasks then just finish."""
        old, self.event = self.event, asyncio.Event()
        self.encoded.clear()
        parked, self.parked = self.parked, {}
        direct = 0
        if answer and not self.deleted:
            for w in parked.values():
                if w.direct is not None and not w.answered:
                    w.answered = w.direct(self.encode_after(w.after))
                    direct += w.answered
        old.set()
        return direct

    def encode_after(self, after: int) -> bytes:
        """The JSON answer to "entries after ``after``", cached while the list does not change."""
        body = self.encoded.get(after)
        if body is None:
            items = entries_after(self.entries, after)
            body = json.dumps({"context_id": self.row.id, "last_id": self.last_id,
                               "entries": [e.as_dict() for e in items]}, separators=(",", ":")).encode()
            if len(self.encoded) > 256:
                self.encoded.clear()
            self.encoded[after] = body
        return body


class Hub:
    """Cache + waiters for one broker process. Async methods run on the server's event loop."""

    def __init__(self, store: Store, refresh_interval: float = 0.5) -> None:
        self.store = store
        self.refresh_interval = refresh_interval
        self.contexts: dict[str, CtxState] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._closing = False
        self._listen_stop = threading.Event()
        self._listener: threading.Thread | None = None
        self.waiting = 0
        self.requests = 0
        self._next_key = 0
        self.direct_answers = 0
        self.last_wake: dict[str, float] = {}

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        rows = await asyncio.to_thread(self.store.list_contexts)
        for row in rows:
            await self._load(row)
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
            st.wake(answer=False)

    @property
    def closing(self) -> bool:
        return self._closing

    # ------------------------------------------------------------------ reads
    async def get(self, context_id: str) -> CtxState | None:
        """The cached context, loading it on a miss (it may have been created by another replica)."""
        st = self.contexts.get(context_id)
        if st is not None:
            return st
        row = await asyncio.to_thread(self.store.get_context, context_id)
        if row is None:
            return None
        return await self._load(row)

    async def wait_after(self, st: CtxState, after: int, wait: float,
                         direct: Callable[[bytes], bool] | None = None) -> bytes | None:
        """Entries after ``after``; if none and ``wait`` > 0, wait up to ``wait`` s for one.
        Returns None when ``direct`` already wrote the answer."""
        if st.last_id <= after and wait > 0 and not self._closing:
            ev = st.event
            waiter = Waiter(after, direct)
            key = self._next_key = self._next_key + 1
            st.parked[key] = waiter
            self.waiting += 1
            try:
                async with asyncio.timeout(wait):
                    await ev.wait()
            except TimeoutError:
                pass
            finally:
                self.waiting -= 1
                st.parked.pop(key, None)
            if waiter.answered:
                return None
        return st.encode_after(after)

    # ------------------------------------------------------------------ changes
    async def refresh(self, context_id: str) -> None:
        """Bring one context up to date with the store and wake its waiters if it moved."""
        st = self.contexts.get(context_id)
        if st is None:
            row = await asyncio.to_thread(self.store.get_context, context_id)
            if row is not None:
                await self._load(row)
            return
        async with st.lock:
            row = await asyncio.to_thread(self.store.get_context, context_id)
            if row is None:
                self.drop(context_id)
                return
            if row.last_id > st.last_id:
                new = await asyncio.to_thread(self.store.entries, context_id, st.last_id)
                # only append in order; a gap means a concurrent append not yet visible: reload all
                if new and new[0].entry_id == st.last_id + 1:
                    st.entries.extend(new)
                else:
                    st.entries = await asyncio.to_thread(self.store.entries, context_id, 0)
                t0 = time.perf_counter()
                n = st.wake()
                self.direct_answers += n
                self.last_wake = {"answered": n, "seconds": round(time.perf_counter() - t0, 4)}

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

    async def _load(self, row: ContextRow) -> CtxState:
        existing = self.contexts.get(row.id)
        if existing is not None:
            return existing
        items = await asyncio.to_thread(self.store.entries, row.id, 0)
        st = self.contexts.setdefault(row.id, CtxState(row=row, entries=items))
        return st

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
