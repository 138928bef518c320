"""SQL store of contexts, their ordered lists and current members (SQLite or PostgreSQL).

Consistency across replicas: every append first bumps ``contexts.last_id`` with
``UPDATE ... RETURNING``. On PostgreSQL that row lock serializes appends to one context
across all broker processes; on SQLite the first write takes the database write lock (with
the busy timeout), so the same code is correct for two processes on one file. Entry ids are
therefore dense (1, 2, 3, ...) and identical for every reader. A join or leave that changes
nothing rolls back, so ``last_id`` only moves with a real entry.

On PostgreSQL each append also ``NOTIFY``s ``epu_ctxbroker`` so the other replicas wake
their long-polls at once (see ``services.ctxbroker.hub``).

Compaction: ``ctx_members`` always holds the current membership (with the id of the join that
made each member), so the list itself need only keep a tail for agents that are a few entries
behind. Once a context's list is ``history_entries`` longer than that (plus a tenth, so the
delete is amortized), the entries up to ``last_id - history_entries`` are deleted and
``horizon`` records it; an agent further behind is sent a snapshot (``core.answer_kind``).

Per-node credentials: a context keeps ``signing_key`` (derived from its secret, see
``epu.common.nodecred``) to check them, and ``ctx_revoked`` holds the provisioner's verdicts on
instances: reported terminated (``final``: its credential never joins again) or failed
(``active`` until the provisioner reopens the launch — its create took effect, the cloud lists
the node alive — with a higher ``seq``: then the credential joins again, issue 33). ``seq`` is
the verdict's event ``seq``, so a late or repeated event of the failure the reopening undid
revokes nothing, and a reopening older than the failure restores nothing.

Context names: ``ctx_names`` holds each name once (its primary key), with the context that
has it. ``create_context`` claims the name in the create's own transaction, so of two creates
of one name, on any number of replicas, exactly one commits (``NameTaken`` for the other).
A store made before the claim table may already hold contexts of one name: on upgrade each
name goes to its oldest context, the younger ones keep working unchanged (nothing is deleted
or renamed), and deleting the holder hands the name to the next oldest of that name, so a
name stays taken while any context has it (``_claim_names``).

Bound addresses: ``ctx_instances`` keeps each live instance's address as the provisioner
reported it (``InstanceEvent``/``InstanceReport``, ``note_instance``). A join is checked
against it, and against the addresses other members hold, in the append's own transaction
(``core.check_address``), so two joins racing for one address cannot both win.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Literal

from epu.common.db import create_schema, make_engine
from epu.services.ctxbroker.core import (
    AddressFacts,
    Caller,
    Entry,
    EntryKind,
    NodeFields,
    authorize_leave,
    check_address,
    next_entry,
)
from sqlalchemy import (
    Column,
    Float,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    delete,
    func,
    insert,
    inspect,
    select,
    text,
    update,
)
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError

NOTIFY_CHANNEL = "epu_ctxbroker"

log = logging.getLogger("epu.ctxbroker.store")

metadata = MetaData()

contexts = Table(
    "ctx_contexts", metadata,
    Column("id", String(64), primary_key=True),
    Column("name", String(63), nullable=False),
    Column("key", String(64), nullable=False, unique=True),
    Column("secret_hash", String(64), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("last_id", Integer, nullable=False, default=0),
    Column("signing_key", String(64), nullable=False, default=""),
    Column("horizon", Integer, nullable=False, default=0),
    Column("domain", String(253), nullable=False, default=""),
)

revoked = Table(
    "ctx_revoked", metadata,
    Column("instance_id", String(128), primary_key=True),
    Column("at", Float, nullable=False),
    Column("reason", Text, nullable=False, default=""),
    # the ``seq`` of the event of the latest verdict (a failure, a termination or a reopening)
    Column("seq", Integer, nullable=False, default=0),
    # 1: reported terminated — revoked for good (and every row of a store made before issue 33)
    Column("final", Integer, nullable=False, default=1),
    # 1: the credential may not join now; 0: a failed launch reopened at ``seq``
    Column("active", Integer, nullable=False, default=1),
)

#: Each context name once, with the context that has it: the unique constraint that makes a
#: duplicate create fail in its own transaction, on SQLite and PostgreSQL alike.
names = Table(
    "ctx_names", metadata,
    Column("name", String(63), primary_key=True),
    Column("context_id", String(64), ForeignKey("ctx_contexts.id", ondelete="CASCADE"), nullable=False),
)

#: What the provisioner reported of each live instance: its address (what its node may publish).
instances = Table(
    "ctx_instances", metadata,
    Column("instance_id", String(128), primary_key=True),
    Column("ip", String(45), nullable=False, index=True),
    Column("seq", Integer, nullable=False, default=0),
    Column("at", Float, nullable=False),
)

#: Columns added after the first release: (table, column, SQL type and default) for ``_upgrade``.
_ADDED_COLUMNS = (("ctx_contexts", "signing_key", "VARCHAR(64) NOT NULL DEFAULT ''"),
                  ("ctx_contexts", "horizon", "INTEGER NOT NULL DEFAULT 0"),
                  ("ctx_contexts", "domain", "VARCHAR(253) NOT NULL DEFAULT ''"),
                  ("ctx_revoked", "seq", "INTEGER NOT NULL DEFAULT 0"),
                  ("ctx_revoked", "final", "INTEGER NOT NULL DEFAULT 1"),
                  ("ctx_revoked", "active", "INTEGER NOT NULL DEFAULT 1"))

entries = Table(
    "ctx_entries", metadata,
    Column("context_id", String(64), ForeignKey("ctx_contexts.id", ondelete="CASCADE"), primary_key=True),
    Column("entry_id", Integer, primary_key=True),
    Column("kind", String(8), nullable=False),
    Column("hostname", String(63), nullable=False),
    Column("fqdn", String(254), nullable=False, default=""),
    Column("ip", String(45), nullable=False, default=""),
    Column("ssh_host_key", Text, nullable=False, default=""),
    Column("data", Text, nullable=False, default=""),
    Column("instance_id", String(128)),
    Column("reason", Text, nullable=False, default=""),
    Column("at", Float, nullable=False),
)

members = Table(
    "ctx_members", metadata,
    Column("context_id", String(64), ForeignKey("ctx_contexts.id", ondelete="CASCADE"), primary_key=True),
    Column("hostname", String(63), primary_key=True),
    Column("fqdn", String(254), nullable=False),
    Column("ip", String(45), nullable=False),
    Column("ssh_host_key", Text, nullable=False),
    Column("data", Text, nullable=False),
    Column("instance_id", String(128), index=True),
    Column("entry_id", Integer, nullable=False),
)


@dataclass(frozen=True)
class ContextRow:
    id: str
    name: str
    key: str
    secret_hash: str
    created_at: float
    last_id: int
    signing_key: str = ""
    horizon: int = 0
    """Entries up to this id were compacted away (0: the whole list is kept)."""
    domain: str = ""
    """The DNS domain of the cluster's names ("": none given): a member's fqdn is its host name
    under it (``core.check_names``)."""


@dataclass(frozen=True)
class Loaded:
    """One context read consistently: its row, current members (as the joins that made them)
    and the entries kept after ``row.horizon``."""

    row: ContextRow
    members: list[Entry]
    entries: list[Entry]


class ContextNotFound(LookupError):
    pass


class NameTaken(Exception):
    """A context of this name exists already (a second one would split a cluster's nodes
    between two lists)."""

    def __init__(self, name: str, holder: str) -> None:
        super().__init__(f"a context named {name!r} exists already (id {holder})")
        self.name = name
        self.holder = holder


Verdict = Literal["revoked", "unchanged", "stale"]
"""What ``Store.revoke`` made of a report that an instance ended."""


class Revoked(Exception):
    """The instance was reported terminated, or failed and not reopened: its credential may not join."""


def _revoked_now(conn: Connection, instance_id: str) -> bool:
    """The instance's credential may not join now (``ctx_revoked``, module docstring)."""
    return conn.execute(select(revoked.c.instance_id).where(revoked.c.instance_id == instance_id,
                                                            revoked.c.active == 1)).first() is not None


