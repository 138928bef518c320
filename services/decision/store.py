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
* ``domain_state`` — policy memory (threshold timers, utilisation samples) and the iteration count.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import fields
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
    and_,
    bindparam,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.engine import Connection, Engine

from common.config.decision import DomainConfig
from common.db import create_schema, make_engine
from common.messages import REGISTRY, Message
from services.decision.placement import SiteHealth
from services.decision.planner import Plan
from services.decision.view import LIVE_STATES, Instance

metadata = MetaData()

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

_INSTANCE_FIELDS = [f.name for f in fields(Instance)]


def _instance(row: Any) -> Instance:
    m = row._mapping
    return Instance(**{k: m[k] for k in _INSTANCE_FIELDS})


def _upsert(conn: Connection, table: Table, key: dict[str, Any], values: dict[str, Any]) -> None:
    """Portable upsert: update, insert when nothing matched (one engine writes at a time)."""
    cond = and_(*[table.c[k] == v for k, v in key.items()])
    if conn.execute(update(table).where(cond).values(**values)).rowcount == 0:
        conn.execute(insert(table).values(**key, **values))


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
        with self.engine.connect() as conn:
            row = conn.execute(select(domain_configs.c.version, domain_configs.c.config)
                               .where(domain_configs.c.domain == domain)
                               .order_by(domain_configs.c.version.desc()).limit(1)).first()
        return (row.version, DomainConfig.model_validate(json.loads(row.config))) if row else None

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
            return version

        if conn is not None:
            return do(conn)
        with self.engine.begin() as c:
            return do(c)

    def seed_config(self, domain: str, cfg: DomainConfig, now: float) -> int:
        """Make the file's config current when it is new or the file changed since last seeded;
        otherwise keep the current version (an operator's change survives a restart).

        Two engines starting together may race on the same version number: the loser's insert
        fails on the primary key, and its second attempt finds the winner's seed."""
        from sqlalchemy.exc import IntegrityError

        try:
            return self._seed_config(domain, cfg, now)
        except IntegrityError:
            return self._seed_config(domain, cfg, now)

    def _seed_config(self, domain: str, cfg: DomainConfig, now: float) -> int:
        text = cfg.model_dump_json()
        with self.engine.begin() as conn:
            row = conn.execute(select(domain_state.c.file_config).where(domain_state.c.domain == domain)).first()
            has = conn.execute(select(func.count()).select_from(domain_configs)
                               .where(domain_configs.c.domain == domain)).scalar()
            if has and row is not None and row.file_config == text:
                return int(conn.execute(select(func.max(domain_configs.c.version))
                                        .where(domain_configs.c.domain == domain)).scalar())
            version = self.put_config(domain, cfg, source="file", now=now, conn=conn)
            _upsert(conn, domain_state, {"domain": domain}, {"file_config": text})
            return version

    def change_outcome(self, change_id: str) -> dict[str, Any] | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(changes).where(changes.c.change_id == change_id)).first()
        return dict(row._mapping) if row else None

    def record_change(self, change_id: str, domain: str, applied: bool, reason: str, now: float,
                      cfg: DomainConfig | None = None) -> int | None:
        """Store a change's outcome (and the new config version when applied) atomically."""
        with self.engine.begin() as conn:
            version = self.put_config(domain, cfg, source="operator", now=now, change_id=change_id,
                                      conn=conn) if applied and cfg is not None else None
            conn.execute(insert(changes).values(change_id=change_id, domain=domain, applied=applied,
                                                version=version, reason=reason, at=now))
            return version

    # ------------------------------------------------------------------ instances
    def instances(self, domain: str | None = None, live_only: bool = True) -> list[Instance]:
        q = select(*[instances.c[f] for f in _INSTANCE_FIELDS])  # field order: Instance(*row)
        if domain is not None:
            q = q.where(instances.c.domain == domain)
        if live_only:
            q = q.where(instances.c.state.in_(LIVE_STATES))
        with self.engine.connect() as conn:
            return [Instance(*r) for r in conn.execute(q.order_by(instances.c.launched_at))]

    def instance(self, instance_id: str) -> Instance | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(instances).where(instances.c.instance_id == instance_id)).first()
        return _instance(row) if row else None

    def save_instances(self, items: Iterable[Instance], conn: Connection | None = None) -> None:
        def do(c: Connection) -> None:
            # Batched (executemany with bound parameters): a burst of a thousand launches is
            # one update and one insert, not a thousand statements compiled one by one.
            rows = {inst.instance_id: {f: getattr(inst, f) for f in _INSTANCE_FIELDS} for inst in items}
            if not rows:
                return
            known: set[str] = set()
            ids = list(rows)
            for i in range(0, len(ids), 500):  # stay under every backend's bound-parameter limit
                known.update(c.scalars(select(instances.c.instance_id)
                                       .where(instances.c.instance_id.in_(ids[i:i + 500]))))
            if known:
                stmt = (update(instances).where(instances.c.instance_id == bindparam("_id"))
                        .values({f: bindparam(f) for f in _INSTANCE_FIELDS if f != "instance_id"}))
                c.execute(stmt, [{**{k: v for k, v in rows[i].items() if k != "instance_id"}, "_id": i}
                                 for i in ids if i in known])
            new = [rows[i] for i in ids if i not in known]
            if new:
                c.execute(insert(instances), new)

        if conn is not None:
            do(conn)
        else:
            with self.engine.begin() as c:
                do(c)

    def live_per_site(self) -> tuple[dict[str, int], dict[str, int]]:
        """(live instances per site, launched-but-not-joined per site), over every domain."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(instances.c.site, instances.c.state, func.count())
                                .where(instances.c.state.in_(LIVE_STATES))
                                .group_by(instances.c.site, instances.c.state)).all()
        live: dict[str, int] = {}
        unproven: dict[str, int] = {}
        for site, state, n in rows:
            live[site] = live.get(site, 0) + n
            if state in ("requested", "pending", "started"):
                unproven[site] = unproven.get(site, 0) + n
        return live, unproven

    # ------------------------------------------------------------------ sites
    def site_health(self) -> dict[str, SiteHealth]:
        with self.engine.connect() as conn:
            return {r.name: SiteHealth(r.name, r.failures, r.backoff_until, r.last_error, r.stalls)
                    for r in conn.execute(select(sites))}

    def save_sites(self, items: Iterable[SiteHealth], conn: Connection | None = None) -> None:
        def do(c: Connection) -> None:
            for h in items:
                _upsert(c, sites, {"name": h.name}, {"failures": h.failures, "backoff_until": h.backoff_until,
                                                     "last_error": h.last_error, "stalls": h.stalls})

        if conn is not None:
            do(conn)
        else:
            with self.engine.begin() as c:
                do(c)

    # ------------------------------------------------------------------ policy memory
    def memory(self, domain: str) -> tuple[dict[str, Any], int]:
        with self.engine.connect() as conn:
            row = conn.execute(select(domain_state.c.memory, domain_state.c.iteration)
                               .where(domain_state.c.domain == domain)).first()
        return (json.loads(row.memory or "{}"), row.iteration or 0) if row else ({}, 0)

    # ------------------------------------------------------------------ intent log
    def commit_plan(self, domain: str, plan: Plan, now: float, memory: dict[str, Any] | None,
                    iteration: int, refreshed: Iterable[Instance] = ()) -> None:
        """Store the iteration's effects and its actions in one transaction, before any is sent."""
        with self.engine.begin() as conn:
            self.save_instances([*refreshed, *plan.instances.values()], conn)
            self.save_sites(plan.sites.values(), conn)
            for p in plan.actions:
                conn.execute(insert(actions).values(
                    action_id=p.action_id, domain=domain, kind=p.kind, target=p.instance_id, site=p.site,
                    reason=p.reason, type=p.message.TYPE, body=p.message.model_dump_json(), created_at=now,
                    attempts=0, done=False))
            for p in plan.actions:
                if p.kind == "terminate":  # giving an instance up supersedes what was still open for it
                    self.complete(target=p.instance_id, kinds=("launch", "add", "offline", "online"),
                                  outcome="superseded by terminate", conn=conn)
            values: dict[str, Any] = {"iteration": iteration}
            if memory is not None:
                values["memory"] = json.dumps(memory)
            _upsert(conn, domain_state, {"domain": domain}, values)

    def store_actions(self, domain: str, plan: Plan, now: float) -> None:
        """Store out-of-iteration actions (e.g. a capacity failover) with their instance rows."""
        with self.engine.begin() as conn:
            self.save_instances(plan.instances.values(), conn)
            self.save_sites(plan.sites.values(), conn)
            for p in plan.actions:
                conn.execute(insert(actions).values(
                    action_id=p.action_id, domain=domain, kind=p.kind, target=p.instance_id, site=p.site,
                    reason=p.reason, type=p.message.TYPE, body=p.message.model_dump_json(), created_at=now,
                    attempts=0, done=False))

    def mark_sent(self, action_ids: list[str], now: float) -> None:
        if not action_ids:
            return
        with self.engine.begin() as conn:
            conn.execute(update(actions).where(actions.c.action_id.in_(action_ids))
                         .values(sent_at=now, attempts=actions.c.attempts + 1))

    def unsent_or_due(self, domains: list[str], now: float, resend_seconds: float) -> list[Message]:
        """Open actions never sent, or sent longer than ``resend_seconds`` ago (oldest first)."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(actions.c.type, actions.c.body).where(
                actions.c.done.is_(False), actions.c.domain.in_(domains),
                (actions.c.sent_at.is_(None)) | (actions.c.sent_at <= now - resend_seconds))
                .order_by(actions.c.created_at)).all()
        return [REGISTRY[r.type].model_validate(json.loads(r.body)) for r in rows]

    def in_flight(self, domain: str) -> set[tuple[str, str]]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(actions.c.target, actions.c.kind)
                                .where(actions.c.domain == domain, actions.c.done.is_(False))).all()
        return {(r.target, r.kind) for r in rows}

    def complete(self, *, action_id: str | None = None, target: str | None = None,
                 kinds: tuple[str, ...] = (), outcome: str, conn: Connection | None = None) -> int:
        """Mark open actions done (by id, or by target and kind); returns how many were open."""
        cond = [actions.c.done.is_(False)]
        if action_id is not None:
            cond.append(actions.c.action_id == action_id)
        if target is not None:
            cond.append(actions.c.target == target)
        if kinds:
            cond.append(actions.c.kind.in_(kinds))
        stmt = update(actions).where(and_(*cond)).values(done=True, outcome=outcome)
        if conn is not None:
            return conn.execute(stmt).rowcount
        with self.engine.begin() as c:
            return c.execute(stmt).rowcount

    def action(self, action_id: str) -> dict[str, Any] | None:
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


def message_of(row: dict[str, Any]) -> Message:
    return REGISTRY[row["type"]].model_validate(json.loads(row["body"]))
