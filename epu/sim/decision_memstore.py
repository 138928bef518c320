"""The decision engine's store and leases held in process memory, behind the interfaces of
``store.Store`` and ``lease.Leases``.

Why it exists: the simulators (``epu sim``, ``epu simulate``) run the real engine for thousands
of virtual hours, and profiling showed the engine's SQL as their largest remaining cost — every
iteration reads the generation counter (``Store.sync``) and renews the domain's lease
(``Leases.hold``), and every event, command result and plan is a write transaction. This twin
keeps the same tables in dicts with the same semantics — writes checked for a fault before they
touch anything and applied whole, duplicate change ids refused with ``IntegrityError``, leases
taken with a new epoch only when free or run out, a plan committed only while its lease holds —
so the engine cannot tell the difference. Even the order of instances launched at the same moment
is the SQL store's: its working set lists them by last write, reloaded in row order when another
engine wrote (each handle here keeps that order, ``_order``), so a run replays the one on SQLite
(tests/sim/test_replay.py). ``tests/conformance/`` runs the store tests
against it too. Production uses ``Store`` and ``Leases`` (SQLite or PostgreSQL); nothing
configures this one.

Durability is modelled the way a database is: a ``MemoryDecisionDatabase`` holds the data and
outlives the ``MemoryStore`` and ``MemoryLeases`` handles opened on it (a simulated engine that
crashes loses its handle, not the database); several engines share one. Handles read the shared
data (no stale cache to drop), but keep the instance order. ``before_write`` is called before each write
transaction touches anything, as a database refusing writes would refuse it (the simulator's
store faults).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy.exc import IntegrityError

from epu.common.config.decision import DomainConfig
from epu.common.messages import Message
from epu.services.decision.lease import Fenced, Held, StaleWrite
from epu.services.decision.occupancy import JobSpan
from epu.services.decision.placement import SiteHealth
from epu.services.decision.planner import Plan
from epu.services.decision.store import (
    _LAUNCHED,
    _STAMPS,
    ENDED,
    HISTORY_LIMIT,
    PlanWrite,
    count_live,
    count_per_site,
    count_per_type,
    history_entry,
    message_of,
    seed_merge,
)
from epu.services.decision.view import LIVE_STATES, PENDING_STATES, Instance


@dataclass
class _Lease:
    holder: str = ""
    epoch: int = 0
    expires_at: float = 0.0


@dataclass
class MemoryDecisionDatabase:
    """The shared data of the engines' store: what the SQL tables hold (``store.metadata``)."""

    configs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Domain → its config rows, oldest version first."""
    changes: dict[str, dict[str, Any]] = field(default_factory=dict)
    instances: dict[str, Instance] = field(default_factory=dict)
    """Every instance ever stored, in insertion order (as the table's rows)."""
    live: dict[str, None] = field(default_factory=dict)
    """The ids of live instances, in row order (reads need not scan every instance ever)."""
    unclean: dict[str, None] = field(default_factory=dict)
    """The ids of ended instances whose batch node still needs a confirmed removal."""
    actions: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The intent log's rows, in insertion order."""
    messages: dict[str, Message] = field(default_factory=dict)
    """Open actions' messages (parsed once, as ``store._Open`` keeps them)."""
    open: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The rows of ``actions`` not done yet."""
    open_by_target: dict[str, dict[str, None]] = field(default_factory=dict)
    sites: dict[str, SiteHealth] = field(default_factory=dict)
    state: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Domain → ``memory`` (JSON text), ``iteration``, ``file_config``."""
    leases: dict[str, _Lease] = field(default_factory=dict)
    generation: int = 0
    before_write: Callable[[], None] | None = None
    counts: tuple[dict[str, int], dict[str, int]] | None = None
    """``count_per_site`` of ``live``, kept current by ``save_instances`` (the only writer of
    ``instances`` and ``live``) once counted: the engine asks every iteration, and counting
    every live instance each time was ~3 % of a NASA run. A site counted down to 0 has no key
    (as ``Store``'s own counts: readers ``get`` with a default, none iterates them)."""
    type_counts: dict[tuple[str, str], int] | None = None
    """Likewise ``count_per_type`` of ``live``."""
    job_spans: dict[int, JobSpan] = field(default_factory=dict)
    """Row → a job span (``occupancy``), rows numbered from 1 as the table's ids."""
    open_spans: dict[str, dict[int, None]] = field(default_factory=dict)
    """Domain → the rows of its spans still open."""
    job_seen: dict[str, float] = field(default_factory=dict)
    """Domain → when its last snapshot was applied to the spans (``decision_job_seen``)."""

    def recount(self, old: Instance | None, new: Instance | None) -> None:
        """Move the kept counts from ``old`` (a live row replaced, None: none) to ``new`` (the
        live row replacing it, None: none). Most writes change a timer, not what is counted:
        the same site, type and pendingness cost three comparisons."""
        if self.counts is None and self.type_counts is None:
            return
        if old is not None:
            if (new is not None and old.site == new.site and old.instance_type == new.instance_type
                    and (old.state in PENDING_STATES) == (new.state in PENDING_STATES)):
                return
            self._count(old, -1)
        if new is not None:
            self._count(new, 1)

    def _count(self, inst: Instance, sign: int) -> None:
        count_live(self.counts, self.type_counts, inst, sign)


def _ended_unclean(inst: Instance) -> bool:
    return inst.state in ENDED and not inst.removed and (inst.add_sent_at is not None or inst.seen_at is not None)


class MemoryStore:
    """``store.Store``'s interface on a ``MemoryDecisionDatabase``."""

    def __init__(self, db: MemoryDecisionDatabase | None = None) -> None:
        self.db = db if db is not None else MemoryDecisionDatabase()
        self._order: dict[str, None] | None = None
        """Instance ids in the order ``Store``'s working set would list them (None: reload)."""
        self._gen = -1
        self._basis = -1
        """The generation this handle last read at (``sync``) or wrote (-1: never): a write that
        changes an instance is refused (``StaleWrite``) if another handle wrote since, as
        ``Store._write(cas=True)`` does. ``_gen`` cannot serve: a read that reloads moves it."""
        self._stamps: dict[str, int] = {}
        """Domain → stamp of its instances as listed (``Store.domain_stamp``); reset on reload."""
        self._listed: dict[str, tuple[int, list[Instance]]] = {}
        """Domain → (its stamp, its live instances as ``instances`` lists them): while the stamp
        stands, the same instance objects in the same order, so the same sorted list."""

    def create(self) -> MemoryStore:
        return self

    def invalidate(self) -> None:
        """As ``Store.invalidate``: the instance order is reloaded (row order by launch)."""
        self._order = None

    def sync(self) -> None:
        """As ``Store.sync``: another engine wrote since this one looked — reload the order."""
        if self.db.generation != self._gen:
            self._order = None
            self._gen = self.db.generation
        self._basis = self.db.generation

    def _loaded(self) -> dict[str, None]:
        """The live instances' ids, in the order of ``Store``'s working set (reloaded as it is)."""
        if self._order is None or self.db.generation != self._gen:  # (re)load, as Store does
            known = self.db.instances
            self._order = dict.fromkeys(i.instance_id for i in sorted((known[iid] for iid in self.db.live),
                                                                      key=_LAUNCHED))
            self._gen = self.db.generation
            self._stamps = {}  # listed anew: every domain gets a new stamp
        return self._order

    def _live(self) -> Iterable[Instance]:
        """The live instances, in the order of ``Store``'s working set (``map``: in C)."""
        return map(self.db.instances.__getitem__, self._loaded())

    @contextmanager
    def _write(self, conn: Any = None, cas: bool = False) -> Iterator[Any]:
        """A write transaction (nested in the caller's when ``conn`` is given): the fault hook
        runs before anything is touched; the generation counter moves once per transaction.
        ``cas``: a compare-and-set on the generation (``Store._write``)."""
        if conn is not None:
            yield conn
            return
        self._begin(cas)
        yield self
        self._commit()

    def _begin(self, cas: bool = False) -> None:
        """A write transaction starts: the fault hook may refuse it, and (``cas``) a write resting
        on a read another handle's write made stale is refused — before anything is touched."""
        if self.db.before_write is not None:
            self.db.before_write()
        if cas and self._basis != -1 and self.db.generation != self._basis:
            read_at = self._basis
            self._basis = self.db.generation
            self._order = None
            raise StaleWrite(f"the decision store moved on (generation {self.db.generation}, read at {read_at}): "
                             "another engine wrote since; read again and redo")

    def _commit(self) -> None:
        """A write transaction ends: the generation counter moves (once per transaction)."""
        self.db.generation += 1
        if self.db.generation - 1 != self._gen:
            self._order = None  # another engine wrote since we last looked, as Store drops its cache
        self._gen = self._basis = self.db.generation

    # ------------------------------------------------------------------ configs
    def current_config(self, domain: str) -> tuple[int, DomainConfig] | None:
        rows = self.db.configs.get(domain)
        if not rows:
            return None
        top = rows[-1]
        if "parsed" not in top:
            top["parsed"] = DomainConfig.model_validate(json.loads(top["config"]))
        return top["version"], top["parsed"]

    def config_history(self, domain: str) -> list[dict[str, Any]]:
        return [{**{k: v for k, v in r.items() if k != "parsed"}, "config": json.loads(r["config"])}
                for r in self.db.configs.get(domain, [])]

    def domains(self) -> list[str]:
        return list(self.db.configs)

    def put_config(self, domain: str, cfg: DomainConfig, *, source: str, now: float,
                   change_id: str | None = None, conn: Any = None) -> int:
        with self._write(conn):
            rows = self.db.configs.setdefault(domain, [])
            version = rows[-1]["version"] + 1 if rows else 1
            rows.append({"domain": domain, "version": version, "config": cfg.model_dump_json(), "source": source,
                         "change_id": change_id, "created_at": now, "parsed": cfg})
            return version

    def seed_config(self, domain: str, cfg: DomainConfig, now: float) -> int:
        """As ``Store.seed_config`` (the file's keys that changed win; see there)."""
        text = cfg.model_dump_json()
        with self._write() as conn:
            st = self.db.state.get(domain)
            rows = self.db.configs.get(domain)
            current = rows[-1] if rows else None
            last_file = st.get("file_config") if st is not None else None
            merged = seed_merge(cfg, text, current["config"] if current else None, last_file)
            if merged is None:
                assert current is not None
                return int(current["version"])
            self._state(domain)["file_config"] = text
            if current is not None and merged.model_dump_json() == current["config"]:
                return int(current["version"])
            return self.put_config(domain, merged, source="file", now=now, conn=conn)

    def change_outcome(self, change_id: str) -> dict[str, Any] | None:
        row = self.db.changes.get(change_id)
        return dict(row) if row is not None else None

    def record_change(self, change_id: str, domain: str, applied: bool, reason: str, now: float,
                      cfg: DomainConfig | None = None, retire: Iterable[Instance] = (), *,
                      operator: str = "", request: str = "") -> int | None:
        with self._write(cas=True) as conn:
            if change_id in self.db.changes:
                raise IntegrityError("INSERT INTO decision_changes", None, Exception(f"duplicate change {change_id}"))
            version = self.put_config(domain, cfg, source="operator", now=now, change_id=change_id,
                                      conn=conn) if applied and cfg is not None else None
            self.db.changes[change_id] = {"change_id": change_id, "domain": domain, "applied": applied,
                                          "version": version, "reason": reason, "at": now,
                                          "operator": operator, "request": request}
            if applied:
                self.save_instances(list(retire), conn)
            return version

    def change_history(self, domain: str, limit: int = HISTORY_LIMIT) -> list[dict[str, Any]]:
        """As ``Store.change_history``."""
        rows = sorted((c for c in self.db.changes.values() if c["domain"] == domain), key=lambda c: c["at"])
        return [history_entry(c) for c in rows[-limit:]]

    def _state(self, domain: str) -> dict[str, Any]:
        return self.db.state.setdefault(domain, {"memory": "{}", "iteration": 0, "file_config": None})

    # ------------------------------------------------------------------ instances
    def instances(self, domain: str | None = None, live_only: bool = True) -> list[Instance]:
        if live_only and domain is not None:
            return list(self._listing(domain))
        if live_only:
            return sorted((i for i in self._live() if domain is None or i.domain == domain),
                          key=_LAUNCHED)
        return sorted((i for i in self.db.instances.values() if domain is None or i.domain == domain),
                      key=lambda i: (i.launched_at, i.instance_id))

    def _listing(self, domain: str) -> list[Instance]:
        """The domain's live instances as ``instances`` lists them — the kept list itself (not
        to be changed), sorted anew only when the domain's stamp moved."""
        stamp = self.domain_stamp(domain)
        hit = self._listed.get(domain)
        if hit is None or hit[0] != stamp:
            hit = self._listed[domain] = (stamp, sorted([i for i in self._live() if i.domain == domain],
                                                        key=_LAUNCHED))
        return hit[1]

    def terminating(self, domain: str) -> list[Instance]:
        """As ``Store.terminating`` (filtered from the kept list, no copy of it first)."""
        return [i for i in self._listing(domain) if i.state == "terminating"]

    def domain_stamp(self, domain: str) -> int:
        """As ``Store.domain_stamp``: equal stamps, the same instance objects in the same order."""
        self._loaded()
        return self._stamps.setdefault(domain, next(_STAMPS))

    def cleanup(self, domain: str) -> list[Instance]:
        known = self.db.instances
        return sorted((known[iid] for iid in self.db.unclean if known[iid].domain == domain),
                      key=lambda i: (i.launched_at, i.instance_id))

    def known(self, instance_ids: list[str]) -> dict[str, Instance | None]:
        """(Unknown ids map to ``None``, as the port allows: no test per id.)"""
        return dict(zip(instance_ids, map(self.db.instances.get, instance_ids), strict=True))

    def instance(self, instance_id: str) -> Instance | None:
        return self.db.instances.get(instance_id)

    def save_instances(self, items: Iterable[Instance], conn: Any = None) -> None:
        items = list(items)
        if not items:
            return
        with self._write(conn, cas=True):
            self._put(items)

    def _put(self, items: list[Instance]) -> None:
        """``save_instances``' rows, inside the caller's write transaction."""
        db = self.db
        order, live, known, unclean, stamps = self._order, db.live, db.instances, db.unclean, self._stamps
        for inst in items:
            iid = inst.instance_id
            alive = inst.state in LIVE_STATES
            was = iid in live  # before ``live`` changes: whether the old row counted
            if was or alive:
                db.recount(known[iid] if was else None, inst if alive else None)
            known[iid] = inst
            stamps[inst.domain] = next(_STAMPS)
            if order is not None:  # Store's working set moves a written instance last
                order.pop(iid, None)
            if alive:
                live[iid] = None
                if order is not None:
                    order[iid] = None
            else:
                live.pop(iid, None)
            if _ended_unclean(inst):
                unclean[iid] = None
            else:
                unclean.pop(iid, None)

    def live_per_site(self) -> tuple[dict[str, int], dict[str, int]]:
        """As ``Store.live_per_site``: counted once, then kept current (``db.counts``); copies,
        the caller adds its launches to them."""
        db = self.db
        if db.counts is None:
            db.counts = count_per_site(db.instances[iid] for iid in db.live)
        return dict(db.counts[0]), dict(db.counts[1])

    def live_per_type(self) -> dict[tuple[str, str], int]:
        """As ``Store.live_per_type`` (``db.type_counts``)."""
        db = self.db
        if db.type_counts is None:
            db.type_counts = count_per_type(db.instances[iid] for iid in db.live)
        return dict(db.type_counts)

    # ------------------------------------------------------------------ sites
    def site_health(self) -> dict[str, SiteHealth]:
        return dict(self.db.sites)

    def save_sites(self, items: Iterable[SiteHealth], conn: Any = None) -> None:
        items = list(items)
        if not items:
            return
        with self._write(conn):
            self.db.sites.update({h.name: h for h in items})

    # ------------------------------------------------------------------ policy memory
    def memory(self, domain: str) -> tuple[dict[str, Any], int]:
        st = self.db.state.get(domain)
        if st is None:
            return {}, 0
        text = st["memory"]
        # most policies keep no memory: "{}" read as a new empty dict without the parser (asked at
        # every iteration and by the simulator's wake check; ``Store.memory`` does the same)
        return (json.loads(text) if text and text != "{}" else {}), st["iteration"] or 0

    # ------------------------------------------------------------------ intent log
    def _new_actions(self, plan: Plan) -> None:
        """Refuse a plan re-using an action id before anything of it is stored (a primary key)."""
        for p in plan.actions:
            if p.action_id in self.db.actions:
                raise IntegrityError("INSERT INTO decision_actions", None, Exception(f"duplicate {p.action_id}"))

    def _insert_actions(self, domain: str, plan: Plan, now: float) -> None:
        for p in plan.actions:
            row = {"action_id": p.action_id, "domain": domain, "kind": p.kind, "target": p.instance_id,
                   "site": p.site, "reason": p.reason, "type": p.message.TYPE, "body": p.message.model_dump_json(),
                   "created_at": now, "sent_at": None, "attempts": 0, "done": False, "outcome": None}
            self.db.actions[p.action_id] = row
            self.db.open[p.action_id] = row
            self.db.messages[p.action_id] = p.message
            self.db.open_by_target.setdefault(p.instance_id, {})[p.action_id] = None

    def commit_plan(self, domain: str, plan: Plan, now: float, memory: dict[str, Any] | None,
                    iteration: int, refreshed: Iterable[Instance] = (),
                    fence: Callable[[Any], None] | None = None) -> None:
        """As ``Store.commit_plan``: nothing of the plan is stored if ``fence`` raises (checked
        first, as ``Store`` reports it before a ``StaleWrite``)."""
        if fence is not None:
            fence(None)
        with self._write(cas=True) as conn:
            self._plan_rows(conn, PlanWrite(domain, plan, now, memory, iteration, refreshed, None))

    def commit_plans(self, writes: list[PlanWrite]) -> dict[str, Exception]:
        """As ``Store.commit_plans``: one write transaction; a domain whose lease check or
        action ids fail stores nothing (each is checked before any of its rows is touched, so
        there is nothing to roll back) and is returned with the error."""
        failed: dict[str, Exception] = {}
        checked = []
        for w in writes:  # the leases first, as ``Store`` reports a ``Fenced`` before a ``StaleWrite``
            try:
                if w.fence is not None:
                    w.fence(None)
            except Exception as exc:
                failed[w.domain] = exc
                continue
            checked.append(replace(w, fence=None))
        with self._write(cas=True) as conn:
            for w in checked:
                try:
                    self._plan_rows(conn, w)
                except Exception as exc:
                    failed[w.domain] = exc
        return failed

    def _plan_rows(self, conn: Any, w: PlanWrite) -> None:
        """A plan's rows, checked (lease, action ids) before anything is touched."""
        plan = w.plan
        if w.fence is not None:
            w.fence(conn)
        self._new_actions(plan)
        self.save_instances([*w.refreshed, *plan.instances.values()], conn)
        self.save_sites(plan.sites.values(), conn)
        self._insert_actions(w.domain, plan, w.now)
        for p in plan.actions:
            if p.kind == "terminate":
                self.complete(target=p.instance_id, kinds=("launch", "add", "offline", "online"),
                              outcome="superseded by terminate", conn=conn)
        st = self._state(w.domain)
        st["iteration"] = w.iteration
        if w.memory is not None:
            st["memory"] = json.dumps(w.memory)

    def store_actions(self, domain: str, plan: Plan, now: float,
                      fence: Callable[[Any], None] | None = None) -> None:
        if fence is not None:
            fence(None)
        with self._write(cas=True) as conn:
            self._new_actions(plan)
            self.save_instances(plan.instances.values(), conn)
            self.save_sites(plan.sites.values(), conn)
            self._insert_actions(domain, plan, now)

    def mark_sent(self, action_ids: list[str], now: float) -> None:
        if not action_ids:
            return
        with self._write():
            for aid in action_ids:
                row = self.db.actions.get(aid)
                if row is not None:
                    row["sent_at"], row["attempts"] = now, row["attempts"] + 1

    def unsent_or_due(self, domains: list[str], now: float, resend_seconds: float) -> list[Message]:
        want = set(domains)
        due = now - resend_seconds
        out = [o for o in self.db.open.values()
               if o["domain"] in want and (o["sent_at"] is None or o["sent_at"] <= due)]
        out.sort(key=lambda o: (o["created_at"], o["action_id"]))
        return [self._msg(o) for o in out]

    def _msg(self, row: dict[str, Any]) -> Message:
        msg = self.db.messages.get(row["action_id"])
        if msg is None:
            msg = self.db.messages[row["action_id"]] = message_of(row)
        return msg

    def overdue(self, domain: str, sent_before: float) -> bool:
        first = self.first_unanswered(domain)
        return first is not None and first < sent_before

    def first_unanswered(self, domain: str) -> float | None:
        return min((o["created_at"] for o in self.db.open.values() if o["domain"] == domain
                    and o["kind"] in ("launch", "terminate") and o["attempts"] > 0), default=None)

    def in_flight(self, domain: str) -> set[tuple[str, str]]:
        return {(o["target"], o["kind"]) for o in self.db.open.values() if o["domain"] == domain}

    def open_sent_at(self, domain: str) -> list[float | None]:
        """When each open action of ``domain`` was last sent (None: never)."""
        return [o["sent_at"] for o in self.db.open.values() if o["domain"] == domain]

    def complete(self, *, action_id: str | None = None, target: str | None = None,
                 kinds: tuple[str, ...] = (), outcome: str, conn: Any = None) -> int:
        ids = self._to_complete(action_id, target, kinds)
        if not ids:
            return 0
        with self._write(conn):
            self._close(ids, outcome)
        return len(ids)

    def _to_complete(self, action_id: str | None, target: str | None, kinds: tuple[str, ...]) -> list[str]:
        """The open actions ``complete`` closes (a read: nothing is touched)."""
        open_ = self.db.open
        if action_id is not None:
            ids = [action_id] if action_id in open_ else []
        elif target is not None:
            mine = self.db.open_by_target.get(target)
            if not mine:
                return []  # most instance events: nothing open for the instance
            ids = sorted(mine)
        else:
            ids = list(open_)
        return [i for i in ids if (target is None or open_[i]["target"] == target)
                and (not kinds or open_[i]["kind"] in kinds)]

    def _close(self, ids: list[str], outcome: str) -> None:
        """Mark the open actions ``ids`` done, inside the caller's write transaction."""
        open_, messages, by_target = self.db.open, self.db.messages, self.db.open_by_target
        for i in ids:
            row = open_.pop(i)
            row["done"], row["outcome"] = True, outcome
            messages.pop(i, None)
            by = by_target.get(row["target"])
            if by is not None:
                by.pop(i, None)
                if not by:
                    del by_target[row["target"]]

    def record_instance_event(self, inst: Instance, kinds: tuple[str, ...], outcome: str) -> None:
        """As ``Store.record_instance_event``: the row and its answered actions in one write
        transaction — ``save_instances`` and ``complete`` nested in it, inlined (an event per
        instance state change: the nested transactions' bookkeeping was a third of its cost)."""
        self._begin(cas=True)
        self._put([inst])
        ids = self._to_complete(None, inst.instance_id, kinds)
        if ids:
            self._close(ids, outcome)
        self._commit()

    def record_node_result(self, action_id: str, outcome: str, inst: Instance | None) -> None:
        """As ``Store.record_node_result``: the action done and the instance row, one transaction
        (``complete`` and ``save_instances`` nested in it, inlined as in ``record_instance_event``:
        one per command result)."""
        self._begin(cas=True)
        ids = self._to_complete(action_id, None, ())
        if ids:
            self._close(ids, outcome)
        if inst is not None:
            self._put([inst])
        self._commit()

    # ------------------------------------------------------------------ job spans (epu cost)
    def _seen(self, sp: JobSpan) -> JobSpan:
        seen = self.db.job_seen.get(sp.domain, sp.start)
        return sp if sp.seen == seen else replace(sp, seen=max(seen, sp.start))

    def open_jobs(self, domain: str) -> dict[int, JobSpan]:
        spans = self.db.job_spans
        return {row: self._seen(spans[row]) for row in self.db.open_spans.get(domain, {})}

    def note_jobs(self, domain: str, at: float, opened: list[JobSpan], closed: list[tuple[int, float]]) -> list[int]:
        """As ``Store.note_jobs``: work in proportion to the change, not to the spans ever kept
        (``epu simulate`` runs a month of snapshots through it); the generation does not move."""
        db = self.db
        spans, still = db.job_spans, db.open_spans.setdefault(domain, {})
        for row, end in closed:
            if row in spans:
                spans[row] = replace(spans[row], end=end)
                still.pop(row, None)
        db.job_seen[domain] = at
        rows = []
        for sp in opened:
            row = len(spans) + 1
            spans[row] = sp
            still[row] = None
            rows.append(row)
        return rows

    def job_spans(self, since: float, until: float, domain: str | None = None) -> list[JobSpan]:
        rows = [(sp.start, row, sp) for row, sp in self.db.job_spans.items()
                if sp.start < until and (sp.end is None or sp.end > since) and (not domain or sp.domain == domain)]
        return [self._seen(sp) for _start, _row, sp in sorted(rows, key=lambda r: (r[0], r[1]))]

    def action(self, action_id: str) -> dict[str, Any] | None:
        row = self.db.actions.get(action_id)
        return dict(row) if row is not None else None

    def actions(self, domain: str | None = None, kind: str | None = None) -> list[dict[str, Any]]:
        rows = [dict(r) for r in self.db.actions.values()
                if (not domain or r["domain"] == domain) and (not kind or r["kind"] == kind)]
        return sorted(rows, key=lambda r: r["created_at"])


class MemoryLeases:
    """``lease.Leases``'s interface on a ``MemoryDecisionDatabase`` (see ``lease`` for the why)."""

    def __init__(self, db: MemoryDecisionDatabase, holder: str, ttl: float) -> None:
        self.db = db
        self.holder = holder
        self.ttl = ttl
        self.held: dict[str, Held] = {}
        self.lost: set[str] = set()
        self._rows: set[str] = set()
        """Domains whose row this handle made sure of (``Leases`` inserts it once per handle)."""

    def create(self) -> MemoryLeases:
        return self

    def _check_write(self) -> None:
        if self.db.before_write is not None:
            self.db.before_write()

    def hold(self, domain: str, now: float) -> bool:
        """Take or renew the lease of ``domain``; True if this engine holds it now."""
        if domain not in self._rows:
            self._check_write()
            self.db.leases.setdefault(domain, _Lease())
            self._rows.add(domain)
        row = self.db.leases[domain]
        mine = self.held.get(domain)
        if mine is not None:
            self._check_write()
            if row.holder == self.holder and row.epoch == mine.epoch:
                row.expires_at = now + self.ttl
                return self._won(domain, mine.epoch, now)
            self.lost.add(domain)
            self.held.pop(domain, None)
        if row.expires_at > now:
            self.held.pop(domain, None)
            return False
        self._check_write()
        row.holder, row.epoch, row.expires_at = self.holder, row.epoch + 1, now + self.ttl
        return self._won(domain, row.epoch, now)

    def renew_many(self, domains: list[str], now: float) -> set[str]:
        """As ``Leases.renew_many``: renew the leases of ``domains`` this engine holds (same
        holder and epoch); returns those renewed, the others are ``hold``'s."""
        ours: set[str] = set()
        for d in dict.fromkeys(domains):
            mine, row = self.held.get(d), self.db.leases.get(d)
            if mine is not None and row is not None and row.holder == self.holder and row.epoch == mine.epoch:
                self._check_write()
                row.expires_at = now + self.ttl
                self._won(d, mine.epoch, now)
                ours.add(d)
        return ours

    def _won(self, domain: str, epoch: int, now: float) -> bool:
        self.held[domain] = Held(epoch, now + self.ttl)
        self.lost.discard(domain)
        return True

    def fence(self, domain: str, now: float) -> Callable[[Any], None]:
        """As ``Leases.fence``: extend the lease if it is still ours, else raise ``Fenced``."""
        mine = self.held.get(domain)

        def check(_conn: Any) -> None:
            if mine is None:
                raise Fenced(f"no lease held on domain {domain!r}")
            row = self.db.leases.get(domain)
            if row is None or row.holder != self.holder or row.epoch != mine.epoch or row.expires_at < now:
                self.held.pop(domain, None)
                self.lost.add(domain)
                raise Fenced(f"lease of domain {domain!r} (epoch {mine.epoch}) taken by another engine")
            row.expires_at = mine.expires_at = now + self.ttl

        return check

    def release(self, domain: str | None = None) -> None:
        domains = [domain] if domain else list(self.held)
        try:
            if any(d in self.held for d in domains):
                self._check_write()
            for d in domains:
                h, row = self.held.get(d), self.db.leases.get(d)
                if h is not None and row is not None and row.holder == self.holder and row.epoch == h.epoch:
                    row.expires_at = 0.0
        except Exception:  # noqa: S110 - as Leases.release: the lease simply expires on its own
            pass
        for d in domains:
            self.held.pop(d, None)

    def state(self, domain: str, active: bool) -> str:
        if domain in self.lost:
            return "fenced"
        return "active" if active and domain in self.held else "standby"

    def row(self, domain: str) -> tuple[str, int, float] | None:
        """(holder, epoch, expires_at) of the shared lease of ``domain`` (None: never taken)."""
        r = self.db.leases.get(domain)
        return (r.holder, r.epoch, r.expires_at) if r is not None else None
