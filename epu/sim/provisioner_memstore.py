"""The provisioner's store held in process memory, behind the same interface as ``store.Store``.

Why it exists: the simulators (``epu sim``, ``epu simulate``) run the real provisioner core for
thousands of virtual hours, and profiling showed most of their time in SQLAlchemy building and
running statements (a poll reads every live record as SQL rows). This store keeps the same
records, transitions, outbox, miss and sighting memory and identity in dicts, with the same
semantics — intent first, forward-only transitions with a compare-and-set on ``seq``, marks that
ride along with the next write, rows returned in the order SQLite returns them — so the core
cannot tell the difference. ``tests/conformance/`` runs every store test against
both. Production uses ``Store`` (SQLite or PostgreSQL); nothing configures this one.

Durability is modelled the way a database file is: a ``MemoryDatabase`` holds the data and
outlives the ``MemoryStore`` handles opened on it (a simulated process that crashes loses its
handle and its unflushed marks, not the database). ``before_write`` is called before each write
transaction touches anything, as a database refusing writes would refuse it (the simulator's
store faults).
"""

from __future__ import annotations

import bisect
import json
import operator
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from sqlalchemy.exc import IntegrityError

from epu.common.messages import LaunchRequest
from epu.services.provisioner.records import (
    DestroyRecord,
    Identity,
    IdentityError,
    InstanceRecord,
    LaunchRecord,
    Miss,
    Sighting,
    Transition,
    cloud_field_values,
    ended_at,
    new_identity_value,
)
from epu.services.provisioner.states import check_transition

_ENDED = ("terminated", "failed")
_ROW_ORDER = operator.attrgetter("created_at", "instance_id")
"""The order ``list`` answers in (the SQL store's ORDER BY)."""
_CHANGES_KEPT = 1 << 14
"""Most record ids ``MemoryDatabase.changes`` keeps (past this, the older half is dropped)."""


@lru_cache(maxsize=256)
def _allowed(current: str, new: str) -> bool:
    """``check_transition(current, new).allowed``, remembered: a pure function of two states, asked
    at every transition."""
    return check_transition(current, new).allowed


def _evolve(rec: InstanceRecord, **changes: Any) -> InstanceRecord:
    """``dataclasses.replace(rec, **changes)`` for the record's own fields, ~3.5x faster (every
    transition makes one; ``replace`` calls the frozen ``__init__``, one ``object.__setattr__``
    per field): a new record with the old one's field values, then the changed ones — the same
    field values in the same order, so equal, hashed and shown alike. ``InstanceRecord`` has no
    ``__post_init__`` and nothing but its fields in its ``__dict__``."""
    new = object.__new__(InstanceRecord)
    values = new.__dict__
    values.update(rec.__dict__)
    values.update(changes)
    return new


class _Rollback(Exception):  # noqa: N818 - a signal, not an error
    """Inside ``_tx``: undo the transaction (nothing was changed yet but the marks)."""


@dataclass
class _Launch:
    launch_id: str
    domain: str
    site: str
    node_name: str
    cores: int
    attributes: str
    requested_at: float
    cloud_attempts: int = 0
    last_attempt_at: float | None = None

    def record(self) -> LaunchRecord:
        return LaunchRecord(launch_id=self.launch_id, domain=self.domain, site=self.site, node_name=self.node_name,
                            cores=self.cores, attributes=json.loads(self.attributes or "{}"),
                            requested_at=self.requested_at, cloud_attempts=self.cloud_attempts)


