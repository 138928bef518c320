"""The provisioner's durable memory: launches, instances and every transition (SQLAlchemy Core).

Why it looks like this:

* **Intent first** (rule 3): ``record_launch`` stores the launch before any cloud call, in one
  transaction with the instance row and its first transition. A duplicate request finds the
  row and makes nothing new.
* **Forward only** (rule 4): ``advance`` asks ``states.check_transition`` and applies the
  answer with a compare-and-set on the per-instance ``seq``, so two threads or two
  provisioner processes racing on one record cannot both win or move it back.
* **Presence is not a state.** A node the cloud stopped listing is *presumed gone*: a flag
  (``presumed_gone_at``) on the record, announced with its own ``seq`` but no state change, so
  a node that is listed again is re-adopted without moving anything backwards (rule 4), and
  nothing is ever destroyed or closed on a presumption. The miss history behind it
  (``prov_misses``), the first sightings of nodes the store does not know (``prov_sightings``)
  and the deployment identity (``prov_meta``) live here too, so a restart neither forgets
  them nor starts a grace period over.
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
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

from epu.common.db import create_schema, make_engine
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
from epu.services.provisioner.states import check_transition, is_terminal
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
    delete,
    event,
    func,
    insert,
    inspect,
    select,
    update,
)
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.pool import StaticPool

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
    Column("presumed_gone_at", Float),
    Column("instance_type", String(64)),
    Column("price_per_hour", Float),
    Column("ended_at", Float),
    Column("reopened_seq", Integer),
    Column("end_proof", String(16)),
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
    Column("presumed_gone", Boolean),
    UniqueConstraint("instance_id", "seq", name="uq_prov_transition_seq"),
)

meta = Table(
    "prov_meta", metadata,
    Column("key", String(64), primary_key=True),
    Column("value", Text, nullable=False),
)

destroys = Table(
    "prov_destroys", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("at", Float, nullable=False),
    Column("site", String(64), nullable=False),
    Column("cloud_id", String(256), nullable=False, index=True),
    Column("instance_id", String(128), nullable=False, default="", index=True),
    Column("proof", String(16), nullable=False),
    Column("why", Text, nullable=False, default=""),
)

misses = Table(
    "prov_misses", metadata,
    Column("instance_id", String(128), primary_key=True),
    Column("site", String(64), nullable=False, index=True),
    Column("count", Integer, nullable=False),
    Column("first_at", Float, nullable=False),
    Column("last_at", Float, nullable=False),
)

sightings = Table(
    "prov_sightings", metadata,
    Column("site", String(64), primary_key=True),
    Column("cloud_id", String(256), primary_key=True),
    Column("launch_id", String(128), nullable=False, default=""),
    Column("kind", String(16), nullable=False),
    Column("first_seen", Float, nullable=False),
    Column("last_seen", Float, nullable=False),
)

#: Columns added after the first release: ``Store`` adds them to an older database (all nullable).
LATER_COLUMNS = {"prov_instances": ("presumed_gone_at", "instance_type", "price_per_hour", "ended_at", "reopened_seq",
                                   "end_proof"),
                 "prov_transitions": ("presumed_gone",)}


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
                        presumed_gone_at=bindparam("new_presumed", type_=Float),
                        ended_at=func.coalesce(instances.c.ended_at, bindparam("new_ended", type_=Float)),
                        end_proof=func.coalesce(bindparam("new_proof", type_=String), instances.c.end_proof),
                        cloud_id=func.coalesce(bindparam("new_cloud_id", type_=String), instances.c.cloud_id),
                        ip=func.coalesce(bindparam("new_ip", type_=String), instances.c.ip)))


def _instance(row: Any) -> InstanceRecord:
    m = row._mapping
    rec = {k: m[k] for k in InstanceRecord.__dataclass_fields__}
    rec["instance_type"] = rec["instance_type"] or ""
    return InstanceRecord(**rec)


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
        # an in-memory database is one connection shared by every thread: a read's BEGIN inside
        # another thread's open transaction fails, so reads queue behind writes there too
        self._read_lock = self._write_lock if "poolclass" in kwargs else None
        self._marks_lock = threading.Lock()
        self._marks: list[int] = []
        create_schema(self.engine, metadata)
        add_later_columns(self.engine)

    def close(self) -> None:
        try:
            self.flush_marks()
        except Exception:  # closing anyway; unmarked events are re-sent by the next outbox sweep
            pass
        self.engine.dispose()

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        with self._read_lock or nullcontext(), self.engine.connect() as conn:
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
    def record_launch(self, req: LaunchRequest, now: float,
                      price: float | None = None) -> tuple[InstanceRecord, Transition | None]:
        """Store the intent, with the price per hour its type has now (``price``; None: unknown).
        Returns the record and its first transition, or ``(existing, None)`` for a request
        already stored (a duplicate or a redelivery)."""
        try:
            with self._tx() as conn:
                conn.execute(_INS_LAUNCH, dict(
                    launch_id=req.launch_id, domain=req.domain, site=req.site, node_name=req.node_name,
                    cores=req.cores, attributes=json.dumps(dict(req.attributes), sort_keys=True),
                    requested_at=now, cloud_attempts=0, last_attempt_at=None))
                conn.execute(_INS_INSTANCE, dict(
                    instance_id=req.launch_id, domain=req.domain, site=req.site, node_name=req.node_name,
                    cores=req.cores, state="requested", seq=1, cloud_id=None, ip=None, reason="",
                    error_kind=None, created_at=now, updated_at=now, instance_type=req.instance_type,
                    price_per_hour=price))
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
                             error_kind=None, created_at=now, updated_at=now, instance_type=req.instance_type,
                             price_per_hour=price)
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
             states: tuple[str, ...] | list[str] | None = None, active_only: bool = False,
             live_or_updated_since: float | None = None) -> list[InstanceRecord]:
        """``live_or_updated_since``: only records not terminal, or changed at or after that time
        (in SQL: a long-lived store holds every instance ever, and callers want the recent ones)."""
        q = select(instances)
        if live_or_updated_since is not None:
            q = q.where(instances.c.state.not_in(["terminated", "failed"])
                        | (instances.c.updated_at >= live_or_updated_since))
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
                ip: str | None = None, expect: InstanceRecord | None = None,
                proof: str | None = None) -> Transition | None:
        """Move a record forward, or do nothing (returns ``None``) when the move is not allowed.

        ``cloud_id``/``ip`` are stored with the transition when given, ``proof`` as the record's
        ``end_proof`` (the terminate that moved it to ``terminating``). ``expect`` is the record
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
                # a terminate supersedes a presumption: the node is to go either way
                presumed = None if new_state == "terminating" else rec.presumed_gone_at
                ended = ended_at(rec, new_state, now)
                values: dict[str, Any] = {"state": new_state, "seq": rec.seq + 1, "updated_at": now,
                                          "reason": reason, "error_kind": error_kind, "presumed_gone_at": presumed,
                                          "ended_at": ended}
                if cloud_id is not None:
                    values["cloud_id"] = cloud_id
                if ip is not None:
                    values["ip"] = ip
                if proof is not None:
                    values["end_proof"] = proof
                res = conn.execute(_UPD_ADVANCE, {
                    "iid": instance_id, "old_seq": rec.seq, "new_state": new_state, "new_seq": rec.seq + 1,
                    "at": now, "new_reason": reason, "new_kind": error_kind, "new_cloud_id": cloud_id,
                    "new_ip": ip, "new_presumed": presumed, "new_ended": ended, "new_proof": proof})
                if res.rowcount != 1:
                    continue  # someone else moved it: re-read and re-check
                tid = conn.execute(_INS_TRANSITION, dict(
                    instance_id=instance_id, seq=rec.seq + 1, from_state=rec.state, to_state=new_state,
                    at=now, reason=reason, error_kind=error_kind, published=False,
                    presumed_gone=presumed is not None)).inserted_primary_key[0]
                new = InstanceRecord(**{**rec.__dict__, **values})
                return Transition(tid, new, rec.state, now)
        return None

    def note_presence(self, instance_id: str, presumed_gone: bool, now: float, reason: str) -> Transition | None:
        """Set or clear the presumed-gone flag of a live record, as a transition of its own (a new
        ``seq``, the same state) so the change is announced and re-announced like any other.
        Returns ``None`` when there is nothing to change (terminal record, flag already so)."""
        with self._tx() as conn:
            for _ in range(20):
                row = conn.execute(_SEL_INSTANCE, {"iid": instance_id}).first()
                if row is None:
                    return None
                rec = _instance(row)
                if rec.terminal or rec.presumed_gone == presumed_gone:
                    return None
                flag = now if presumed_gone else None
                res = conn.execute(update(instances).where(instances.c.instance_id == instance_id,
                                                           instances.c.seq == rec.seq).values(
                    seq=rec.seq + 1, updated_at=now, reason=reason, presumed_gone_at=flag))
                if res.rowcount != 1:
                    continue
                tid = conn.execute(_INS_TRANSITION, dict(
                    instance_id=instance_id, seq=rec.seq + 1, from_state=rec.state, to_state=rec.state, at=now,
                    reason=reason, error_kind=rec.error_kind, published=False,
                    presumed_gone=presumed_gone)).inserted_primary_key[0]
                new = InstanceRecord(**{**rec.__dict__, "seq": rec.seq + 1, "updated_at": now, "reason": reason,
                                        "presumed_gone_at": flag})
                return Transition(tid, new, rec.state, now)
        return None

    def reopen(self, instance_id: str, state: str, now: float, reason: str, *, cloud_id: str,
               ip: str | None = None) -> Transition | None:
        """The one move backwards: a ``failed`` record whose node the cloud lists alive (a create
        that took effect though its answer was lost, then errors until the retries ran out) is
        reopened in the state the cloud shows (``pending``/``started``), with the next ``seq``.
        Its event says ``previous: failed``; the engine takes the instance back as live — it may
        have joined the batch system by itself — and keeps it or retires it the safe way.
        ``None`` when the record is not ``failed`` (any more)."""
        if state not in ("pending", "started"):
            raise ValueError(f"a failed record is reopened as pending or started, not {state!r}")
        with self._tx() as conn:
            for _ in range(20):
                row = conn.execute(_SEL_INSTANCE, {"iid": instance_id}).first()
                if row is None:
                    return None
                rec = _instance(row)
                if rec.state != "failed":
                    return None
                # live again, and it was all along (its node ran): billed from its launch, unbroken
                values: dict[str, Any] = {"state": state, "seq": rec.seq + 1, "updated_at": now, "reason": reason,
                                          "error_kind": None, "presumed_gone_at": None, "cloud_id": cloud_id,
                                          "ip": ip if ip is not None else rec.ip, "ended_at": None,
                                          "reopened_seq": rec.seq + 1}
                res = conn.execute(update(instances).where(
                    instances.c.instance_id == instance_id, instances.c.seq == rec.seq,
                    instances.c.state == "failed").values(**values))
                if res.rowcount != 1:
                    continue  # someone else moved it: re-read and re-check
                tid = conn.execute(_INS_TRANSITION, dict(
                    instance_id=instance_id, seq=rec.seq + 1, from_state="failed", to_state=state, at=now,
                    reason=reason, error_kind=None, published=False, presumed_gone=False)).inserted_primary_key[0]
                return Transition(tid, InstanceRecord(**{**rec.__dict__, **values}), "failed", now)
        return None

    def records_for(self, site: str, launch_ids: Iterable[str]) -> dict[str, InstanceRecord]:
        """What reconciliation compares a listing with: the site's live records and every record a
        listed node names by its launch id (live or not), in one read."""
        ids = sorted(set(launch_ids))
        live = and_(instances.c.site == site, instances.c.state.not_in(["terminated", "failed"]))
        cond = live | instances.c.instance_id.in_(ids) if ids else live
        with self._read() as conn:
            return {r.instance_id: r for r in map(_instance, conn.execute(select(instances).where(cond)))}

    def set_cloud_fields(self, instance_id: str, *, cloud_id: str | None = None, ip: str | None = None,
                         now: float | None = None, site: str | None = None) -> None:
        """Remember what the cloud told us without a state change (e.g. an IP that came late, or
        where the node of a record found by its launch id lives)."""
        values = cloud_field_values(cloud_id=cloud_id, ip=ip, site=site, now=now)
        if not values:
            return
        with self._tx() as conn:
            conn.execute(update(instances).where(instances.c.instance_id == instance_id).values(**values))

    def touch(self, instance_id: str, now: float, reason: str) -> None:
        """Note something about a record without a transition (nothing to announce): its reason
        and ``updated_at``, from which a re-drive waits."""
        with self._tx() as conn:
            conn.execute(update(instances).where(instances.c.instance_id == instance_id).values(
                updated_at=now, reason=reason))

    def record_found(self, instance_id: str, domain: str, state: str, now: float, reason: str, *,
                     site: str = "", node_name: str = "", cloud_id: str | None = None,
                     ip: str | None = None, proof: str | None = None) -> tuple[InstanceRecord, Transition | None]:
        """A record for an instance this store never launched (no launch row): one the engine
        asks to terminate (``terminating`` with the terminate's ``proof``, its node still to be
        found; ``started`` when its node runs and the terminate may not end it), or a node
        carrying this store's tags whose launch the store lost (a restored backup, a failover that
        dropped the last commits) — adopted in the state the cloud shows. Returns
        ``(existing, None)`` when the id is already recorded (a later launch request for it finds
        this record too)."""
        try:
            with self._tx() as conn:
                conn.execute(insert(instances).values(
                    instance_id=instance_id, domain=domain, site=site, node_name=node_name, cores=0,
                    state=state, seq=1, cloud_id=cloud_id, ip=ip, reason=reason, error_kind=None,
                    created_at=now, updated_at=now, ended_at=now if is_terminal(state) else None, end_proof=proof))
                tid = conn.execute(insert(transitions).values(
                    instance_id=instance_id, seq=1, from_state=None, to_state=state, at=now,
                    reason=reason, error_kind=None, published=False)).inserted_primary_key[0]
        except IntegrityError:
            rec = self.get(instance_id)
            assert rec is not None
            return rec, None
        rec = self.get(instance_id)
        assert rec is not None
        return rec, Transition(tid, rec, None, now)

    # ------------------------------------------------------------------ destroys
    def record_destroy(self, d: DestroyRecord) -> None:
        """Keep one destroy call in the ledger (before it is made: a store that cannot record
        it refuses the destroy with its error)."""
        with self._tx() as conn:
            conn.execute(insert(destroys).values(at=d.at, site=d.site, cloud_id=d.cloud_id,
                                                 instance_id=d.instance_id, proof=d.proof, why=d.why))

    def destroys(self, *, instance_id: str | None = None, cloud_id: str | None = None,
                 limit: int = 100) -> list[DestroyRecord]:
        """The latest destroy calls (of one instance or one node), oldest first."""
        q = select(destroys)
        if instance_id is not None:
            q = q.where(destroys.c.instance_id == instance_id)
        if cloud_id is not None:
            q = q.where(destroys.c.cloud_id == cloud_id)
        with self._read() as conn:
            rows = conn.execute(q.order_by(destroys.c.id.desc()).limit(limit)).all()
        return [DestroyRecord(r.at, r.site, r.cloud_id, r.instance_id, r.proof, r.why) for r in reversed(rows)]

    # ------------------------------------------------------------------ identity
    def claim_identity(self, configured: str | None = None,
                       new_id: Callable[[], str] = new_identity_value) -> Identity:
        """This store's deployment identity and store id, made at first start and kept.

        ``configured`` (``provisioner.deployment``) names the deployment explicitly; it must
        then agree with what the store holds. Without it a fresh store makes one. A store that
        already has instances but no identity predates identities: its nodes carry whatever tag
        the old configuration gave them, so it refuses to guess."""
        held = self._meta()
        if "store_id" not in held:
            self._meta_insert("store_id", new_id()[:16])
        deployment = held.get("deployment")
        if deployment is None:
            if configured:
                value = configured
            elif self._has_instances():
                raise IdentityError(
                    f"provisioner.deployment: the store {self._safe_url()} holds instances launched before "
                    "deployment identities were stored; set provisioner.deployment to the epu-deployment "
                    "tag they carry (the old default was 'epu')")
            else:
                value = "epu-" + new_id()[:12]
            self._meta_insert("deployment", value)
        held = self._meta()
        if configured and held["deployment"] != configured:
            raise IdentityError(
                f"provisioner.deployment is {configured!r} but the store {self._safe_url()} belongs to "
                f"deployment {held['deployment']!r}: provisioners sharing a store must share its deployment "
                "(remove the key to use the store's)")
        return Identity(held["deployment"], held["store_id"])

    def _meta(self) -> dict[str, str]:
        with self._read() as conn:
            return {r.key: r.value for r in conn.execute(select(meta))}

    def _meta_insert(self, key: str, value: str) -> None:
        try:
            with self._tx() as conn:
                conn.execute(insert(meta).values(key=key, value=value))
        except IntegrityError:
            pass  # another process on this store claimed it first: theirs stands

    def _has_instances(self) -> bool:
        with self._read() as conn:
            return conn.execute(select(instances.c.instance_id).limit(1)).first() is not None

    def _safe_url(self) -> str:
        return self.engine.url.render_as_string(hide_password=True)

    # ------------------------------------------------------------------ observation memory
    def misses(self, site: str) -> dict[str, Miss]:
        with self._read() as conn:
            rows = conn.execute(select(misses).where(misses.c.site == site)).all()
        return {r.instance_id: Miss(r.instance_id, r.site, r.count, r.first_at, r.last_at) for r in rows}

    def save_misses(self, put: list[Miss], clear: list[str]) -> None:
        if not put and not clear:
            return
        with self._tx() as conn:
            if clear:
                conn.execute(delete(misses).where(misses.c.instance_id.in_(list(clear))))
            self._upsert(conn, misses, ["instance_id"], [
                dict(instance_id=m.instance_id, site=m.site, count=m.count, first_at=m.first_at, last_at=m.last_at)
                for m in put])

    def sightings(self, site: str) -> dict[str, Sighting]:
        with self._read() as conn:
            rows = conn.execute(select(sightings).where(sightings.c.site == site)).all()
        return {r.cloud_id: Sighting(r.site, r.cloud_id, r.launch_id, r.kind, r.first_seen, r.last_seen)
                for r in rows}

    def save_sightings(self, site: str, put: list[Sighting], forget: list[str]) -> None:
        if not put and not forget:
            return
        with self._tx() as conn:
            if forget:
                conn.execute(delete(sightings).where(sightings.c.site == site,
                                                     sightings.c.cloud_id.in_(list(forget))))
            self._upsert(conn, sightings, ["site", "cloud_id"], [
                dict(site=s.site, cloud_id=s.cloud_id, launch_id=s.launch_id, kind=s.kind, first_seen=s.first_seen,
                     last_seen=s.last_seen) for s in put])

    def _upsert(self, conn: Connection, table: Table, keys: list[str], rows: list[dict[str, Any]]) -> None:
        """Insert or replace by primary key in one statement (two provisioners on one store may
        write the same row at once; a delete-then-insert would collide)."""
        if not rows:
            return
        if self.is_sqlite:
            from sqlalchemy.dialects.sqlite import insert as dialect_insert
        else:
            from sqlalchemy.dialects.postgresql import insert as dialect_insert
        stmt = dialect_insert(table)
        others = [c.name for c in table.columns if c.name not in keys]
        conn.execute(stmt.on_conflict_do_update(index_elements=keys,
                                                set_={c: stmt.excluded[c] for c in others}), rows)

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
                presumed = m[transitions.c.presumed_gone]
                rec = InstanceRecord(**{**rec.__dict__, "state": m["to_state"], "seq": m[transitions.c.seq],
                                        "reason": m[transitions.c.reason], "error_kind": m[transitions.c.error_kind],
                                        "presumed_gone_at": m["at"] if presumed else None})
                out.append(Transition(m["id"], rec, m["from_state"], m["at"]))
        return out

    def lives(self, since: float, until: float) -> list[InstanceRecord]:
        """Every record whose billed span — from its launch (``created_at``) to its end
        (``ended_at``; still running: open) — overlaps [``since``, ``until``), oldest first: what
        ``epu cost`` bills, read from the records themselves, whoever was watching then."""
        q = (select(instances).where(instances.c.created_at < until,
                                     instances.c.ended_at.is_(None) | (instances.c.ended_at > since))
             .order_by(instances.c.created_at, instances.c.instance_id))
        with self._read() as conn:
            return [_instance(r) for r in conn.execute(q)]

    def active_count(self, site: str, instance_type: str | None = None) -> int:
        """Instances at ``site`` that are not terminal (what a site quota counts); of one catalogue
        type only when ``instance_type`` is given (what a type quota counts)."""
        with self._read() as conn:
            if instance_type is None:
                return int(conn.execute(_COUNT_ACTIVE, {"site": site}).scalar_one())
            q = _COUNT_ACTIVE.where(func.coalesce(instances.c.instance_type, "") == instance_type)
            return int(conn.execute(q, {"site": site}).scalar_one())

    def counts(self) -> dict[str, int]:
        with self._read() as conn:
            rows = conn.execute(select(instances.c.state, func.count()).group_by(instances.c.state)).all()
        return {r[0]: int(r[1]) for r in rows}


