"""Durable engine state in SQLAlchemy Core — SQLite (default) or PostgreSQL, same code.

What lives here, so a restarted or standby engine continues where the last one stopped:

* ``domain_configs`` — every version of every domain's config (file seeds and operator changes);
* ``changes`` — each PolicyChange id with its outcome (a re-delivered change is answered again,
  not applied twice);
* ``instances`` — the engine's instance table, including timers (idle-since, drain start,
  add sent) and the engine-owned states joined/draining;
* ``actions`` — the intent log: every launch/terminate/node command, stored *before* it is
  sent, re-sent with the same id until its outcome is seen;
* ``sites`` — failure counts and backoff per site;
* ``domain_state`` — policy memory (threshold timers, utilisation samples) and the iteration count;
* ``job_spans`` — which job ran on which instance's node and when (``occupancy``), kept for
  ``epu cost``: outside the working set (never read to decide, written without the generation).

Working set in memory, written through: an engine reads its configs, live instances, open
actions, site health and policy memory from the database once, then serves every read from
memory and applies every write to the database first and to memory only once the transaction
committed. An iteration with nothing to do reads one counter and nothing else (measured: the
simulator's engine iterations went from ~3 ms of SQL to well under a millisecond).

Several engines may write one store — in an engine pair the broker may hand the input, control
and snapshot queues to different engines — so every write transaction also bumps a generation
counter (``decision_generation``), and the engine ``sync``s before each iteration and each
message: if the counter moved since this engine last wrote or read it, another engine wrote and
the cache is dropped and reloaded. (The simulator found this: a standby answering a policy
change from a stale cache lost an operator's resume.) The engine also drops the cache when its
broker connection drops and when a domain becomes active for it.
"""

from __future__ import annotations

import itertools
import json
import operator
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from itertools import compress
from typing import Any

