"""Which jobs ran on which of the domain's instances, and when: the engine's durable record of it,
kept for cost accounting (``epu cost``).

Why the engine keeps it: who paid for a node-second is known only while it happens (which jobs
ran on the node then), and the engine is the one process that sees every snapshot of its domain
and knows which node is which instance. A tap that must be running to see anything (the ledger of
``epu cost record`` before issue 34) lost what happened before it started, and billed the
instances that ended while it was stopped for ever. So each snapshot the engine admits moves the
domain's *job spans* forward in its store (``DecisionStore.note_jobs``): a job listed on one of
the domain's instances opens a span at the snapshot's time; each later snapshot that lists it
again moves its ``seen`` time; the first one that does not list it closes it. The span counts from
the snapshot that first listed the job until the one that first did not (the resolution is the
sensor's ``poll_seconds``), except across a gap in the engine's view longer than ``gap`` seconds
(an engine down, a sensor silent): a job gone by then is closed where it was last seen, and the
unseen time goes to ``(idle)`` — it is billed either way, from the instance records, never twice
and never lost.

The spans are a record, not an input to any decision: nothing here acts, and a failed write is
logged and tried again at the next snapshot (the in-memory picture moves only once the store has
the change). The instance records (the provisioner's ``lives``) say what was paid; the spans say
only whose it was."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("epu.decision")

Owner = tuple[str, str, str]
"""(account, user, partition) of a job ("" where the batch system does not say)."""
SpanKey = tuple[str, str]
"""(instance id, job id)."""
NO_OWNER: Owner = ("", "", "")


@dataclass(frozen=True)
class JobSpan:
    """A job on an instance's node from ``start`` to ``end`` (None: still listed at ``seen``)."""

    domain: str
    instance_id: str
    job_id: str
    start: float
    seen: float
    end: float | None = None
    account: str = ""
    user: str = ""
    partition: str = ""

    def until(self, horizon: float, now: float) -> float:
        """Where the span ends for accounting at ``now``: its end, or — still open — ``now`` but
        no later than ``horizon`` seconds after it was last seen (an engine that stopped does not
        make a job run for ever)."""
        if self.end is not None:
            return self.end
        return min(now, self.seen + horizon)


@dataclass
class SpanChange:
    """What one snapshot does to a domain's spans."""

    opened: list[JobSpan] = field(default_factory=list)
    closed: list[tuple[int, float]] = field(default_factory=list)
    """(row, end) of each span the snapshot no longer lists."""

    def __bool__(self) -> bool:
        return bool(self.opened or self.closed)


def listed_jobs(snapshot: Any, by_id: dict[str, str], by_name: dict[str, str]) -> dict[SpanKey, Owner]:
    """(instance id, job id) → owner for every job the snapshot lists on a node of one of the
    domain's instances (``by_id``: their ids; ``by_name``: node name → id): matched by the
    instance id a backend reports on the node, else by node name. A node that is not one of the
    domain's instances (a static node of the cluster) is not the cloud's to bill."""
    owners = snapshot.owners
    out: dict[SpanKey, Owner] = {}
    for node in snapshot.nodes:
        jobs = node.jobs
        if not jobs:
            continue
        iid = by_id.get(node.instance_id or "") or by_name.get(node.name)
        if iid is None:
            continue
        if not owners:
            out.update(dict.fromkeys([(iid, job) for job in jobs], NO_OWNER))
            continue
        for job in jobs:
            o = owners.get(job)
            out[(iid, job)] = (str(o[0]), str(o[1]), str(o[2])) if o is not None and len(o) >= 3 else NO_OWNER
    return out


def span_change(domain: str, open_rows: dict[SpanKey, int], seen: float, listed: dict[SpanKey, Owner], at: float,
                gap: float) -> SpanChange:
    """The spans a snapshot taken ``at`` opens and closes, the open ones (``open_rows``) last seen
    at ``seen`` (the module's rule). Pure."""
    out = SpanChange()
    end = at if at - seen <= gap else seen
    out.closed = [(open_rows[key], end) for key in open_rows.keys() - listed.keys()]
    out.opened = [JobSpan(domain, key[0], key[1], at, at, None, *listed[key]) for key in listed.keys() - open_rows.keys()]
    out.closed.sort()
    out.opened.sort(key=lambda sp: (sp.instance_id, sp.job_id))
    return out


class JobSpans:
    """Moves each domain's job spans forward in the store as snapshots arrive (``observe``)."""

    def __init__(self, store: Any, gap: float) -> None:
        self.store = store
        self.gap = gap
        self._open: dict[str, dict[SpanKey, int]] = {}
        """Domain → its open spans' rows as the store has them (loaded at the domain's first snapshot)."""
        self._seen: dict[str, float] = {}
        """Domain → when its last snapshot was applied (when its open spans were last seen)."""
        self._instances: dict[str, tuple[Any, dict[str, str], dict[str, str]]] = {}
        """Domain → (the store's stamp of its instances, ids, node name → id): rebuilt when they change."""

    def _maps(self, domain: str) -> tuple[dict[str, str], dict[str, str]]:
        stamp = self.store.domain_stamp(domain)
        got = self._instances.get(domain)
        if got is None or got[0] != stamp:
            insts = self.store.instances(domain)
            got = self._instances[domain] = (stamp, {i.instance_id: i.instance_id for i in insts},
                                             {i.node_name: i.instance_id for i in insts if i.node_name})
        return got[1], got[2]

    def _load(self, domain: str, strays: list[tuple[int, float]]) -> dict[SpanKey, int]:
        rows: dict[SpanKey, int] = {}
        seen = float("-inf")
        for row, sp in sorted(self.store.open_jobs(domain).items()):
            key = (sp.instance_id, sp.job_id)
            seen = max(seen, sp.seen)
            if key in rows:  # opened twice (two engines at a handover): one span is the job's
                strays.append((row, sp.start))
            else:
                rows[key] = row
        self._seen[domain] = seen
        self._open[domain] = rows
        return rows

    def observe(self, domain: str, snapshot: Any, at: float) -> None:
        """Apply a snapshot of ``domain`` taken ``at`` (the engine's clock) that the engine kept
        as the newest; one that cannot read the batch system says nothing about jobs."""
        if not snapshot.available or at <= self._seen.get(domain, float("-inf")):
            return
        try:
            strays: list[tuple[int, float]] = []
            rows = self._open.get(domain)
            if rows is None:
                rows = self._load(domain, strays)
            listed = listed_jobs(snapshot, *self._maps(domain))
            change = span_change(domain, rows, self._seen.get(domain, at), listed, at, self.gap)
            change.closed += strays
            new_rows = self.store.note_jobs(domain, at, change.opened, change.closed)
        except Exception as exc:  # accounting only: the next snapshot tries again from the store
            self._open.pop(domain, None)
            self._seen.pop(domain, None)
            log.warning("job spans not recorded", extra={"domain": domain, "error": f"{type(exc).__name__}: {exc}"})
            return
        for key in rows.keys() - listed.keys():
            del rows[key]
        for sp, row in zip(change.opened, new_rows, strict=True):
            rows[(sp.instance_id, sp.job_id)] = row
        self._seen[domain] = at

    def forget(self) -> None:
        """Another engine may write the spans now (the broker connection dropped): read them
        from the store again at the next snapshot."""
        self._open.clear()
        self._seen.clear()
        self._instances.clear()
