"""The provisioner's durable memory: launches, instances and every transition (SQLAlchemy Core).

Why it looks like this:

* **Intent first** (rule 3): ``record_launch`` stores the launch before any cloud call, in one
  transaction with the instance row and its first transition. A duplicate request finds the
  row and makes nothing new.
* **Forward only** (rule 4): ``advance`` asks ``states.check_transition`` and applies the
  answer with a compare-and-set on the per-instance ``seq``, so two threads or two
  provisioner processes racing on one record cannot both win or move it back.
* **History and an outbox**: every transition is a row in ``prov_transitions`` with its time,
  reason and a ``published`` flag. The thread that made a transition publishes it and marks
  it; a crash in between leaves it unpublished and the outbox sweep publishes it later. So
  each transition is published once in normal operation and at least once across crashes —
  consumers drop repeats by ``seq``.

SQLite (the default) serializes writers: transactions start with ``BEGIN IMMEDIATE`` and a
process-wide lock queues this process's threads, so nothing spins on "database is locked".
PostgreSQL runs the same statements.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Boolean,
    Column,
    Float,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    and_,
    bindparam,
    event,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.pool import StaticPool

from common.db import create_schema, make_engine
from common.messages import InstanceEvent, LaunchRequest
from services.provisioner.states import check_transition, is_terminal

metadata = MetaData()

launches = Table(
    "prov_launches", metadata,
    Column("launch_id", String(128), primary_key=True),
    Column("domain", String(64), nullable=False),
    Column("site", String(64), nullable=False),
    Column("node_name", String(253), nullable=False),
    Column("cores", Integer, nullable=False, default=1),
    Column("attributes", Text, nullable=False, default="{}"),
    Column("requested_at", Float, nullable=False),
    Column("cloud_attempts", Integer, nullable=False, default=0),
    Column("last_attempt_at", Float),
)

instances = Table(
    "prov_instances", metadata,
    Column("instance_id", String(128), primary_key=True),
    Column("domain", String(64), nullable=False, index=True),
    Column("site", String(64), nullable=False, index=True),
    Column("node_name", String(253), nullable=False, default=""),
    Column("cores", Integer, nullable=False, default=0),
    Column("state", String(16), nullable=False, index=True),
    Column("seq", Integer, nullable=False),
    Column("cloud_id", String(256), index=True),
    Column("ip", String(64)),
    Column("reason", Text, nullable=False, default=""),
    Column("error_kind", String(16)),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
)

transitions = Table(
    "prov_transitions", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("instance_id", String(128), nullable=False, index=True),
    Column("seq", Integer, nullable=False),
    Column("from_state", String(16)),
    Column("to_state", String(16), nullable=False),
    Column("at", Float, nullable=False),
    Column("reason", Text, nullable=False, default=""),
    Column("error_kind", String(16)),
    Column("published", Boolean, nullable=False, default=False, index=True),
    UniqueConstraint("instance_id", "seq", name="uq_prov_transition_seq"),
)


# Prebuilt statements for the launch path: building a statement per call costs more Python
# time than SQLite spends running it (measured by bench/bench_provisioner.py).
_INS_LAUNCH = insert(launches)
_INS_INSTANCE = insert(instances)
_INS_TRANSITION = insert(transitions)
_SEL_INSTANCE = select(instances).where(instances.c.instance_id == bindparam("iid"))
_SEL_JOIN = (select(instances, launches.c.attributes, launches.c.requested_at, launches.c.cloud_attempts)
             .join(launches, launches.c.launch_id == instances.c.instance_id, isouter=True)
             .where(instances.c.instance_id == bindparam("iid")))
_COUNT_ACTIVE = select(func.count()).select_from(instances).where(
    instances.c.site == bindparam("site"), instances.c.state.not_in(["terminated", "failed"]))
_UPD_ATTEMPT = (update(launches).where(launches.c.launch_id == bindparam("lid"))
                .values(cloud_attempts=launches.c.cloud_attempts + 1, last_attempt_at=bindparam("at")))
_UPD_ADVANCE = (update(instances)
                .where(instances.c.instance_id == bindparam("iid"), instances.c.seq == bindparam("old_seq"))
                .values(state=bindparam("new_state"), seq=bindparam("new_seq"), updated_at=bindparam("at"),
                        reason=bindparam("new_reason"), error_kind=bindparam("new_kind"),
                        cloud_id=func.coalesce(bindparam("new_cloud_id", type_=String), instances.c.cloud_id),
                        ip=func.coalesce(bindparam("new_ip", type_=String), instances.c.ip)))


@dataclass(frozen=True)
class InstanceRecord:
    instance_id: str
    domain: str
    site: str
    node_name: str
    cores: int
    state: str
    seq: int
    cloud_id: str | None
    ip: str | None
    reason: str
    error_kind: str | None
    created_at: float
    updated_at: float

    @property
    def terminal(self) -> bool:
        return is_terminal(self.state)


@dataclass(frozen=True)
class LaunchRecord:
    launch_id: str
    domain: str
    site: str
    node_name: str
    cores: int
    attributes: dict[str, str]
    requested_at: float
    cloud_attempts: int


@dataclass(frozen=True)
class Transition:
    """One stored state change, and the event that announces it."""

    id: int
    record: InstanceRecord
    previous: str | None
    at: float

    def event(self) -> InstanceEvent:
        r = self.record
        return InstanceEvent(
            instance_id=r.instance_id, domain=r.domain, site=r.site or "unknown", state=r.state,  # type: ignore[arg-type]
            previous=self.previous, seq=r.seq, node_name=r.node_name, ip=r.ip, cloud_id=r.cloud_id,  # type: ignore[arg-type]
            cores=r.cores, reason=r.reason, error_kind=r.error_kind, at=self.at,  # type: ignore[arg-type]
        )


def _instance(row: Any) -> InstanceRecord:
    m = row._mapping
    return InstanceRecord(**{k: m[k] for k in InstanceRecord.__dataclass_fields__})


def _launch(row: Any) -> LaunchRecord:
    m = row._mapping
    return LaunchRecord(launch_id=m["launch_id"], domain=m["domain"], site=m["site"], node_name=m["node_name"],
                        cores=m["cores"], attributes=json.loads(m["attributes"] or "{}"),
                        requested_at=m["requested_at"], cloud_attempts=m["cloud_attempts"])


class Store:
    """Launches, instances and transitions in one SQL database (SQLite or PostgreSQL)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.is_sqlite = url.startswith("sqlite")
        kwargs: dict[str, Any] = {}
        if self.is_sqlite and (url in ("sqlite://", "sqlite:///:memory:")):
            kwargs["poolclass"] = StaticPool  # one shared in-memory database for every thread
        self.engine: Engine = make_engine(url, **kwargs)
        if self.is_sqlite:
            _sqlite_immediate_transactions(self.engine)
        self._write_lock = threading.RLock() if self.is_sqlite else None
        self._marks_lock = threading.Lock()
        self._marks: list[int] = []
        create_schema(self.engine, metadata)

    def close(self) -> None:
        try:
            self.flush_marks()
        except Exception:  # closing anyway; unmarked events are re-sent by the next outbox sweep
            pass
        self.engine.dispose()

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        with self.engine.connect() as conn:
            yield conn.execution_options(epu_read_only=True)

    @contextmanager
    def _tx(self) -> Iterator[Connection]:
        with self._write_lock or nullcontext(), self.engine.begin() as conn:
            self._write_marks(conn)
            yield conn

    def _write_marks(self, conn: Connection) -> None:
        with self._marks_lock:
            ids, self._marks = self._marks, []
        if ids:
            conn.execute(update(transitions).where(transitions.c.id.in_(ids)).values(published=True))

    # ------------------------------------------------------------------ launches
    def record_launch(self, req: LaunchRequest, now: float) -> tuple[InstanceRecord, Transition | None]:
        """Store the intent. Returns the record and its first transition, or ``(existing, None)``
        for a request already stored (a duplicate or a redelivery)."""
        try:
            with self._tx() as conn:
                conn.execute(_INS_LAUNCH, dict(
                    launch_id=req.launch_id, domain=req.domain, site=req.site, node_name=req.node_name,
                    cores=req.cores, attributes=json.dumps(dict(req.attributes), sort_keys=True),
                    requested_at=now, cloud_attempts=0, last_attempt_at=None))
                conn.execute(_INS_INSTANCE, dict(
                    instance_id=req.launch_id, domain=req.domain, site=req.site, node_name=req.node_name,
                    cores=req.cores, state="requested", seq=1, cloud_id=None, ip=None, reason="",
                    error_kind=None, created_at=now, updated_at=now))
                tid = conn.execute(_INS_TRANSITION, dict(
                    instance_id=req.launch_id, seq=1, from_state=None, to_state="requested", at=now,
                    reason="launch requested", error_kind=None, published=False)).inserted_primary_key[0]
        except IntegrityError:
            existing = self.get(req.launch_id)
            if existing is None:
                raise
            return existing, None
        rec = InstanceRecord(instance_id=req.launch_id, domain=req.domain, site=req.site, node_name=req.node_name,
                             cores=req.cores, state="requested", seq=1, cloud_id=None, ip=None, reason="",
                             error_kind=None, created_at=now, updated_at=now)
        return rec, Transition(tid, rec, None, now)

    @staticmethod
    def _split(row: Any) -> tuple[InstanceRecord | None, LaunchRecord | None]:
        if row is None:
            return None, None
        rec = _instance(row)
        m = row._mapping
        if m["requested_at"] is None:
            return rec, None
        return rec, LaunchRecord(launch_id=rec.instance_id, domain=rec.domain, site=rec.site,
                                 node_name=rec.node_name, cores=rec.cores,
                                 attributes=json.loads(m["attributes"] or "{}"), requested_at=m["requested_at"],
                                 cloud_attempts=m["cloud_attempts"])

    def get_with_launch(self, instance_id: str) -> tuple[InstanceRecord | None, LaunchRecord | None]:
        """The instance and its launch in one read."""
        with self._read() as conn:
            return self._split(conn.execute(_SEL_JOIN, {"iid": instance_id}).first())

    def begin_attempt(self, instance_id: str, now: float) -> tuple[InstanceRecord | None, LaunchRecord | None]:
        """Read instance and launch and, if the instance is still ``requested``, count a cloud
        attempt — one transaction. The returned launch holds the count from *before* this
        attempt: ``> 0`` means an earlier attempt may have reached the cloud."""
        with self._tx() as conn:
            rec, launch = self._split(conn.execute(_SEL_JOIN, {"iid": instance_id}).first())
            if rec is not None and launch is not None and rec.state == "requested":
                conn.execute(_UPD_ATTEMPT, {"lid": instance_id, "at": now})
        return rec, launch

    def get_launch(self, launch_id: str) -> LaunchRecord | None:
        with self._read() as conn:
            row = conn.execute(select(launches).where(launches.c.launch_id == launch_id)).first()
        return _launch(row) if row else None

    def launch_ids(self, ids: list[str]) -> set[str]:
        if not ids:
            return set()
        with self._read() as conn:
            rows = conn.execute(select(launches.c.launch_id).where(launches.c.launch_id.in_(ids))).all()
        return {r[0] for r in rows}

    def note_cloud_attempt(self, launch_id: str, now: float) -> None:
        """Count a create call before it is made: after a crash, ``> 0`` means "look in the cloud first"."""
        with self._tx() as conn:
            conn.execute(update(launches).where(launches.c.launch_id == launch_id).values(
                cloud_attempts=launches.c.cloud_attempts + 1, last_attempt_at=now))

    # ------------------------------------------------------------------ instances
    def get(self, instance_id: str) -> InstanceRecord | None:
        with self._read() as conn:
            row = conn.execute(_SEL_INSTANCE, {"iid": instance_id}).first()
        return _instance(row) if row else None

    def list(self, *, domain: str | None = None, site: str | None = None,
             states: tuple[str, ...] | list[str] | None = None, active_only: bool = False) -> list[InstanceRecord]:
        q = select(instances)
        if domain:
            q = q.where(instances.c.domain == domain)
        if site:
            q = q.where(instances.c.site == site)
        if states:
            q = q.where(instances.c.state.in_(list(states)))
        if active_only:
            q = q.where(instances.c.state.not_in(["terminated", "failed"]))
        with self._read() as conn:
            return [_instance(r) for r in conn.execute(q.order_by(instances.c.created_at, instances.c.instance_id))]

    def advance(self, instance_id: str, new_state: str, now: float, *, reason: str = "",
                error_kind: str | None = None, cloud_id: str | None = None,
                ip: str | None = None, expect: InstanceRecord | None = None) -> Transition | None:
        """Move a record forward, or do nothing (returns ``None``) when the move is not allowed.

        ``cloud_id``/``ip`` are stored with the transition when given. ``expect`` is the record
        as the caller last read it: tried first (saves a read), re-read if it is stale."""
        with self._tx() as conn:
            for _ in range(20):
                if expect is not None:
                    rec, expect = expect, None
                else:
                    row = conn.execute(_SEL_INSTANCE, {"iid": instance_id}).first()
                    if row is None:
                        return None
                    rec = _instance(row)
                if not check_transition(rec.state, new_state).allowed:
                    return None  # states only move forward, so a stale record's "no" is final too
                values: dict[str, Any] = {"state": new_state, "seq": rec.seq + 1, "updated_at": now,
                                          "reason": reason, "error_kind": error_kind}
                if cloud_id is not None:
                    values["cloud_id"] = cloud_id
                if ip is not None:
                    values["ip"] = ip
                res = conn.execute(_UPD_ADVANCE, {
                    "iid": instance_id, "old_seq": rec.seq, "new_state": new_state, "new_seq": rec.seq + 1,
                    "at": now, "new_reason": reason, "new_kind": error_kind, "new_cloud_id": cloud_id,
                    "new_ip": ip})
                if res.rowcount != 1:
                    continue  # someone else moved it: re-read and re-check
                tid = conn.execute(_INS_TRANSITION, dict(
                    instance_id=instance_id, seq=rec.seq + 1, from_state=rec.state, to_state=new_state,
                    at=now, reason=reason, error_kind=error_kind, published=False)).inserted_primary_key[0]
                new = InstanceRecord(**{**rec.__dict__, **values})
                return Transition(tid, new, rec.state, now)
        return None

    def set_cloud_fields(self, instance_id: str, *, cloud_id: str | None = None, ip: str | None = None,
                         now: float | None = None) -> None:
        """Remember what the cloud told us without a state change (e.g. an IP that came late)."""
        values: dict[str, Any] = {}
        if cloud_id is not None:
            values["cloud_id"] = cloud_id
        if ip is not None:
            values["ip"] = ip
        if not values:
            return
        if now is not None:
            values["updated_at"] = now
        with self._tx() as conn:
            conn.execute(update(instances).where(instances.c.instance_id == instance_id).values(**values))

    def record_unknown_terminated(self, instance_id: str, domain: str, now: float,
                                  reason: str) -> tuple[InstanceRecord, Transition | None]:
        """A terminate for an id we never launched: record it as terminated, so a launch
        that arrives later for the same id is not started either."""
        try:
            with self._tx() as conn:
                conn.execute(insert(instances).values(
                    instance_id=instance_id, domain=domain, site="", node_name="", cores=0,
                    state="terminated", seq=1, cloud_id=None, ip=None, reason=reason, error_kind=None,
                    created_at=now, updated_at=now))
                tid = conn.execute(insert(transitions).values(
                    instance_id=instance_id, seq=1, from_state=None, to_state="terminated", at=now,
                    reason=reason, error_kind=None, published=False)).inserted_primary_key[0]
        except IntegrityError:
            rec = self.get(instance_id)
            assert rec is not None
            return rec, None
        rec = self.get(instance_id)
        assert rec is not None
        return rec, Transition(tid, rec, None, now)

    # ------------------------------------------------------------------ history and outbox
    def history(self, instance_id: str) -> list[dict[str, Any]]:
        with self._read() as conn:
            rows = conn.execute(select(transitions).where(transitions.c.instance_id == instance_id)
                                .order_by(transitions.c.seq)).all()
        return [dict(r._mapping) for r in rows]

    def mark_published(self, transition_ids: list[int]) -> None:
        """Note transitions as published. The mark rides along with the next write transaction
        (or ``flush_marks``): a crash before that only means the outbox publishes them again,
        which consumers drop by ``seq`` — and it saves a commit per event."""
        with self._marks_lock:
            self._marks.extend(transition_ids)

    def flush_marks(self) -> None:
        with self._marks_lock:
            if not self._marks:
                return
        with self._tx():
            pass

    def unpublished(self, older_than: float, limit: int = 500) -> list[Transition]:
        """Transitions stored but never announced (their publisher crashed), oldest first."""
        self.flush_marks()
        q = (select(transitions, instances).join(instances, instances.c.instance_id == transitions.c.instance_id)
             .where(and_(transitions.c.published.is_(False), transitions.c.at <= older_than))
             .order_by(transitions.c.id).limit(limit))
        out = []
        with self._read() as conn:
            for row in conn.execute(q):
                m = row._mapping
                rec = _instance(row)
                # the event carries the state of *that* transition, not the record's latest
                rec = InstanceRecord(**{**rec.__dict__, "state": m["to_state"], "seq": m["seq"],
                                        "reason": m["reason"], "error_kind": m["error_kind"]})
                out.append(Transition(m["id"], rec, m["from_state"], m["at"]))
        return out

    def active_count(self, site: str) -> int:
        """Instances at ``site`` that are not terminal (what a site quota counts)."""
        with self._read() as conn:
            return int(conn.execute(_COUNT_ACTIVE, {"site": site}).scalar_one())

    def counts(self) -> dict[str, int]:
        with self._read() as conn:
            rows = conn.execute(select(instances.c.state, func.count()).group_by(instances.c.state)).all()
        return {r[0]: int(r[1]) for r in rows}


def _sqlite_immediate_transactions(engine: Engine) -> None:
    """pysqlite's own transaction handling defers BEGIN; a deferred reader that later writes can
    fail with SQLITE_BUSY without waiting. Take the write lock at BEGIN instead (SQLAlchemy's
    documented recipe)."""

    @event.listens_for(engine, "connect")
    def _no_implicit_begin(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None

    @event.listens_for(engine, "begin")
    def _begin_immediate(conn: Any) -> None:
        read_only = conn.get_execution_options().get("epu_read_only")
        conn.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")