from epu.common.config.decision import DomainConfig
from epu.common.db import create_schema, make_engine
from epu.common.messages import REGISTRY, Message
from epu.services.decision.lease import StaleWrite
from epu.services.decision.occupancy import JobSpan
from epu.services.decision.placement import SiteHealth
from epu.services.decision.planner import Plan
from epu.services.decision.view import LIVE_STATES, PENDING_STATES, Instance
from sqlalchemy import (
    Boolean,
    Column,
    Float,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    and_,
    bindparam,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError

metadata = MetaData()
HISTORY_LIMIT = 50
"""Policy changes per domain that the engine's status carries (``epu policy history``)."""

domain_configs = Table(
    "decision_domain_configs", metadata,
    Column("domain", String(64), primary_key=True),
    Column("version", Integer, primary_key=True),
    Column("config", Text, nullable=False),
    Column("source", String(16), nullable=False),
    Column("change_id", String(128)),
    Column("created_at", Float, nullable=False),
)
changes = Table(
    "decision_changes", metadata,
    Column("change_id", String(128), primary_key=True),
    Column("domain", String(64), nullable=False),
    Column("applied", Boolean, nullable=False),
    Column("version", Integer),
    Column("reason", Text, nullable=False, default=""),
    Column("at", Float, nullable=False),
    Column("operator", String(128)),
    Column("request", Text),  # the change as asked (JSON, without its id): epu policy history
)
instances = Table(
    "decision_instances", metadata,
    Column("instance_id", String(128), primary_key=True),
    Column("domain", String(64), nullable=False, index=True),
    Column("site", String(64), nullable=False),
    Column("node_name", String(253), nullable=False),
    Column("cores", Integer, nullable=False),
    Column("state", String(16), nullable=False),
    Column("launched_at", Float, nullable=False),
    Column("state_at", Float, nullable=False),
    Column("seq", Integer, nullable=False, default=-1),
    Column("ip", String(64)),
    Column("joined_at", Float),
    Column("idle_since", Float),
    Column("drain_at", Float),
    Column("add_sent_at", Float),
    Column("removed", Boolean, nullable=False, default=False),
    Column("terminate_sent", Boolean, nullable=False, default=False),
    Column("reason", Text, nullable=False, default=""),
    Column("missing_since", Float),
    Column("seen_at", Float),
    Column("retire", String(16), default=""),
    Column("instance_type", String(64), default=""),
    Column("gang", String(64), default=""),
    Column("reopened_seq", Integer),
)
actions = Table(
    "decision_actions", metadata,
    Column("action_id", String(128), primary_key=True),
    Column("domain", String(64), nullable=False, index=True),
    Column("kind", String(16), nullable=False),
    Column("target", String(128), nullable=False),
    Column("site", String(64), nullable=False, default=""),
    Column("reason", Text, nullable=False, default=""),
    Column("type", String(64), nullable=False),
    Column("body", Text, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("sent_at", Float),
    Column("attempts", Integer, nullable=False, default=0),
    Column("done", Boolean, nullable=False, default=False, index=True),
    Column("outcome", Text),
)
sites = Table(
    "decision_sites", metadata,
    Column("name", String(64), primary_key=True),
    Column("failures", Integer, nullable=False, default=0),
    Column("backoff_until", Float, nullable=False, default=0.0),
    Column("last_error", Text, nullable=False, default=""),
    Column("stalls", Integer, nullable=False, default=0),
)
domain_state = Table(
    "decision_domain_state", metadata,
    Column("domain", String(64), primary_key=True),
    Column("memory", Text, nullable=False, default="{}"),
    Column("iteration", Integer, nullable=False, default=0),
    Column("file_config", Text),
)

job_spans = Table(
    "decision_job_spans", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("domain", String(64), nullable=False, index=True),
    Column("instance_id", String(128), nullable=False),
    Column("job_id", String(128), nullable=False),
    Column("start_at", Float, nullable=False, index=True),
    Column("end_at", Float),
    Column("owner_account", String(128), nullable=False, default=""),
    Column("owner_user", String(128), nullable=False, default=""),
    Column("owner_partition", String(128), nullable=False, default=""),
)
"""Which job ran on which instance's node, from when to when (``occupancy``): whose the paid time
was, for ``epu cost``. A record, not part of the working set: no engine reads it to decide."""
job_seen = Table(
    "decision_job_seen", metadata,
    Column("domain", String(64), primary_key=True),
    Column("seen_at", Float, nullable=False),
)
"""Domain → when its last snapshot was applied to ``job_spans``: an open span was listed in
every snapshot since it opened, so this is when each of the domain's open spans was last seen."""

generation = Table(
    "decision_generation", metadata,
    Column("name", String(16), primary_key=True),
    Column("value", Integer, nullable=False, default=0),
)
"""One counter every write transaction bumps: how an engine knows another one wrote since it
last looked (its cached working set is then reloaded)."""

_INSTANCE_FIELDS = [f.name for f in fields(Instance)]
_GEN_KEY = "store"
_SEL_GEN = select(generation.c.value).where(generation.c.name == _GEN_KEY)
_BUMP_GEN = update(generation).where(generation.c.name == _GEN_KEY).values(value=generation.c.value + 1)
_BUMP_GEN_RETURNING = _BUMP_GEN.returning(generation.c.value)
# Prebuilt statements: building one per call costs more Python time than SQLite spends on it.
_SEL_IDS = select(instances.c.instance_id).where(instances.c.instance_id.in_(bindparam("ids", expanding=True)))
_UPD_INSTANCE = (update(instances).where(instances.c.instance_id == bindparam("_id"))
                 .values({f: bindparam(f) for f in _INSTANCE_FIELDS if f != "instance_id"}))
_INS_INSTANCE = insert(instances)
_ROW = operator.attrgetter(*_INSTANCE_FIELDS)
"""An instance's values in column order (a C getter)."""
_NARROW: dict[tuple[str, tuple[str, ...]], tuple[str, tuple[str, ...] | None]] = {}
"""(dialect, columns) → the SQL of an UPDATE of those columns by instance id, and its parameter
order when the driver's are positional (``Store._update_rows``)."""


def _narrow_update(conn: Connection, cols: tuple[str, ...]) -> tuple[str, tuple[str, ...] | None]:
    key = (conn.dialect.name, cols)
    got = _NARROW.get(key)
    if got is None:
        stmt = (update(instances).where(instances.c.instance_id == bindparam("_id"))
                .values({c: bindparam(c, type_=instances.c[c].type) for c in cols}))
        compiled = stmt.compile(dialect=conn.dialect)
        got = _NARROW[key] = (compiled.string, tuple(compiled.positiontup or ()) if compiled.positional else None)
    return got
_DONE = (update(actions).where(actions.c.action_id.in_(bindparam("ids", expanding=True)), actions.c.done.is_(False))
         .values(done=True, outcome=bindparam("outcome")))
_SENT = (update(actions).where(actions.c.action_id.in_(bindparam("ids", expanding=True)))
         .values(sent_at=bindparam("at"), attempts=actions.c.attempts + 1))


def _instance(row: Any) -> Instance:
    m = row._mapping
    return _fix(Instance(**{k: m[k] for k in _INSTANCE_FIELDS}))


def _fix(inst: Instance) -> Instance:
    """Rows written before a column existed read it as NULL."""
    if inst.retire is None or inst.instance_type is None or inst.gang is None:
        return replace(inst, retire=inst.retire or "", instance_type=inst.instance_type or "", gang=inst.gang or "")
    return inst


_UPSERTS: dict[tuple[str, tuple[str, ...], tuple[str, ...]], tuple[Any, Any]] = {}
"""(table, key columns, value columns) → its update and insert with bound parameters, built once:
building and caching a statement anew on every call was a third of ``commit_plan`` (1,000
domains commit a plan each per iteration)."""


def _upsert(conn: Connection, table: Table, key: dict[str, Any], values: dict[str, Any]) -> None:
    """Portable upsert: update, insert when nothing matched (one engine writes at a time)."""
    sig = (table.name, tuple(key), tuple(values))
    stmts = _UPSERTS.get(sig)
    if stmts is None:
        where = and_(*[table.c[k] == bindparam(f"k_{k}", type_=table.c[k].type) for k in key])
        sets = {c: bindparam(f"v_{c}", type_=table.c[c].type) for c in values}
        keys = {k: bindparam(f"k_{k}", type_=table.c[k].type) for k in key}
        stmts = _UPSERTS[sig] = (update(table).where(where).values(sets), insert(table).values({**keys, **sets}))
    params = {**{f"k_{k}": v for k, v in key.items()}, **{f"v_{c}": v for c, v in values.items()}}
    if conn.execute(stmts[0], params).rowcount == 0:
        conn.execute(stmts[1], params)


@contextmanager
def _savepoint(cursor: Any) -> Iterator[None]:
    """A savepoint with one fixed name, sent on the transaction's own DBAPI cursor (SQLite and
    PostgreSQL spell it alike; the savepoints of ``commit_plans`` follow each other, never
    nest). ``Connection.begin_nested`` names each one anew (sa_savepoint_1, _2, ...) — a new
    statement to compile and cache per domain, a third of the shared commit at 1,000 domains —
    and even a prepared statement through SQLAlchemy costs ~20 µs, three per domain."""
    cursor.execute("SAVEPOINT epu_plan")
    try:
        yield
    except BaseException as exc:
        try:
            cursor.execute("ROLLBACK TO SAVEPOINT epu_plan")
            cursor.execute("RELEASE SAVEPOINT epu_plan")
        except Exception as broken:  # the transaction is in an unknown state: it must not commit
            raise _TransactionBroken(str(broken)) from exc
        raise
    cursor.execute("RELEASE SAVEPOINT epu_plan")


class _TransactionBroken(Exception):
    """A savepoint could not be rolled back: the whole transaction is given up."""


ENDED = ("terminated", "failed")


def _needs_cleanup(inst: Instance) -> bool:
    return inst.state in ENDED and not inst.removed and (inst.add_sent_at is not None or inst.seen_at is not None)


@dataclass
class _Open:
    """An open action (intent log row not done yet), as the cache keeps it."""

    action_id: str
    domain: str
    kind: str
    target: str
    site: str
    reason: str
    type: str
    body: str
    created_at: float
    sent_at: float | None
    attempts: int
    message: Message | None = None

    def msg(self) -> Message:
        if self.message is None:
            self.message = REGISTRY[self.type].model_validate(json.loads(self.body))
        return self.message

    def row(self) -> dict[str, Any]:
        return {"action_id": self.action_id, "domain": self.domain, "kind": self.kind, "target": self.target,
                "site": self.site, "reason": self.reason, "type": self.type, "body": self.body,
                "created_at": self.created_at, "sent_at": self.sent_at, "attempts": self.attempts,
                "done": False, "outcome": None}


@dataclass
class PlanWrite:
    """One domain's plan to store (``Store.commit_plan``'s arguments), for ``commit_plans``."""

    domain: str
    plan: Plan
    now: float
    memory: dict[str, Any] | None
    iteration: int
    refreshed: Iterable[Instance] = ()
    """Instances the iteration's refresh changed (their new timers or states)."""
    fence: Callable[[Connection], None] | None = None
    """The lease check (``lease.Leases.fence``): raises ``Fenced`` when the domain is not ours."""


_LAUNCHED = operator.attrgetter("launched_at")
"""The instance order key (a C getter: sorting 50,000 rows with a lambda costs milliseconds)."""
_STAMPS = itertools.count(1)
"""Stamps of a domain's instance set (``Store.domain_stamp``): never reused, in any store or cache."""


@dataclass
class _Cache:
    configs: dict[str, tuple[int, DomainConfig] | None] = field(default_factory=dict)
    memory: dict[str, tuple[dict[str, Any], int]] = field(default_factory=dict)
    live: dict[str, Instance] | None = None
    """Every live instance, all domains (quota is per site over all of them)."""
    by_domain: dict[str, dict[str, Instance]] = field(default_factory=dict)
    ended: dict[str, dict[str, Instance]] = field(default_factory=dict)
    """Per domain: ended instances whose batch node still needs a confirmed removal."""
    sites: dict[str, SiteHealth] | None = None
    open: dict[str, _Open] | None = None
    open_by_target: dict[str, set[str]] = field(default_factory=dict)
    open_by_domain: dict[str, dict[str, _Open]] = field(default_factory=dict)
    """The open actions per domain: per-domain questions (``overdue``, ``in_flight``) must not
    scan every domain's actions (1,000 domains made that quadratic)."""
    history: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Per domain: its newest policy changes (``change_history``), read once, kept current."""
    stamps: dict[str, int] = field(default_factory=dict)
    """Domain → stamp of its live instance set, new on every change (``Store.domain_stamp``)."""
    ending: dict[str, dict[str, Instance]] = field(default_factory=dict)
    """Per domain: its instances in ``terminating``, in ``by_domain``'s order (``Store.terminating``)."""
    sorted_live: dict[str, list[Instance]] = field(default_factory=dict)
    """Domain → its live instances, oldest launch first (``Store.instances``), until one changes."""
    counts: tuple[dict[str, int], dict[str, int]] | None = None
    type_counts: dict[tuple[str, str], int] | None = None

    def put(self, inst: Instance) -> None:
        assert self.live is not None
        iid, dom = inst.instance_id, inst.domain
        self.stamps[dom] = next(_STAMPS)
        self.sorted_live.pop(dom, None)
        old = self.live.pop(iid, None)
        if old is not None:
            self._count(old, -1)
        self.by_domain.get(dom, {}).pop(iid, None)
        self.ended.get(dom, {}).pop(iid, None)
        self.ending.get(dom, {}).pop(iid, None)
        if inst.state in LIVE_STATES:
            self.live[iid] = inst
            self.by_domain.setdefault(dom, {})[iid] = inst
            self._count(inst, 1)
            if inst.state == "terminating":
                self.ending.setdefault(dom, {})[iid] = inst
        elif _needs_cleanup(inst):
            self.ended.setdefault(dom, {})[iid] = inst

    def _count(self, inst: Instance, sign: int) -> None:
        """Keep the per-site and per-type counts of ``live`` current (as ``count_per_site`` and
        ``count_per_type`` would count them; a count down to 0 leaves no key)."""
        count_live(self.counts, self.type_counts, inst, sign)

    def add_open(self, o: _Open) -> None:
        assert self.open is not None
        self.open[o.action_id] = o
        self.open_by_target.setdefault(o.target, set()).add(o.action_id)
        self.open_by_domain.setdefault(o.domain, {})[o.action_id] = o

    def close(self, action_id: str) -> None:
        assert self.open is not None
        o = self.open.pop(action_id, None)
        if o is not None:
            mine = self.open_by_domain.get(o.domain)
            if mine is not None:
                mine.pop(action_id, None)
            ids = self.open_by_target.get(o.target)
            if ids is not None:
                ids.discard(action_id)
                if not ids:
                    del self.open_by_target[o.target]


def _bump(counts: dict[Any, int], key: Any, sign: int) -> None:
    n = counts.get(key, 0) + sign
    if n:
        counts[key] = n
    else:
        counts.pop(key, None)


def count_live(counts: tuple[dict[str, int], dict[str, int]] | None,
               type_counts: dict[tuple[str, str], int] | None, inst: Instance, sign: int) -> None:
    """Add (``sign`` 1) or take away (-1) one live instance in kept counts: per site and per site
    still pending (``counts``), per (site, type) (``type_counts``); None: not kept yet."""
    if counts is not None:
        per, unproven = counts
        _bump(per, inst.site, sign)
        if inst.state in PENDING_STATES:
            _bump(unproven, inst.site, sign)
    if type_counts is not None:
        _bump(type_counts, (inst.site, inst.instance_type), sign)


class Store:
    def __init__(self, url_or_engine: str | Engine) -> None:
        if isinstance(url_or_engine, str):
            kw: dict[str, Any] = {}
            if url_or_engine in ("sqlite://", "sqlite:///:memory:"):
                from sqlalchemy.pool import StaticPool

                kw["poolclass"] = StaticPool  # one shared connection, or every checkout is a new empty DB
            self.engine = make_engine(url_or_engine, **kw)
        else:
            self.engine = url_or_engine
        self._cache = _Cache()
        self._after: list[Callable[[], None]] | None = None
        self._gen = -1
        """The store generation the cache reflects (-1: unknown, the first ``sync`` reloads)."""

    def invalidate(self) -> None:
        """Forget the working set; the next reads load it again from the database."""
        self._cache = _Cache()

    @contextmanager
    def _write(self, conn: Connection | None = None, bump_first: bool = False,
               cas: bool = False) -> Iterator[Connection]:
        """A write transaction (or the caller's, ``conn``); cache updates queued with ``_then``
        are applied only once the outermost transaction committed. ``bump_first``: the
        generation counter is bumped before the caller's writes, not after (``commit_plans``).
        ``cas`` (every write that changes an instance): a compare-and-set on the generation —
        bumped first, which takes the counter's row lock until the commit, and the transaction
        is rolled back with ``StaleWrite`` if another process wrote since this handle last read
        (``sync``, or its own last write). A handle that never synced (``_gen`` unknown) is not
        checked."""
        if conn is not None:
            yield conn
            return
        self._after = []
        try:
            with self.engine.begin() as c:
                if bump_first or cas:
                    gen = self._bump(c)
                yield c
                # checked after the caller's writes (the bump holds the counter's lock since), so a
                # lease check among them (``Fenced``) speaks first; either rolls everything back
                if cas and self._gen != -1 and gen - 1 != self._gen:
                    # the store is at ``gen - 1``: what this handle read is stale
                    read_at, self._gen = self._gen, gen - 1
                    self._cache = _Cache()
                    self._after = []
                    raise StaleWrite(f"the decision store moved on (generation {gen - 1}, read at "
                                     f"{read_at}): another engine wrote since; read again and redo")
                if not (bump_first or cas):
                    gen = self._bump(c)
            after, self._after = self._after, None
            if gen - 1 != self._gen:
                self._cache = _Cache()  # someone else wrote since we last looked: reload lazily
                after = []
            self._gen = gen
            for fn in after:
                fn()
        finally:
            self._after = None

    def _bump(self, conn: Connection) -> int:
        if conn.dialect.update_returning:  # PostgreSQL, SQLite >= 3.35: bump and read in one statement
            value = conn.execute(_BUMP_GEN_RETURNING).scalar()
            if value is not None:
                return int(value)
        if conn.execute(_BUMP_GEN).rowcount == 0:
            try:
                with conn.begin_nested():
                    conn.execute(insert(generation).values(name=_GEN_KEY, value=1))
            except IntegrityError:  # another engine made the row meanwhile
                conn.execute(_BUMP_GEN)
        return int(conn.execute(_SEL_GEN).scalar_one())

    def sync(self) -> None:
        """Drop the cached working set if another engine wrote since this one last looked (one
        small read; the engine calls it before each iteration and each message)."""
        with self.engine.connect() as conn:
            gen = conn.execute(_SEL_GEN).scalar()
        gen = int(gen or 0)
        if gen != self._gen:
            self._cache = _Cache()
            self._gen = gen

    def _then(self, fn: Callable[[], None]) -> None:
        if self._after is not None:
            self._after.append(fn)
        else:
            fn()

    def create(self) -> Store:
        create_schema(self.engine, metadata)
        self._add_missing_columns()
        return self

    def _add_missing_columns(self) -> None:
        """Columns added after a table was first created (nullable ones only): add them in place,
        so a store from an earlier version keeps working."""
        from sqlalchemy import inspect, text

        insp = inspect(self.engine)
        with self.engine.begin() as conn:
            for table in metadata.sorted_tables:
                have = {c["name"] for c in insp.get_columns(table.name)}
                for col in table.columns:
                    if col.name not in have and col.nullable:
                        kind = col.type.compile(dialect=self.engine.dialect)
                        conn.execute(text(f'ALTER TABLE {table.name} ADD COLUMN {col.name} {kind}'))

    # ------------------------------------------------------------------ configs
    def current_config(self, domain: str) -> tuple[int, DomainConfig] | None:
        cache = self._cache.configs
        if domain in cache:
            return cache[domain]
        with self.engine.connect() as conn:
            row = conn.execute(select(domain_configs.c.version, domain_configs.c.config)
                               .where(domain_configs.c.domain == domain)
                               .order_by(domain_configs.c.version.desc()).limit(1)).first()
        out = (row.version, DomainConfig.model_validate(json.loads(row.config))) if row else None
        cache[domain] = out
        return out

    def config_history(self, domain: str) -> list[dict[str, Any]]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(domain_configs).where(domain_configs.c.domain == domain)
                                .order_by(domain_configs.c.version)).all()
        return [{**r._mapping, "config": json.loads(r.config)} for r in rows]

    def domains(self) -> list[str]:
        with self.engine.connect() as conn:
            return [r[0] for r in conn.execute(select(domain_configs.c.domain).distinct())]

    def put_config(self, domain: str, cfg: DomainConfig, *, source: str, now: float,
                   change_id: str | None = None, conn: Connection | None = None) -> int:
        def do(c: Connection) -> int:
            top = c.execute(select(func.max(domain_configs.c.version))
                            .where(domain_configs.c.domain == domain)).scalar()
            version = (top or 0) + 1
            c.execute(insert(domain_configs).values(domain=domain, version=version,
                                                    config=cfg.model_dump_json(), source=source,
                                                    change_id=change_id, created_at=now))
            self._then(lambda: self._cache.configs.__setitem__(domain, (version, cfg)))
            return version

        with self._write(conn) as c:
            return do(c)

    def seed_config(self, domain: str, cfg: DomainConfig, now: float) -> int:
        """Make the file's config current, key by key, without undoing an operator's change.

        Precedence (docs/decision.md): a key whose value in the file changed since the engine last
        read the file takes the file's value; every other key keeps its current value — so an
        operator's pause, bounds or parameters survive a restart and an unrelated edit of the
        file, and the file wins on exactly the keys an administrator edited. A new domain, or a
        store with no record of the last file, takes the file as it is.

        Two engines starting together may race on the same version number: the loser's insert
        fails on the primary key, and its second attempt finds the winner's seed."""
        from sqlalchemy.exc import IntegrityError

        try:
            return self._seed_config(domain, cfg, now)
        except IntegrityError:
            return self._seed_config(domain, cfg, now)

    def _seed_config(self, domain: str, cfg: DomainConfig, now: float) -> int:
        text = cfg.model_dump_json()
        self._cache.configs.pop(domain, None)
        with self._write() as conn:
            row = conn.execute(select(domain_state.c.file_config).where(domain_state.c.domain == domain)).first()
            current = conn.execute(select(domain_configs.c.version, domain_configs.c.config)
                                   .where(domain_configs.c.domain == domain)
                                   .order_by(domain_configs.c.version.desc()).limit(1)).first()
            last_file = row.file_config if row is not None else None
            merged = seed_merge(cfg, text, current.config if current is not None else None, last_file)
            if merged is None:
                return int(current.version)
            _upsert(conn, domain_state, {"domain": domain}, {"file_config": text})
            if current is not None and merged.model_dump_json() == current.config:
                return int(current.version)
            return self.put_config(domain, merged, source="file", now=now, conn=conn)

    def change_outcome(self, change_id: str) -> dict[str, Any] | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(changes).where(changes.c.change_id == change_id)).first()
        return dict(row._mapping) if row else None

    def record_change(self, change_id: str, domain: str, applied: bool, reason: str, now: float,
                      cfg: DomainConfig | None = None, retire: Iterable[Instance] = (), *,
                      operator: str = "", request: str = "") -> int | None:
        """Store a change's outcome (and the new config version when applied, and the instances an
        operator asked to retire) atomically, with who asked and what (``request``: JSON)."""
        with self._write(cas=True) as conn:
            version = self.put_config(domain, cfg, source="operator", now=now, change_id=change_id,
                                      conn=conn) if applied and cfg is not None else None
            row = {"change_id": change_id, "domain": domain, "applied": applied, "version": version,
                   "reason": reason, "at": now, "operator": operator, "request": request}
            conn.execute(insert(changes).values(**row))
            if applied:
                self.save_instances(list(retire), conn)
            self._then(lambda: self._cache.history.pop(domain, None))
            return version

    def change_history(self, domain: str, limit: int = HISTORY_LIMIT) -> list[dict[str, Any]]:
        """The domain's newest ``limit`` policy changes, oldest first (applied or refused, why, who)."""
        hit = self._cache.history.get(domain)
        if hit is None:
            with self.engine.connect() as conn:
                rows = conn.execute(select(changes).where(changes.c.domain == domain)
                                    .order_by(changes.c.at.desc()).limit(limit)).all()
            hit = self._cache.history[domain] = [history_entry(dict(r._mapping)) for r in reversed(rows)]
        return list(hit)

    # ------------------------------------------------------------------ instances
    def _live(self) -> dict[str, Instance]:
        c = self._cache
        if c.live is None:
            q = select(*[instances.c[f] for f in _INSTANCE_FIELDS]).where(
                instances.c.state.in_(LIVE_STATES)
                | (instances.c.state.in_(ENDED) & instances.c.removed.is_(False)
                   & (instances.c.add_sent_at.is_not(None) | instances.c.seen_at.is_not(None)))
            ).order_by(instances.c.launched_at)
            with self.engine.connect() as conn:
                rows = [_fix(Instance(*r)) for r in conn.execute(q)]
            c.live, c.by_domain, c.ended, c.ending = {}, {}, {}, {}
            for inst in rows:
                c.put(inst)
        assert c.live is not None
        return c.live

    def instances(self, domain: str | None = None, live_only: bool = True) -> list[Instance]:
        """Instances of ``domain`` (all domains: ``None``), oldest launch first; live ones only
        unless ``live_only=False`` (that one reads the database: it is for tools)."""
        if live_only:
            live = self._live()
            if domain is None:
                return sorted(live.values(), key=_LAUNCHED)  # stable: ties keep their order
            c = self._cache
            ordered = c.sorted_live.get(domain)
            if ordered is None:  # sorted once per change of the domain's set, not per iteration
                ordered = c.sorted_live[domain] = sorted(c.by_domain.get(domain, {}).values(),
                                                         key=_LAUNCHED)
            return list(ordered)
        q = select(*[instances.c[f] for f in _INSTANCE_FIELDS])  # field order: Instance(*row)
        if domain is not None:
            q = q.where(instances.c.domain == domain)
        with self.engine.connect() as conn:
            return [_fix(Instance(*r)) for r in conn.execute(q.order_by(instances.c.launched_at,
                                                                         instances.c.instance_id))]

    def terminating(self, domain: str) -> list[Instance]:
        """``[i for i in self.instances(domain) if i.state == "terminating"]``, without the pass
        over every instance of the domain (kept write by write: the engine asks every iteration,
        and after a write of 500 timers at 50,000 instances that pass and its sort were ~10 ms)."""
        self._live()
        return sorted(self._cache.ending.get(domain, {}).values(), key=_LAUNCHED)

    def domain_stamp(self, domain: str) -> int:
        """A stamp of the domain's live instance set in the working set: equal stamps mean the same
        instance objects, unchanged (a write to any of them, or a reload, gives a new stamp). The
        engine keys what it derives from the instances on it (``Engine.iterate_domain``)."""
        self._live()
        return self._cache.stamps.setdefault(domain, next(_STAMPS))

    def cleanup(self, domain: str) -> list[Instance]:
        """Instances that ended without their batch node confirmed removed (preempted, vanished,
        forced), whose node the batch system may still have."""
        self._live()
        return sorted(self._cache.ended.get(domain, {}).values(), key=lambda i: (i.launched_at, i.instance_id))

    def known(self, instance_ids: list[str]) -> dict[str, Instance]:
        """Each stored instance among ``instance_ids`` (one query for those the working set does
        not hold: an anti-entropy report lists ended ones too)."""
        live, ended = self._live(), self._cache.ended.values()
        out: dict[str, Instance] = {}
        rest = []
        for iid in instance_ids:
            inst = live.get(iid)
            if inst is None:
                inst = next((e[iid] for e in ended if iid in e), None)
            if inst is not None:
                out[iid] = inst
            else:
                rest.append(iid)
        q = select(*[instances.c[f] for f in _INSTANCE_FIELDS])  # field order: Instance(*row)
        for i in range(0, len(rest), 500):
            with self.engine.connect() as conn:
                out.update({inst.instance_id: inst for inst in (
                    _fix(Instance(*r)) for r in conn.execute(q.where(instances.c.instance_id.in_(rest[i:i + 500]))))})
        return out

    def instance(self, instance_id: str) -> Instance | None:
        live = self._live()
        inst = live.get(instance_id)
        if inst is not None:
            return inst
        with self.engine.connect() as conn:
            row = conn.execute(select(instances).where(instances.c.instance_id == instance_id)).first()
        return _instance(row) if row else None

    def save_instances(self, items: Iterable[Instance], conn: Connection | None = None) -> None:
        def do(c: Connection) -> None:
            # Batched (executemany with bound parameters): a burst of a thousand launches is
            # one update and one insert, not a thousand statements compiled one by one.
            items_by_id = {inst.instance_id: inst for inst in items}  # the last of an id wins
            if not items_by_id:
                return
            cached = self._cache.live
            known: set[str] = set()
            ids = list(items_by_id)
            unsure = ids
            if cached is not None:  # the working set knows the live and the ended-not-removed ones
                ended = self._cache.ended
                known = {i for i in ids if i in cached or any(i in e for e in ended.values())}
                unsure = [i for i in ids if i not in known]
            for i in range(0, len(unsure), 500):  # stay under every backend's bound-parameter limit
                known.update(c.scalars(_SEL_IDS, {"ids": unsure[i:i + 500]}))
            if known:
                self._update_rows(c, [items_by_id[i] for i in ids if i in known])
            new = [dict(zip(_INSTANCE_FIELDS, _ROW(items_by_id[i]), strict=True)) for i in ids if i not in known]
            if new:
                c.execute(_INS_INSTANCE, new)

        items = list(items)
        if not items:
            return
        with self._write(conn, cas=True) as c:
            do(c)
            if self._cache.live is not None:
                self._then(lambda: [self._cache.put(i) for i in items])

    def _update_rows(self, conn: Connection, items: list[Instance]) -> None:
        """UPDATE the rows of ``items`` (all stored already). Of an instance the working set holds,
        only the columns that differ from it are written — an iteration's refresh changes one or
        two timers of a few hundred rows — with one executemany per set of columns, its SQL
        compiled once per backend and handed to the driver as it is (``_narrow_update``):
        SQLAlchemy's per-row parameter processing and the full 21-column rows were most of a
        50,000-node churn iteration's write (~25 ms for ~500 rows). The others: every column."""
        live = self._cache.live
        ended = self._cache.ended
        groups: dict[tuple[str, ...], list[Instance]] = {}
        full: list[Instance] = []
        for inst in items:
            iid = inst.instance_id
            old = live.get(iid) if live is not None else None
            if old is None and live is not None:
                old = ended.get(inst.domain, {}).get(iid)
            if old is None:
                full.append(inst)
                continue
            cols = tuple(compress(_INSTANCE_FIELDS, map(operator.ne, _ROW(old), _ROW(inst))))
            if cols:  # else the row holds these values already (the working set is written through)
                groups.setdefault(cols, []).append(inst)
        for cols, group in groups.items():
            sql, order = _narrow_update(conn, cols)
            get = operator.attrgetter(*cols)
            if order is not None:  # positional (SQLite): the values in the compiled order, the id last
                assert order[-1] == "_id" and order[:-1] == cols
                conn.exec_driver_sql(sql, [(*((get(i),) if len(cols) == 1 else get(i)), i.instance_id)
                                           for i in group])
            else:
                conn.exec_driver_sql(sql, [{**dict(zip(cols, (get(i),) if len(cols) == 1 else get(i),
                                                       strict=True)), "_id": i.instance_id} for i in group])
        if full:
            conn.execute(_UPD_INSTANCE, [{**dict(zip(_INSTANCE_FIELDS[1:], _ROW(i)[1:], strict=True)),
                                          "_id": i.instance_id} for i in full])

    def live_per_site(self) -> tuple[dict[str, int], dict[str, int]]:
        """(live instances per site, launched-but-not-joined per site), over every domain."""
        live = self._live()
        c = self._cache
        if c.counts is None:  # counted again only after an instance changed
            c.counts = count_per_site(live.values())
        return dict(c.counts[0]), dict(c.counts[1])

    def live_per_type(self) -> dict[tuple[str, str], int]:
        """Live instances per (site, instance type), over every domain (what a type quota counts)."""
        live = self._live()
        c = self._cache
        if c.type_counts is None:
            c.type_counts = count_per_type(live.values())
        return dict(c.type_counts)

    # ------------------------------------------------------------------ sites
    def site_health(self) -> dict[str, SiteHealth]:
        if self._cache.sites is None:
            with self.engine.connect() as conn:
                self._cache.sites = {r.name: SiteHealth(r.name, r.failures, r.backoff_until, r.last_error, r.stalls)
                                     for r in conn.execute(select(sites))}
        return dict(self._cache.sites)

    def save_sites(self, items: Iterable[SiteHealth], conn: Connection | None = None) -> None:
        items = list(items)
        if not items:
            return
        with self._write(conn) as c:
            for h in items:
                _upsert(c, sites, {"name": h.name}, {"failures": h.failures, "backoff_until": h.backoff_until,
                                                     "last_error": h.last_error, "stalls": h.stalls})

            def apply() -> None:
                if self._cache.sites is not None:
                    self._cache.sites.update({h.name: h for h in items})

            self._then(apply)

    # ------------------------------------------------------------------ policy memory
    def memory(self, domain: str) -> tuple[dict[str, Any], int]:
        cached = self._cache.memory.get(domain)
        if cached is None:
            with self.engine.connect() as conn:
                row = conn.execute(select(domain_state.c.memory, domain_state.c.iteration)
                                   .where(domain_state.c.domain == domain)).first()
            cached = (json.loads(row.memory or "{}"), row.iteration or 0) if row else ({}, 0)
            self._cache.memory[domain] = cached
        return json.loads(json.dumps(cached[0])) if cached[0] else {}, cached[1]

    # ------------------------------------------------------------------ intent log
    def _open(self) -> dict[str, _Open]:
        c = self._cache
        if c.open is None:
            with self.engine.connect() as conn:
                rows = conn.execute(select(actions).where(actions.c.done.is_(False))).all()
            c.open, c.open_by_target, c.open_by_domain = {}, {}, {}
            for r in rows:
                m = r._mapping
                c.add_open(_Open(m["action_id"], m["domain"], m["kind"], m["target"], m["site"], m["reason"],
                                 m["type"], m["body"], m["created_at"], m["sent_at"], m["attempts"]))
        assert c.open is not None
        return c.open

    def _insert_actions(self, conn: Connection, domain: str, plan: Plan, now: float) -> None:
        rows = [dict(action_id=p.action_id, domain=domain, kind=p.kind, target=p.instance_id, site=p.site,
                     reason=p.reason, type=p.message.TYPE, body=p.message.model_dump_json(), created_at=now,
                     attempts=0, done=False) for p in plan.actions]
        if not rows:
            return
        conn.execute(insert(actions), rows)
        opened = [_Open(r["action_id"], domain, r["kind"], r["target"], r["site"], r["reason"], r["type"],
                        r["body"], now, None, 0, p.message) for r, p in zip(rows, plan.actions, strict=True)]

        def apply() -> None:
            if self._cache.open is not None:
                for o in opened:
                    self._cache.add_open(o)

        self._then(apply)

    def commit_plan(self, domain: str, plan: Plan, now: float, memory: dict[str, Any] | None,
                    iteration: int, refreshed: Iterable[Instance] = (),
                    fence: Callable[[Connection], None] | None = None) -> None:
        """Store the iteration's effects and its actions in one transaction, before any is sent.
        ``fence`` runs first in that transaction and raises if this engine may no longer act
        on the domain (``lease.Leases.fence``): then nothing of the plan is stored."""
        with self._write(cas=True) as conn:
            self._plan_rows(conn, PlanWrite(domain, plan, now, memory, iteration, refreshed, fence))

    def commit_plans(self, writes: list[PlanWrite]) -> dict[str, Exception]:
        """Several domains' plans in one transaction — one commit for an iteration over 1,000
        domains, not 1,000 — each in a savepoint of its own, its lease checked first
        (``PlanWrite.fence``). A domain whose check or write fails has its savepoint rolled back
        and its working-set updates dropped, and is returned with the error; the others are
        stored. Raises (nothing stored) when the transaction itself fails."""
        failed: dict[str, Exception] = {}
        # the generation bump first: pysqlite opens the transaction only at the first write, and a
        # SAVEPOINT before that would start (and its RELEASE end) a transaction of its own
        with self._write(cas=True) as conn:
            assert self._after is not None
            cursor = conn.connection.cursor()
            try:
                for w in writes:
                    mark = len(self._after)
                    try:
                        with _savepoint(cursor):
                            self._plan_rows(conn, w)
                    except _TransactionBroken:
                        raise
                    except Exception as exc:
                        del self._after[mark:]  # rolled back: the working set must not see it
                        failed[w.domain] = exc
            finally:
                cursor.close()
        return failed

    def _plan_rows(self, conn: Connection, w: PlanWrite) -> None:
        """A plan's rows in the caller's transaction, the lease checked first (``commit_plan``)."""
        domain, plan, memory, iteration = w.domain, w.plan, w.memory, w.iteration
        if w.fence is not None:
            w.fence(conn)
        self.save_instances([*w.refreshed, *plan.instances.values()], conn)
        self.save_sites(plan.sites.values(), conn)
        self._insert_actions(conn, domain, plan, w.now)
        for p in plan.actions:
            if p.kind == "terminate":  # giving an instance up supersedes what was still open for it
                self.complete(target=p.instance_id, kinds=("launch", "add", "offline", "online"),
                              outcome="superseded by terminate", conn=conn)
        values: dict[str, Any] = {"iteration": iteration}
        if memory is not None:
            values["memory"] = json.dumps(memory)
        _upsert(conn, domain_state, {"domain": domain}, values)

        def apply() -> None:
            old = self._cache.memory.get(domain)
            if memory is not None:
                self._cache.memory[domain] = (json.loads(values["memory"]), iteration)
            elif old is not None:
                self._cache.memory[domain] = (old[0], iteration)

        self._then(apply)

    def store_actions(self, domain: str, plan: Plan, now: float,
                      fence: Callable[[Connection], None] | None = None) -> None:
        """Store out-of-iteration actions with their instance rows (``fence`` as in ``commit_plan``)."""
        with self._write(cas=True) as conn:
            if fence is not None:
                fence(conn)
            self.save_instances(plan.instances.values(), conn)
            self.save_sites(plan.sites.values(), conn)
            self._insert_actions(conn, domain, plan, now)

    def mark_sent(self, action_ids: list[str], now: float) -> None:
        if not action_ids:
            return
        with self._write() as conn:
            conn.execute(_SENT, {"ids": list(action_ids), "at": now})

            def apply() -> None:
                if self._cache.open is not None:
                    for aid in action_ids:
                        o = self._cache.open.get(aid)
                        if o is not None:
                            o.sent_at, o.attempts = now, o.attempts + 1

            self._then(apply)

    def unsent_or_due(self, domains: list[str], now: float, resend_seconds: float) -> list[Message]:
        """Open actions never sent, or sent longer than ``resend_seconds`` ago (oldest first)."""
        self._open()
        by_domain = self._cache.open_by_domain
        due = now - resend_seconds
        out = [o for d in dict.fromkeys(domains) for o in by_domain.get(d, {}).values()
               if o.sent_at is None or o.sent_at <= due]
        out.sort(key=lambda o: (o.created_at, o.action_id))
        return [o.msg() for o in out]

    def overdue(self, domain: str, sent_before: float) -> bool:
        """Is a launch or terminate of ``domain`` first sent before ``sent_before`` still unanswered?
        (The provisioner acknowledges each within a second when it is up.)"""
        first = self.first_unanswered(domain)
        return first is not None and first < sent_before

    def first_unanswered(self, domain: str) -> float | None:
        """When the oldest launch or terminate of ``domain`` that was sent and is still open was
        created (None: none): ``overdue`` turns at that time plus its span."""
        return min((o.created_at for o in self._open_of(domain)
                    if o.kind in ("launch", "terminate") and o.attempts > 0), default=None)

    def _open_of(self, domain: str) -> Iterable[_Open]:
        self._open()
        return self._cache.open_by_domain.get(domain, {}).values()

    def in_flight(self, domain: str) -> set[tuple[str, str]]:
        return {(o.target, o.kind) for o in self._open_of(domain)}

    def open_sent_at(self, domain: str) -> list[float | None]:
        """When each open action of ``domain`` was last sent (None: never)."""
        return [o.sent_at for o in self._open_of(domain)]

    def complete(self, *, action_id: str | None = None, target: str | None = None,
                 kinds: tuple[str, ...] = (), outcome: str, conn: Connection | None = None) -> int:
        """Mark open actions done (by id, or by target and kind); returns how many were open."""
        open_ = self._open()
        if action_id is not None:
            ids = [action_id] if action_id in open_ else []
        else:
            ids = sorted(self._cache.open_by_target.get(target, ())) if target is not None else list(open_)
        ids = [i for i in ids if (target is None or open_[i].target == target)
               and (not kinds or open_[i].kind in kinds)]
        if not ids:
            return 0  # nothing open: the working set says so, no need to ask the database
        with self._write(conn) as c:
            n = c.execute(_DONE, {"ids": ids, "outcome": outcome}).rowcount

            def apply() -> None:
                if self._cache.open is not None:
                    for i in ids:
                        self._cache.close(i)

            self._then(apply)
        return n

    def record_instance_event(self, inst: Instance, kinds: tuple[str, ...], outcome: str) -> None:
        """An instance event's effect in one transaction: the row, and its open actions of ``kinds``
        done (they are answered). A compare-and-set (``StaleWrite``)."""
        with self._write(cas=True) as conn:
            self.save_instances([inst], conn)
            self.complete(target=inst.instance_id, kinds=kinds, outcome=outcome, conn=conn)

    def record_node_result(self, action_id: str, outcome: str, inst: Instance | None) -> None:
        """A node command's answer in one transaction: the action done with its outcome and, when
        the answer changes it, the instance row. A compare-and-set (``StaleWrite``): the change was
        computed from the row as this engine read it."""
        with self._write(cas=True) as conn:
            self.complete(action_id=action_id, outcome=outcome, conn=conn)
            if inst is not None:
                self.save_instances([inst], conn)

    # ------------------------------------------------------------------ job spans (epu cost)
    def open_jobs(self, domain: str) -> dict[int, JobSpan]:
        """The domain's spans still open (row → span, ``seen`` when the domain's last snapshot was)."""
        q = (select(job_spans, job_seen.c.seen_at).join(job_seen, job_seen.c.domain == job_spans.c.domain)
             .where(job_spans.c.domain == domain, job_spans.c.end_at.is_(None)))
        with self.engine.connect() as conn:
            return {r.id: _span(r) for r in conn.execute(q)}

    def note_jobs(self, domain: str, at: float, opened: list[JobSpan], closed: list[tuple[int, float]]) -> list[int]:
        """One snapshot's effect on the domain's spans, in one transaction: ``closed`` (row, end)
        end, the domain was seen ``at`` (its open spans with it), ``opened`` start. Returns the
        new rows' ids. Not a working-set write: the generation does not move (no engine's cached
        working set is stale for it)."""
        rows: list[int] = []
        with self.engine.begin() as conn:
            if closed:
                conn.execute(update(job_spans).where(job_spans.c.id == bindparam("row")).values(
                    end_at=bindparam("end")), [{"row": r, "end": e} for r, e in closed])
            _upsert(conn, job_seen, {"domain": domain}, {"seen_at": at})
            for sp in opened:
                rows.append(conn.execute(insert(job_spans).values(
                    domain=sp.domain, instance_id=sp.instance_id, job_id=sp.job_id, start_at=sp.start,
                    end_at=sp.end, owner_account=sp.account, owner_user=sp.user,
                    owner_partition=sp.partition)).inserted_primary_key[0])
        return rows

    def job_spans(self, since: float, until: float, domain: str | None = None) -> list[JobSpan]:
        """Spans that may overlap [since, until): started before ``until``, and open or ended after
        ``since``, oldest first."""
        q = (select(job_spans, job_seen.c.seen_at).join(job_seen, job_seen.c.domain == job_spans.c.domain,
                                                        isouter=True)
             .where(job_spans.c.start_at < until, job_spans.c.end_at.is_(None) | (job_spans.c.end_at > since)))
        if domain:
            q = q.where(job_spans.c.domain == domain)
        with self.engine.connect() as conn:
            return [_span(r) for r in conn.execute(q.order_by(job_spans.c.start_at, job_spans.c.id))]

    def action(self, action_id: str) -> dict[str, Any] | None:
        o = self._open().get(action_id)
        if o is not None:
            return o.row()
        with self.engine.connect() as conn:
            row = conn.execute(select(actions).where(actions.c.action_id == action_id)).first()
        return dict(row._mapping) if row else None

    def actions(self, domain: str | None = None, kind: str | None = None) -> list[dict[str, Any]]:
        q = select(actions)
        if domain:
            q = q.where(actions.c.domain == domain)
        if kind:
            q = q.where(actions.c.kind == kind)
        with self.engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(q.order_by(actions.c.created_at))]