def _entry(row: object) -> Entry:
    m = row._mapping  # type: ignore[attr-defined]
    return Entry(entry_id=m["entry_id"], kind=m["kind"], hostname=m["hostname"], fqdn=m["fqdn"], ip=m["ip"],
                 ssh_host_key=m["ssh_host_key"], data=m["data"], instance_id=m["instance_id"],
                 reason=m["reason"], at=m["at"])


def _node(row: object) -> NodeFields:
    m = row._mapping  # type: ignore[attr-defined]
    return NodeFields.model_construct(hostname=m["hostname"], fqdn=m["fqdn"], ip=m["ip"],
                                      ssh_host_key=m["ssh_host_key"], data=m["data"],
                                      instance_id=m["instance_id"])


class Store:
    """Contexts and their lists. Thread-safe (one SQLAlchemy engine, a connection per call)."""

    def __init__(self, url: str, engine: Engine | None = None, history_entries: int = 1000) -> None:
        self.url = url
        self.engine = engine or make_engine(url)
        self.is_postgres = self.engine.dialect.name == "postgresql"
        self.history_entries = history_entries
        create_schema(self.engine, metadata)
        self._upgrade()
        self._claim_names()

    def _upgrade(self) -> None:
        """Add the columns a store made by an earlier version lacks (contexts created then have
        no signing key: their nodes need the context recreated to get their own credentials)."""
        inspector = inspect(self.engine)
        have = {t: {c["name"] for c in inspector.get_columns(t)} for t in {t for t, _, _ in _ADDED_COLUMNS}}
        with self.engine.begin() as conn:
            for table, column, ddl in _ADDED_COLUMNS:
                if column not in have[table]:
                    conn.execute(text(f"ALTER TABLE {table} ADD COLUMN {column} {ddl}"))

    def _claim_names(self, attempts: int = 5) -> None:
        """Give every unclaimed name to its oldest context: the upgrade of a store made before
        ``ctx_names`` (a no-op afterwards). Contexts sharing a name, which such a store may hold,
        all stay; only the oldest holds the name, and ``duplicate_names`` lists the others.

        Why the retry: two replicas upgrading one store together may both see a name unclaimed;
        the loser's insert violates the key, and a second look finds the name claimed."""
        for attempt in range(1, attempts + 1):
            try:
                with self.engine.begin() as conn:
                    self._claim_unclaimed(conn)
                break
            except IntegrityError:
                if attempt == attempts:
                    raise
                time.sleep(0.05 * attempt)
        dupes = self.duplicate_names()
        if dupes:
            log.warning(
                "contexts share a name (made before names were unique); each name is held by its "
                "oldest context, the others keep working: delete the ones not in use",
                extra={"duplicates": {n: ids for n, ids in sorted(dupes.items())}})

    def _claim_unclaimed(self, conn: Connection, name: str | None = None) -> None:
        """Claim for its oldest context each name (or only ``name``) that some context has and
        no claim holds."""
        q = (select(contexts.c.id, contexts.c.name)
             .where(~select(names.c.name).where(names.c.name == contexts.c.name).exists())
             .order_by(contexts.c.created_at, contexts.c.id))
        if name is not None:
            q = q.where(contexts.c.name == name)
        claimed: set[str] = set()
        for r in conn.execute(q).all():
            if r.name not in claimed:
                conn.execute(insert(names).values(name=r.name, context_id=r.id))
                claimed.add(r.name)

    def duplicate_names(self) -> dict[str, list[str]]:
        """name → ids (oldest first) of every name more than one context has (only a store
        made before names were unique can hold these)."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(contexts.c.name, contexts.c.id)
                                .order_by(contexts.c.created_at, contexts.c.id)).all()
        by_name: dict[str, list[str]] = {}
        for r in rows:
            by_name.setdefault(r.name, []).append(r.id)
        return {n: ids for n, ids in by_name.items() if len(ids) > 1}

    def close(self) -> None:
        self.engine.dispose()

    # ------------------------------------------------------------------ contexts
    def create_context(self, context_id: str, name: str, key: str, secret_hash: str,
                       now: float | None = None, signing_key: str = "", domain: str = "") -> ContextRow:
        row = ContextRow(context_id, name, key, secret_hash, time.time() if now is None else now, 0,
                         signing_key, 0, domain)
        try:
            with self.engine.begin() as conn:
                conn.execute(insert(contexts).values(id=row.id, name=name, key=key, secret_hash=secret_hash,
                                                     created_at=row.created_at, last_id=0,
                                                     signing_key=signing_key, horizon=0, domain=domain))
                # the name's key, in this transaction: of two creates of one name, one commits
                conn.execute(insert(names).values(name=name, context_id=context_id))
                self._notify(conn, context_id)
        except IntegrityError:
            holder = self.name_holder(name)
            if holder is None:  # not the name: an id or key collision, which the caller must see
                raise
            raise NameTaken(name, holder) from None
        return row

    def name_holder(self, name: str) -> str | None:
        """The id of the context that holds ``name`` (None: the name is free)."""
        with self.engine.connect() as conn:
            row = conn.execute(select(names.c.context_id).where(names.c.name == name)).first()
        return row.context_id if row else None

    def get_context(self, context_id: str) -> ContextRow | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(contexts).where(contexts.c.id == context_id)).first()
        return ContextRow(**row._mapping) if row else None

    def list_contexts(self) -> list[ContextRow]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(contexts).order_by(contexts.c.created_at, contexts.c.id)).all()
        return [ContextRow(**r._mapping) for r in rows]

    def heads(self) -> dict[str, int]:
        """context id → last entry id: what a replica compares to its cache to notice changes."""
        with self.engine.connect() as conn:
            return {r.id: r.last_id for r in conn.execute(select(contexts.c.id, contexts.c.last_id))}

    def delete_context(self, context_id: str) -> bool:
        with self.engine.begin() as conn:
            conn.execute(delete(entries).where(entries.c.context_id == context_id))
            conn.execute(delete(members).where(members.c.context_id == context_id))
            held = conn.execute(delete(names).where(names.c.context_id == context_id)
                                .returning(names.c.name)).first()
            gone = conn.execute(delete(contexts).where(contexts.c.id == context_id)).rowcount > 0
            if held is not None:  # a younger context of the name (an upgraded store's) now holds it
                self._claim_unclaimed(conn, held.name)
            self._notify(conn, context_id)
        return gone

    # ------------------------------------------------------------------ the list
    def entries(self, context_id: str, after: int = 0) -> list[Entry]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(entries).where(entries.c.context_id == context_id,
                                                      entries.c.entry_id > after)
                                .order_by(entries.c.entry_id)).all()
        return [_entry(r) for r in rows]

    def load(self, context_id: str) -> Loaded | None:
        """Row, members and kept entries in one read transaction (a consistent view)."""
        with self.engine.connect() as conn, conn.begin():
            row = conn.execute(select(contexts).where(contexts.c.id == context_id)).first()
            if row is None:
                return None
            ctx = ContextRow(**row._mapping)
            mrows = conn.execute(select(members).where(members.c.context_id == context_id)
                                 .order_by(members.c.entry_id)).all()
            erows = conn.execute(select(entries).where(entries.c.context_id == context_id,
                                                       entries.c.entry_id > ctx.horizon)
                                 .order_by(entries.c.entry_id)).all()
        joined = [Entry(entry_id=m.entry_id, kind="join", hostname=m.hostname, fqdn=m.fqdn, ip=m.ip,
                        ssh_host_key=m.ssh_host_key, data=m.data, instance_id=m.instance_id)
                  for m in mrows]
        return Loaded(ctx, joined, [_entry(r) for r in erows])

    def members(self, context_id: str) -> list[NodeFields]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(members).where(members.c.context_id == context_id)
                                .order_by(members.c.hostname)).all()
        return [_node(r) for r in rows]

    def join(self, context_id: str, node: NodeFields, now: float | None = None) -> tuple[Entry | None, int]:
        """Append a join (``Revoked`` if the node's instance was reported gone)."""
        return self._append(context_id, "join", node.hostname, node, "", now)

    def leave(self, context_id: str, hostname: str, reason: str = "", now: float | None = None,
              caller: Caller | None = None) -> tuple[Entry | None, int]:
        """Append a leave. With ``caller``, only if it may remove the entry as it is now
        (``core.authorize_leave``, checked in the same transaction), else ``Forbidden``."""
        return self._append(context_id, "leave", hostname, None, reason, now, caller)

    def revoke(self, instance_id: str, reason: str = "", now: float | None = None, *, seq: int = 0,
               final: bool = True) -> Verdict:
        """Remember that an instance is gone: its credential may no longer join, and its address
        is no longer its (the cloud may give it to another instance). ``final`` (terminated):
        for good. Not final (failed): until ``reopen`` with a higher ``seq``; a failure whose
        ``seq`` is not above a reopening's is the one that reopening undid (a late or repeated
        event): ``"stale"``, nothing changes. Idempotent: ``"revoked"`` when the credential was
        allowed until now, ``"unchanged"`` when it was already revoked."""
        at = time.time() if now is None else now
        with self.engine.begin() as conn:
            row = conn.execute(select(revoked.c.seq, revoked.c.final, revoked.c.active)
                               .where(revoked.c.instance_id == instance_id)).first()
            if row is None:
                conn.execute(insert(revoked).values(instance_id=instance_id, at=at, reason=reason[:500], seq=seq,
                                                    final=int(final), active=1))
            elif row.active and (row.final or not final):
                return "unchanged"  # its address went with the first revoke (noted again only on a reopening)
            elif not row.active and not final and seq <= row.seq:
                return "stale"  # the failure a reopening undid
            else:
                conn.execute(update(revoked).where(revoked.c.instance_id == instance_id).values(
                    at=at, reason=reason[:500], seq=max(seq, row.seq), final=int(final or bool(row.final)), active=1))
                if row.active:
                    return "unchanged"  # failed, now terminated: already out
            conn.execute(delete(instances).where(instances.c.instance_id == instance_id))
        return "revoked"

    def reopen(self, instance_id: str, seq: int, now: float | None = None, *, announced: bool = False) -> bool:
        """The provisioner reopened a launch it had closed failed (the cloud lists its node alive:
        the create took effect, its answer was lost): its credential may join again. Only above
        the failure's ``seq``, never after a termination. ``announced`` (the event says ``previous:
        failed``): remembered even before the failure is seen, so the failure's event, if it comes
        late, revokes nothing. True when the credential was revoked until now."""
        at = time.time() if now is None else now
        with self.engine.begin() as conn:
            row = conn.execute(select(revoked.c.seq, revoked.c.final, revoked.c.active)
                               .where(revoked.c.instance_id == instance_id)).first()
            if row is None:
                if announced:
                    conn.execute(insert(revoked).values(instance_id=instance_id, at=at, reason="reopened", seq=seq,
                                                        final=0, active=0))
                return False
            if row.final or seq <= row.seq:
                return False  # terminated for good, or not newer than the verdict it would undo
            conn.execute(update(revoked).where(revoked.c.instance_id == instance_id).values(
                at=at, reason="reopened", seq=seq, active=0))
            return bool(row.active)

    def note_instance(self, instance_id: str, ip: str, seq: int = 0, now: float | None = None) -> bool:
        """Record the address the provisioner reports for a live instance (what its node may
        publish). An older report (lower ``seq``) or one of a revoked instance changes nothing.
        Returns whether anything changed."""
        at = time.time() if now is None else now
        with self.engine.begin() as conn:
            # the common case first (every report repeats what is known): one read. A row exists
            # only for an instance not revoked (``revoke`` deletes it in the same transaction).
            cur = conn.execute(select(instances.c.ip, instances.c.seq)
                               .where(instances.c.instance_id == instance_id)).first()
            if cur is not None and (seq < cur.seq or cur.ip == ip):
                return False
            if cur is None:
                if _revoked_now(conn, instance_id):
                    return False
                conn.execute(insert(instances).values(instance_id=instance_id, ip=ip, seq=seq, at=at))
                return True
            conn.execute(update(instances).where(instances.c.instance_id == instance_id)
                         .values(ip=ip, seq=seq, at=at))
            return True

    def instance_ip(self, instance_id: str) -> str | None:
        """The address the provisioner reported for a live instance (None: none yet, or gone)."""
        with self.engine.connect() as conn:
            row = conn.execute(select(instances.c.ip).where(instances.c.instance_id == instance_id)).first()
        return row.ip if row else None

    def _address_facts(self, conn: Connection, context_id: str, node: NodeFields) -> AddressFacts:
        """What the store knows about ``node.ip``, read in the join's transaction."""
        own = None
        if node.instance_id:
            row = conn.execute(select(instances.c.ip).where(instances.c.instance_id == node.instance_id)).first()
            own = row.ip if row else None
        member = conn.execute(select(members.c.hostname).where(
            members.c.context_id == context_id, members.c.ip == node.ip,
            members.c.hostname != node.hostname).limit(1)).first()
        other = conn.execute(select(instances.c.instance_id).where(
            instances.c.ip == node.ip, instances.c.instance_id != (node.instance_id or "")).limit(1)).first()
        return AddressFacts(instance_ip=own, member_holding=member.hostname if member else None,
                            instance_holding=other.instance_id if other else None)


    def contexts_of_instance(self, instance_id: str) -> list[tuple[str, str]]:
        """(context id, hostname) of every member registered with this instance id."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(members.c.context_id, members.c.hostname)
                                .where(members.c.instance_id == instance_id)).all()
        return [(r.context_id, r.hostname) for r in rows]

    def _append(self, context_id: str, kind: EntryKind, hostname: str, node: NodeFields | None,
                reason: str, now: float | None, caller: Caller | None = None) -> tuple[Entry | None, int]:
        """Append one entry if it changes the membership. Returns (entry or None, last id)."""
        at = time.time() if now is None else now
        with self.engine.connect() as conn:
            trans = conn.begin()
            try:
                bumped = conn.execute(update(contexts).where(contexts.c.id == context_id)
                                      .values(last_id=contexts.c.last_id + 1)
                                      .returning(contexts.c.last_id, contexts.c.horizon)).first()
                if bumped is None:
                    raise ContextNotFound(context_id)
                new_id, horizon = bumped
                if node is not None and node.instance_id and _revoked_now(conn, node.instance_id):
                    raise Revoked(f"instance {node.instance_id} was reported terminated or failed; it cannot join")
                if node is not None:
                    check_address(node, self._address_facts(conn, context_id, node))
                cur_row = conn.execute(select(members).where(members.c.context_id == context_id,
                                                             members.c.hostname == hostname)).first()
                current = _node(cur_row) if cur_row else None
                if caller is not None and kind == "leave":
                    authorize_leave(caller, hostname, current)
                if not next_entry(current, kind, node):
                    trans.rollback()
                    return None, new_id - 1
                entry = self._write(conn, context_id, new_id, kind, hostname, node, reason, at)
                self._compact(conn, context_id, new_id, horizon)
                self._notify(conn, context_id)
                trans.commit()
                return entry, new_id
            except BaseException:
                if trans.is_active:
                    trans.rollback()
                raise

    def _write(self, conn: Connection, context_id: str, entry_id: int, kind: EntryKind, hostname: str,
               node: NodeFields | None, reason: str, at: float) -> Entry:
        if node is not None:
            fields = dict(fqdn=node.fqdn, ip=node.ip, ssh_host_key=node.ssh_host_key, data=node.data,
                          instance_id=node.instance_id)
        else:
            fields = dict(fqdn="", ip="", ssh_host_key="", data="", instance_id=None)
        entry = Entry(entry_id=entry_id, kind=kind, hostname=hostname, reason=reason, at=at, **fields)
        conn.execute(insert(entries).values(context_id=context_id, entry_id=entry_id, kind=kind,
                                            hostname=hostname, reason=reason, at=at, **fields))
        conn.execute(delete(members).where(members.c.context_id == context_id, members.c.hostname == hostname))
        if node is not None:
            conn.execute(insert(members).values(context_id=context_id, hostname=hostname, entry_id=entry_id,
                                                **fields))
        return entry

    def _compact(self, conn: Connection, context_id: str, last_id: int, horizon: int) -> None:
        keep = self.history_entries
        if last_id - horizon <= keep + keep // 10 + 1:
            return
        new_horizon = last_id - keep
        conn.execute(delete(entries).where(entries.c.context_id == context_id, entries.c.entry_id <= new_horizon))
        conn.execute(update(contexts).where(contexts.c.id == context_id).values(horizon=new_horizon))

    def _notify(self, conn: Connection, context_id: str) -> None:
        if self.is_postgres:
            conn.execute(text("SELECT pg_notify(:ch, :payload)"), {"ch": NOTIFY_CHANNEL, "payload": context_id})

    def count_entries(self, context_id: str) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(entries)
                                    .where(entries.c.context_id == context_id)).scalar() or 0)