def add_later_columns(engine: Engine) -> list[str]:
    """Bring an older database up to this schema: add the nullable columns of ``LATER_COLUMNS``
    that it lacks (``create_all`` makes missing tables, never missing columns).

    Records an older release closed as ``terminated`` because their node was not listed
    ("vanished: ...") are marked presumed gone when the column arrives, so a node of theirs that
    is listed again is left alone instead of destroyed as the node of a closed record. Records
    that ended before ``ended_at`` existed get the time of their last move to an end state (from
    ``prov_transitions``), so what they cost is still known; ``price_per_hour`` stays NULL for
    them (``epu cost`` prices those at the configuration's catalogue and says so)."""
    added: list[str] = []
    for attempt in range(5):
        have = {t: {c["name"] for c in inspect(engine).get_columns(t)} for t in LATER_COLUMNS}
        missing = [(t, c) for t, cols in LATER_COLUMNS.items() for c in cols if c not in have[t]]
        if not missing:
            return added
        try:
            with engine.begin() as conn:
                for table, column in missing:
                    col = metadata.tables[table].c[column]
                    conn.exec_driver_sql(f"ALTER TABLE {table} ADD COLUMN {column} "
                                         f"{col.type.compile(engine.dialect)}")
                    if (table, column) == ("prov_instances", "presumed_gone_at"):
                        conn.execute(update(instances).where(
                            instances.c.state == "terminated", instances.c.reason.like("vanished:%"))
                            .values(presumed_gone_at=instances.c.updated_at))
                    if (table, column) == ("prov_instances", "ended_at"):
                        last_end = (select(func.max(transitions.c.at))
                                     .where(transitions.c.instance_id == instances.c.instance_id,
                                            transitions.c.to_state.in_(["terminated", "failed"]))
                                     .scalar_subquery())
                        conn.execute(update(instances).where(instances.c.state.in_(["terminated", "failed"]))
                                     .values(ended_at=func.coalesce(last_end, instances.c.updated_at)))
                    added.append(f"{table}.{column}")
        except DBAPIError:  # another process added it meanwhile: look again
            if attempt == 4:
                raise
    return added


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


__all__ = ["LATER_COLUMNS", "DestroyRecord", "Identity", "IdentityError", "InstanceRecord", "LaunchRecord", "Miss",
           "Sighting", "Store", "Transition", "add_later_columns", "cloud_field_values", "metadata",
           "new_identity_value"]