@dataclass
class MemoryDatabase:
    """What a database file holds: every table of ``store.metadata``, as dicts in row order."""

    launches: dict[str, _Launch] = field(default_factory=dict)
    instances: dict[str, InstanceRecord] = field(default_factory=dict)
    """Insertion (rowid) order, as SQLite scans a table or an index on one value."""
    live: dict[str, dict[str, None]] = field(default_factory=dict)
    """site → ids of its records not terminated or failed, in insertion order."""
    ended: list[tuple[float, str]] = field(default_factory=list)
    """(updated_at, id) each time a record was stored terminated or failed, sorted: with ``live``,
    what ``list`` of live or recently ended records reads instead of every record ever (a month of
    ``epu simulate`` holds tens of thousands). Entries of a record stored again are kept (the
    record itself is checked)."""
    transitions: list[dict[str, Any]] = field(default_factory=list)
    """Row ``id`` is its index + 1 (ids are never reused: rows are never deleted)."""
    unpublished: dict[int, None] = field(default_factory=dict)
    by_instance: dict[str, list[int]] = field(default_factory=dict)
    meta: dict[str, str] = field(default_factory=dict)
    misses: dict[str, Miss] = field(default_factory=dict)
    sightings: dict[tuple[str, str], Sighting] = field(default_factory=dict)
    destroys: list[DestroyRecord] = field(default_factory=list)
    """The destroy ledger (``prov_destroys``), in row order."""
    lock: threading.RLock = field(default_factory=threading.RLock)
    version: int = 0
    """Moves with every record stored (``MemoryStore._put``): what a read kept may be reused
    while it has not moved."""
    changes: list[str] = field(default_factory=list)
    """The id of each record stored, in order: ``changes[k]`` moved ``version`` to
    ``changes_base + k + 1`` (``version == changes_base + len(changes)``). A read kept at an
    older version is patched with the records stored since (``_live_or_updated_since``) instead
    of read again; only the latest ``_CHANGES_KEPT`` are kept (an older read is made afresh)."""
    changes_base: int = 0

    def copy(self) -> MemoryDatabase:
        """A backup: an independent database with the same rows (records are immutable)."""
        with self.lock:
            return MemoryDatabase(
                launches={k: replace(v) for k, v in self.launches.items()}, instances=dict(self.instances),
                live={k: dict(v) for k, v in self.live.items()}, ended=list(self.ended), transitions=[dict(t) for t in self.transitions],
                unpublished=dict(self.unpublished), by_instance={k: list(v) for k, v in self.by_instance.items()},
                meta=dict(self.meta), misses=dict(self.misses), sightings=dict(self.sightings),
                destroys=list(self.destroys))


class _Tx:
    """``MemoryStore._tx``'s context manager, written out as a class: what a generator under
    ``contextlib.contextmanager`` did (the same steps, in the same order), without building a
    generator and its wrapper per write — a busy simulation writes some 100k times."""

    __slots__ = ("store", "lock", "ids", "started")

    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self.started = False

    def __enter__(self) -> Callable[[], None]:
        store = self.store
        self.lock = lock = store.db.lock
        lock.acquire()
        try:
            with store._marks_lock:
                self.ids, store._marks = store._marks, []
            if self.ids:
                self.write()
        except BaseException:
            lock.release()
            raise
        return self.write

    def write(self) -> None:
        """Called before the transaction's first change: ``before_write`` may refuse it."""
        if not self.started:
            self.started = True
            if self.store.before_write is not None:
                self.store.before_write()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> bool:
        try:
            if kind is not None:
                return issubclass(kind, _Rollback)  # rolled back: swallowed, marks lost
            db = self.store.db
            for i in self.ids:
                db.unpublished.pop(i, None)
                db.transitions[i - 1]["published"] = True
            return False
        finally:
            self.lock.release()