def _span(row: Any) -> JobSpan:
    seen = row.seen_at if row.seen_at is not None else row.start_at
    return JobSpan(row.domain, row.instance_id, row.job_id, row.start_at, max(seen, row.start_at), row.end_at,
                   row.owner_account, row.owner_user, row.owner_partition)


def history_entry(row: dict[str, Any]) -> dict[str, Any]:
    """A ``decision_changes`` row as ``PolicyChangeEntry`` fields (both stores)."""
    try:
        request = json.loads(row.get("request") or "{}")
    except ValueError:
        request = {}
    return {"change_id": row["change_id"], "at": float(row["at"]), "operator": row.get("operator") or "",
            "applied": bool(row["applied"]), "version": row.get("version"), "reason": row.get("reason") or "",
            "request": request if isinstance(request, dict) else {}}


def count_per_site(live: Iterable[Instance]) -> tuple[dict[str, int], dict[str, int]]:
    """(instances per site, launched-but-not-joined per site) of ``live`` (both stores)."""
    per: dict[str, int] = {}
    unproven: dict[str, int] = {}
    for inst in live:
        per[inst.site] = per.get(inst.site, 0) + 1
        if inst.state in ("requested", "pending", "started"):
            unproven[inst.site] = unproven.get(inst.site, 0) + 1
    return per, unproven