class MemoryStore:
    """One process's handle on a ``MemoryDatabase`` — the interface of ``store.Store``."""

    def __init__(self, db: MemoryDatabase | None = None, url: str = "memory://") -> None:
        self.db = db if db is not None else MemoryDatabase()
        self.url = url
        self.is_sqlite = False
        self.before_write: Callable[[], None] | None = None
        """Called before a write transaction changes anything; raising refuses the write."""
        self._marks: list[int] = []
        self._marks_lock = threading.Lock()
        self._site_records: dict[str, tuple[MemoryDatabase, int, dict[str, InstanceRecord]]] = {}
        """Per site, the live records ``records_for`` read last, with the database and its
        ``version`` then."""
        self._recent: tuple[MemoryDatabase, int, int, list[InstanceRecord], float] | None = None
        """The last answer of ``_live_or_updated_since``, with the database, its ``version``, the
        first ``ended`` entry it kept and its ``since``."""

    def close(self) -> None:
        try:
            self.flush_marks()
        except Exception:  # closing anyway; unmarked events are re-sent by the next outbox sweep
            pass

    # ------------------------------------------------------------------ transactions
    def _tx(self) -> _Tx:
        """A write transaction (``_Tx``). The yielded function is called before the first change
        (it may refuse the write). Pending marks ride along, as in ``Store``: taken at the start,
        applied only if the transaction commits — a transaction that fails or is rolled back
        (``_Rollback``: a duplicate key) loses them, and the outbox publishes those events again."""
        return _Tx(self)

    def _put(self, rec: InstanceRecord) -> None:
        db = self.db
        db.version += 1
        changes = db.changes
        changes.append(rec.instance_id)
        if len(changes) > _CHANGES_KEPT:
            drop = len(changes) - _CHANGES_KEPT // 2
            del changes[:drop]
            db.changes_base += drop
        old = db.instances.get(rec.instance_id)
        if old is not None and old.site != rec.site:  # found at another site than first recorded
            db.live.get(old.site, {}).pop(rec.instance_id, None)
        db.instances[rec.instance_id] = rec
        live = db.live.setdefault(rec.site, {})
        if rec.state in _ENDED:
            live.pop(rec.instance_id, None)
            bisect.insort(db.ended, (rec.updated_at, rec.instance_id))
        else:
            live[rec.instance_id] = None

    def _transition(self, rec: InstanceRecord, previous: str | None, at: float, reason: str,
                    presumed_gone: bool | None) -> int:
        db = self.db
        tid = len(db.transitions) + 1
        db.transitions.append(dict(id=tid, instance_id=rec.instance_id, seq=rec.seq, from_state=previous,
                                   to_state=rec.state, at=at, reason=reason, error_kind=rec.error_kind,
                                   published=False, presumed_gone=presumed_gone))
        db.unpublished[tid] = None
        db.by_instance.setdefault(rec.instance_id, []).append(tid)
        return tid

    # ------------------------------------------------------------------ launches
    def record_launch(self, req: LaunchRequest, now: float,
                      price: float | None = None) -> tuple[InstanceRecord, Transition | None]:
        duplicate = False
        with self._tx() as write:
            write()
            if req.launch_id in self.db.launches or req.launch_id in self.db.instances:
                duplicate = True
                raise _Rollback
            self.db.launches[req.launch_id] = _Launch(
                launch_id=req.launch_id, domain=req.domain, site=req.site, node_name=req.node_name, cores=req.cores,
                attributes=json.dumps(dict(req.attributes), sort_keys=True), requested_at=now)
            rec = InstanceRecord(instance_id=req.launch_id, domain=req.domain, site=req.site,
                                 node_name=req.node_name, cores=req.cores, state="requested", seq=1, cloud_id=None,
                                 ip=None, reason="", error_kind=None, created_at=now, updated_at=now,
                                 instance_type=req.instance_type, price_per_hour=price)
            self._put(rec)
            tid = self._transition(rec, None, now, "launch requested", None)
        if duplicate:  # a redelivery: the record as stored
            existing = self.get(req.launch_id)
            if existing is None:
                raise IntegrityError("INSERT prov_launches", None, Exception("launch id taken"))
            return existing, None
        return rec, Transition(tid, rec, None, now)

    def get_with_launch(self, instance_id: str) -> tuple[InstanceRecord | None, LaunchRecord | None]:
        with self.db.lock:
            rec = self.db.instances.get(instance_id)
            launch = self.db.launches.get(instance_id)
            return rec, (launch.record() if rec is not None and launch is not None else None)

    def begin_attempt(self, instance_id: str, now: float) -> tuple[InstanceRecord | None, LaunchRecord | None]:
        with self._tx() as write:
            rec, launch = self.get_with_launch(instance_id)
            if rec is not None and launch is not None and rec.state == "requested":
                write()
                row = self.db.launches[instance_id]
                row.cloud_attempts += 1
                row.last_attempt_at = now
        return rec, launch

    def get_launch(self, launch_id: str) -> LaunchRecord | None:
        with self.db.lock:
            row = self.db.launches.get(launch_id)
            return row.record() if row is not None else None

    def launch_ids(self, ids: list[str]) -> set[str]:
        with self.db.lock:
            return {i for i in ids if i in self.db.launches}

    def note_cloud_attempt(self, launch_id: str, now: float) -> None:
        with self._tx() as write:
            write()
            row = self.db.launches.get(launch_id)
            if row is not None:
                row.cloud_attempts += 1
                row.last_attempt_at = now

    # ------------------------------------------------------------------ instances
    def get(self, instance_id: str) -> InstanceRecord | None:
        with self.db.lock:
            return self.db.instances.get(instance_id)

    def list(self, *, domain: str | None = None, site: str | None = None,
             states: tuple[str, ...] | list[str] | None = None, active_only: bool = False,
             live_or_updated_since: float | None = None) -> list[InstanceRecord]:
        if live_or_updated_since is not None and not (domain or site or states or active_only):
            return self._live_or_updated_since(live_or_updated_since)
        with self.db.lock:
            out = [r for r in self._candidates(states, active_only, live_or_updated_since)
                   if (live_or_updated_since is None or r.state not in _ENDED
                       or r.updated_at >= live_or_updated_since)
                   and (not domain or r.domain == domain) and (not site or r.site == site)
                   and (not states or r.state in states) and (not active_only or r.state not in _ENDED)]
        out.sort(key=_ROW_ORDER)
        return out

    def _live_or_updated_since(self, since: float) -> list[InstanceRecord]:
        """``list(live_or_updated_since=since)`` alone — the provisioner's anti-entropy report,
        every minute —, the same answer with less work per record: the live ones are kept as
        they are (``db.live`` holds no ended record), only those stored ended since ``since``
        are checked."""
        db = self.db
        with db.lock:
            ended = db.ended
            start = bisect.bisect_left(ended, (since, ""))
            hit = self._recent
            if hit is not None and hit[0] is db:
                if hit[1] == db.version and hit[2] == start:
                    # No record stored since (``version``), and the horizon passed no ended record
                    # (the same first entry of ``ended`` it keeps): the very same answer.
                    return list(hit[3])
                patched = self._patched(hit[1], hit[3], hit[4], since, start)
                if patched is not None:
                    self._recent = (db, db.version, start, patched, since)
                    return list(patched)
            ids: dict[str, None] = {}
            for site_ids in db.live.values():
                ids.update(site_ids)
            n_live = len(ids)
            for _, iid in ended[start:]:
                ids[iid] = None
            inst = db.instances
            recs = [inst[i] for i in ids]
            out = recs[:n_live]
            out += [r for r in recs[n_live:] if r.state not in _ENDED or r.updated_at >= since]
            out.sort(key=_ROW_ORDER)
            self._recent = (db, db.version, start, out, since)
        return list(out)

    def _patched(self, version: int, answer: list[InstanceRecord], before: float, since: float,
                 start: int) -> list[InstanceRecord] | None:
        """``_live_or_updated_since(since)`` from its answer at ``version`` for ``before`` (a
        busy store stores a record every few seconds, so the report's read rarely finds nothing
        stored): only the records stored since (``changes``) and the ended ones the horizon may
        have passed (``ended`` entries from ``before`` to ``since``) can have joined or left it;
        every other record is the very object it was, in the answer exactly when it was. Those
        few are taken out (found by their row key, not by a scan) and, if they belong, put back in row order (``_ROW_ORDER`` is unique:
        it ends with the id, and a record's ``created_at`` never changes). ``None``: read it
        afresh (the horizon moved back, or too much changed). Called under the lock."""
        db = self.db
        first = version - db.changes_base
        if since < before or first < 0 or db.version - version > len(answer):
            return None
        moved = set(db.changes[first:])
        ended = db.ended
        moved.update(iid for _, iid in ended[bisect.bisect_left(ended, (before, "")):start])
        inst = db.instances
        out = answer.copy()
        for iid in moved:
            # Taken out where it sits, if it is there: ``answer`` is in row order and a record's
            # ``created_at`` never changes, so its row key is the current record's; a key that
            # does not order (NaN) leaves the scan to a fresh read.
            at = inst[iid].created_at
            if at != at:
                return None
            i = bisect.bisect_left(out, (at, iid), key=_ROW_ORDER)
            if i < len(out) and out[i].instance_id == iid:
                del out[i]
        for iid in moved:
            rec = inst[iid]
            if rec.state not in _ENDED or rec.updated_at >= since:
                bisect.insort(out, rec, key=_ROW_ORDER)
        return out

    def _candidates(self, states: tuple[str, ...] | list[str] | None, active_only: bool,
                    since: float | None) -> Iterable[InstanceRecord]:
        """A superset of the records ``list`` keeps, each once: the live ones (``db.live``) plus,
        for ``live_or_updated_since``, those stored ended since then (``db.ended``); every record
        when the filters may keep old ended ones. The caller filters and sorts, so the answer is
        the full scan's."""
        db = self.db
        live_only = active_only or (states is not None and len(states) > 0 and not any(s in _ENDED for s in states))
        if not live_only and since is None:
            return db.instances.values()
        ids: dict[str, None] = {}
        for site_ids in db.live.values():
            ids.update(site_ids)
        if not live_only:
            ended = db.ended
            for _, iid in ended[bisect.bisect_left(ended, (since, "")):]:
                ids[iid] = None
        return [db.instances[i] for i in ids]

    def advance(self, instance_id: str, new_state: str, now: float, *, reason: str = "",
                error_kind: str | None = None, cloud_id: str | None = None,
                ip: str | None = None, expect: InstanceRecord | None = None,
                proof: str | None = None) -> Transition | None:
        with self._tx() as write:
            rec = self.db.instances.get(instance_id)
            if rec is None:
                return None
            if not _allowed(rec.state, new_state):
                return None
            write()
            presumed = None if new_state == "terminating" else rec.presumed_gone_at
            new = _evolve(rec, state=new_state, seq=rec.seq + 1, updated_at=now, reason=reason,
                          error_kind=error_kind, presumed_gone_at=presumed, ended_at=ended_at(rec, new_state, now),
                          cloud_id=rec.cloud_id if cloud_id is None else cloud_id, ip=rec.ip if ip is None else ip,
                          end_proof=rec.end_proof if proof is None else proof)
            self._put(new)
            tid = self._transition(new, rec.state, now, reason, presumed is not None)
        return Transition(tid, new, rec.state, now)

    def note_presence(self, instance_id: str, presumed_gone: bool, now: float, reason: str) -> Transition | None:
        with self._tx() as write:
            rec = self.db.instances.get(instance_id)
            if rec is None or rec.terminal or rec.presumed_gone == presumed_gone:
                return None
            write()
            new = _evolve(rec, seq=rec.seq + 1, updated_at=now, reason=reason,
                          presumed_gone_at=now if presumed_gone else None)
            self._put(new)
            tid = self._transition(new, rec.state, now, reason, presumed_gone)
        return Transition(tid, new, rec.state, now)

    def reopen(self, instance_id: str, state: str, now: float, reason: str, *, cloud_id: str,
               ip: str | None = None) -> Transition | None:
        """As ``Store.reopen``: a ``failed`` record whose node is listed alive, reopened."""
        if state not in ("pending", "started"):
            raise ValueError(f"a failed record is reopened as pending or started, not {state!r}")
        with self._tx() as write:
            rec = self.db.instances.get(instance_id)
            if rec is None or rec.state != "failed":
                return None
            write()
            new = _evolve(rec, state=state, seq=rec.seq + 1, updated_at=now, reason=reason, error_kind=None,
                          presumed_gone_at=None, cloud_id=cloud_id, ip=rec.ip if ip is None else ip, ended_at=None,
                          reopened_seq=rec.seq + 1)
            self._put(new)
            tid = self._transition(new, "failed", now, reason, False)
        return Transition(tid, new, "failed", now)

    def records_version(self) -> int:
        """Equal values: no record was stored in between (by any handle on this database), so
        ``records_for`` answers with the very same records (``epu.sim.quiet_poll`` skips a steady
        poll on it)."""
        return self.db.version

    def records_for(self, site: str, launch_ids: Iterable[str]) -> dict[str, InstanceRecord]:
        """The site's live records in row order, then the other listed ones by id — SQLite's
        order for the same OR query (one index, then the other)."""
        launch_ids = set(launch_ids)
        with self.db.lock:
            db = self.db
            if not launch_ids:  # a poll's read: the same as last time while no record was stored
                hit = self._site_records.get(site)
                if hit is not None and hit[0] is db and hit[1] == db.version:
                    return dict(hit[2])
            inst = db.instances
            out = {i: inst[i] for i in db.live.get(site, ())}
            if not launch_ids:
                self._site_records[site] = (db, db.version, out)
                return dict(out)
            for i in sorted(launch_ids):
                if i not in out and i in inst:
                    out[i] = inst[i]
        return out

    def set_cloud_fields(self, instance_id: str, *, cloud_id: str | None = None, ip: str | None = None,
                         now: float | None = None, site: str | None = None) -> None:
        values = cloud_field_values(cloud_id=cloud_id, ip=ip, site=site, now=now)
        if not values:
            return
        with self._tx() as write:
            write()
            rec = self.db.instances.get(instance_id)
            if rec is not None:
                self._put(_evolve(rec, **values))

    def touch(self, instance_id: str, now: float, reason: str) -> None:
        with self._tx() as write:
            write()
            rec = self.db.instances.get(instance_id)
            if rec is not None:
                self._put(_evolve(rec, updated_at=now, reason=reason))

    def record_found(self, instance_id: str, domain: str, state: str, now: float, reason: str, *,
                     site: str = "", node_name: str = "", cloud_id: str | None = None,
                     ip: str | None = None, proof: str | None = None) -> tuple[InstanceRecord, Transition | None]:
        with self._tx() as write:
            write()
            existing = self.db.instances.get(instance_id)
            if existing is not None:
                raise _Rollback
            rec = InstanceRecord(instance_id=instance_id, domain=domain, site=site, node_name=node_name, cores=0,
                                 state=state, seq=1, cloud_id=cloud_id, ip=ip, reason=reason, error_kind=None,
                                 created_at=now, updated_at=now, ended_at=now if state in _ENDED else None,
                                 end_proof=proof)
            self._put(rec)
            tid = self._transition(rec, None, now, reason, None)
        if existing is not None:
            return existing, None
        return rec, Transition(tid, rec, None, now)

    # ------------------------------------------------------------------ destroys
    def record_destroy(self, d: DestroyRecord) -> None:
        with self._tx() as write:
            write()
            self.db.destroys.append(d)

    def destroys(self, *, instance_id: str | None = None, cloud_id: str | None = None,
                 limit: int = 100) -> list[DestroyRecord]:
        """The latest ``limit`` matches, read from the newest back (the simulator's invariant 2
        asks for a node's last destroy at every destroy call)."""
        rows: list[DestroyRecord] = []
        with self.db.lock:
            for d in reversed(self.db.destroys):
                if len(rows) >= limit:
                    break
                if (instance_id is None or d.instance_id == instance_id) and (cloud_id is None or d.cloud_id == cloud_id):
                    rows.append(d)
        rows.reverse()
        return rows

    # ------------------------------------------------------------------ identity
    def claim_identity(self, configured: str | None = None,
                       new_id: Callable[[], str] = new_identity_value) -> Identity:
        """As ``Store.claim_identity`` (the same rules, the same messages)."""
        held = dict(self.db.meta)
        if "store_id" not in held:
            self._meta_insert("store_id", new_id()[:16])
        deployment = held.get("deployment")
        if deployment is None:
            if configured:
                value = configured
            elif self.db.instances:
                raise IdentityError(
                    f"provisioner.deployment: the store {self.url} holds instances launched before "
                    "deployment identities were stored; set provisioner.deployment to the epu-deployment "
                    "tag they carry (the old default was 'epu')")
            else:
                value = "epu-" + new_id()[:12]
            self._meta_insert("deployment", value)
        held = dict(self.db.meta)
        if configured and held["deployment"] != configured:
            raise IdentityError(
                f"provisioner.deployment is {configured!r} but the store {self.url} belongs to "
                f"deployment {held['deployment']!r}: provisioners sharing a store must share its deployment "
                "(remove the key to use the store's)")
        return Identity(held["deployment"], held["store_id"])

    def _meta_insert(self, key: str, value: str) -> None:
        with self._tx() as write:
            write()
            if key in self.db.meta:
                raise _Rollback  # another process on this store claimed it first: theirs stands
            self.db.meta[key] = value

    # ------------------------------------------------------------------ observation memory
    def misses(self, site: str) -> dict[str, Miss]:
        with self.db.lock:
            return {k: m for k, m in self.db.misses.items() if m.site == site}

    def save_misses(self, put: list[Miss], clear: list[str]) -> None:
        if not put and not clear:
            return
        with self._tx() as write:
            write()
            for i in clear:
                self.db.misses.pop(i, None)
            for m in put:
                self.db.misses[m.instance_id] = m

    def sightings(self, site: str) -> dict[str, Sighting]:
        """By cloud id, as SQLite reads them through the (site, cloud_id) key."""
        with self.db.lock:
            return {c: s for (st, c), s in sorted(self.db.sightings.items()) if st == site}

    def save_sightings(self, site: str, put: list[Sighting], forget: list[str]) -> None:
        if not put and not forget:
            return
        with self._tx() as write:
            write()
            for c in forget:
                self.db.sightings.pop((site, c), None)
            for s in put:
                self.db.sightings[(s.site, s.cloud_id)] = s

    # ------------------------------------------------------------------ history and outbox
    def history(self, instance_id: str) -> list[dict[str, Any]]:
        with self.db.lock:
            rows = [dict(self.db.transitions[i - 1]) for i in self.db.by_instance.get(instance_id, ())]
        return sorted(rows, key=lambda r: r["seq"])

    def mark_published(self, transition_ids: list[int]) -> None:
        with self._marks_lock:
            self._marks.extend(transition_ids)

    def flush_marks(self) -> None:
        with self._marks_lock:
            if not self._marks:
                return
        with self._tx():
            pass

    def unpublished(self, older_than: float, limit: int = 500) -> list[Transition]:
        self.flush_marks()
        out: list[Transition] = []
        with self.db.lock:
            for tid in self.db.unpublished:
                t = self.db.transitions[tid - 1]
                if t["at"] > older_than:
                    continue
                cur = self.db.instances[t["instance_id"]]
                rec = _evolve(cur, state=t["to_state"], seq=t["seq"], reason=t["reason"], error_kind=t["error_kind"],
                              presumed_gone_at=t["at"] if t["presumed_gone"] else None)
                out.append(Transition(tid, rec, t["from_state"], t["at"]))
                if len(out) >= limit:
                    break
        return out

    def lives(self, since: float, until: float) -> list[InstanceRecord]:
        """As ``Store.lives``: the records billed for some of [since, until), oldest first."""
        with self.db.lock:
            out = [r for r in self.db.instances.values()
                   if r.created_at < until and (r.ended_at is None or r.ended_at > since)]
        out.sort(key=_ROW_ORDER)
        return out

    def active_count(self, site: str, instance_type: str | None = None) -> int:
        with self.db.lock:
            live = self.db.live.get(site, {})
            if instance_type is None:
                return len(live)
            return sum(1 for i in live if self.db.instances[i].instance_type == instance_type)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        with self.db.lock:
            for r in self.db.instances.values():
                out[r.state] = out.get(r.state, 0) + 1
        return dict(sorted(out.items()))