def count_per_type(live: Iterable[Instance]) -> dict[tuple[str, str], int]:
    """Instances per (site, instance type) of ``live`` (both stores)."""
    out: dict[tuple[str, str], int] = {}
    for inst in live:
        key = (inst.site, inst.instance_type)
        out[key] = out.get(key, 0) + 1
    return out


def seed_merge(cfg: DomainConfig, text: str, current: str | None, last_file: str | None) -> DomainConfig | None:
    """What seeding the file's ``cfg`` (serialized: ``text``) makes current, given the current
    config and the last file read (JSON, None if unknown) — None when the file did not change
    since it was last read (the current version stands). Shared by both stores."""
    if current is not None and last_file == text:
        return None
    if current is None or last_file is None:
        return cfg
    return merge_file_config(DomainConfig.model_validate_json(current), DomainConfig.model_validate_json(last_file),
                             cfg)


def merge_file_config(current: DomainConfig, last_file: DomainConfig, new_file: DomainConfig) -> DomainConfig:
    """``current`` with the keys the file changed (``last_file`` → ``new_file``) taken from the file.

    ``params`` merge per parameter; a new policy in the file brings the file's parameters with it
    (the old ones would not fit its schema). If the result does not validate (an operator's
    policy with parameters of the file's), the file wins as a whole."""
    from epu.services.decision.policies import PolicyError, validate_params

    cur, old, new = current.model_dump(), last_file.model_dump(), new_file.model_dump()
    out = dict(cur)
    for key, value in new.items():
        if key == "params":
            continue
        if value != old.get(key):
            out[key] = value
    if new["policy"] != old["policy"]:
        out["params"] = dict(new["params"])
    else:
        params = dict(cur["params"])
        for k in set(old["params"]) | set(new["params"]):
            if new["params"].get(k) != old["params"].get(k):
                if k in new["params"]:
                    params[k] = new["params"][k]
                else:
                    params.pop(k, None)
        out["params"] = params
    try:
        merged = DomainConfig.model_validate(out)
        validate_params(merged.policy, merged.params)
    except (ValueError, PolicyError):
        return new_file
    return merged


def message_of(row: dict[str, Any]) -> Message:
    return REGISTRY[row["type"]].model_validate(json.loads(row["body"]))
