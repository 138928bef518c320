"""The engine's ``EngineStatus`` per domain: its whole view, published for ``epu status``.

Why: an operator's window built from events alone shows only what changes while it listens
(three running instances showed as one). The engine knows the whole state; after each
iteration it publishes it for every domain it acts for, into a latest-value queue that
``epu status`` and ``epu instances list`` read at once (``common.retained``). Only the active
engine of a domain publishes (a standby's view is not the one acted on).

Volume: a status is published when it differs from the last one published (ignoring its time),
and at least every ``heartbeat`` seconds so its age says the engine is alive — not every
iteration: a domain with a thousand instances would otherwise send its table every 5 s.
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

from epu.common.codec import packb
from epu.common.columns import decode_columns, replace_fields
from epu.common.messages import DecisionRecord, EngineStatus, InstanceStatus, Message
from epu.services.decision.budget import price_table, site_prices, spend_rate
from epu.services.decision.status import queue_of
from epu.services.decision.view import NodeIndex

log = logging.getLogger("epu.decision")

#: Seconds after which an unchanged status is published again.
HEARTBEAT_SECONDS = 30.0


def build_status(engine: Any, domain: str, now: float, last: DecisionRecord | None) -> EngineStatus | None:
    """The engine's view of ``domain`` as one message (None: the domain has no configuration yet)."""
    parts = status_parts(engine, domain, now, last)
    return parts.build() if parts is not None else None


#: InstanceStatus fields, in the order ``status_parts`` writes its columns.
INSTANCE_FIELDS = tuple(InstanceStatus.model_fields)


class StatusParts:
    """A status before it is a message: the domain's fields and the instances as columns (one
    list per ``InstanceStatus`` field). Why: with 10,000 instances the message is ~10k models —
    megabytes built and dropped every iteration — while it is published only when it changed or
    is due; ``digest`` tells from the columns, and ``build`` makes the message only then."""

    def __init__(self, head: EngineStatus, columns: dict[str, Any]) -> None:
        self.head = head  # every field but ``instances`` (an empty list here)
        self.columns = columns

    def digest(self) -> bytes:
        """What tells two statuses apart, but ``at``: a hash of the domain's fields (as JSON,
        serialised by pydantic in one call) and of the instance columns (msgpack, in C)."""
        h = hashlib.blake2b(self.head.model_dump_json(exclude={"at", "instances"}).encode(), digest_size=16)
        h.update(packb(self.columns))
        return h.digest()

    def build(self) -> EngineStatus:
        """The message: the instances validated column-wise (each field's type and constraints,
        strict, as ``InstanceStatus`` would), then set on a copy of the head."""
        instances = decode_columns(self.columns, InstanceStatus, "instances")
        return replace_fields(self.head, instances=instances)


def status_parts(engine: Any, domain: str, now: float, last: DecisionRecord | None) -> StatusParts | None:
    """``build_status`` up to the instances' models (see ``StatusParts``)."""
    current = engine.store.current_config(domain)
    if current is None:
        return None
    version, cfg = current
    snap = engine.latest_snapshot(domain)
    nodes = NodeIndex(snap.nodes if snap is not None and snap.available else [])
    insts = list(engine.store.instances(domain))
    node_states = []
    for inst in insts:
        node = nodes.find(inst)
        node_states.append(node.state if node is not None else "")
    columns: dict[str, Any] = {
        "n": len(insts),
        "instance_id": [i.instance_id for i in insts], "site": [i.site for i in insts],
        "state": [i.state for i in insts], "seq": [max(0, i.seq) for i in insts],
        "node_name": [i.node_name for i in insts], "ip": [i.ip for i in insts],
        "in_batch": [i.joined_at is not None and not i.removed for i in insts],
        "node_state": node_states, "retire": [i.retire for i in insts],
        "since": [float(i.state_at) for i in insts], "launched_at": [float(i.launched_at) for i in insts]}
    jobs, cores = queue_of(snap) if snap is not None and snap.available else (0, 0)
    head = EngineStatus(
        domain=domain, at=float(now), policy=cfg.policy, policy_version=version, paused=cfg.paused,
        min_nodes=cfg.min_nodes, max_nodes=cfg.max_nodes, breaker=engine.breakers().get(domain, ""),
        budget_held=engine.budget_held.get(domain, ""), mode=cfg.mode,
        spend_per_hour=round(spend_rate(((i.site, i.instance_type, i.state) for i in insts), price_table(
            site_prices(engine.config.sites), engine.types)), 6),
        snapshot_at=float(snap.taken_at) if snap is not None else None,
        sensor_skew_seconds=_skew(engine, domain),
        sensor_available=snap.available if snap is not None else True, queued_jobs=jobs, queued_cores=cores,
        nodes_by_state=dict(Counter(n.state for n in snap.nodes)) if snap is not None and snap.available else {},
        instances=[], last_decision=last, config=cfg.model_dump(mode="json"),
        changes=engine.store.change_history(domain))
    return StatusParts(head, columns)


class StatusFeed:
    """Publishes each active domain's status after an iteration, when it changed or is due."""

    def __init__(self, engine: Any, publish: Callable[[Message], Any], heartbeat: float = HEARTBEAT_SECONDS) -> None:
        self.engine = engine
        self.publish = publish
        self.heartbeat = heartbeat
        self.last_decision: dict[str, DecisionRecord] = {}
        # (when, digest of the body): a digest, not the body itself, which for a 10,000-node
        # domain is megabytes of dicts and strings held between iterations (issue 15 item 4)
        self._sent: dict[str, tuple[float, bytes]] = {}

    def after_iteration(self, records: list[DecisionRecord], now: float) -> list[EngineStatus]:
        """Remember the iteration's records, publish what is due; returns what was published.
        A failure is logged, never raised: the status is for people, the iteration is not."""
        for r in records:
            self.last_decision[r.domain] = r
        out = []
        for domain in self.engine.domains:
            if self.engine.leadership(domain) != "active":
                self._sent.pop(domain, None)  # publish at once when active again
                continue
            try:
                parts = status_parts(self.engine, domain, now, self.last_decision.get(domain))
                if parts is None:
                    continue
                body = parts.digest()
                prev = self._sent.get(domain)
                if prev is not None and prev[1] == body and now - prev[0] < self.heartbeat:
                    continue
                status = parts.build()
                self.publish(status)
            except Exception as exc:
                log.warning("status not published", extra={"domain": domain, "error": f"{type(exc).__name__}: {exc}"})
                continue
            self._sent[domain] = (now, body)
            out.append(status)
        return out


def _skew(engine: Any, domain: str) -> float | None:
    """The sensor clock's measured offset (``snaporder.ClockSkew``), rounded for reading."""
    skew = getattr(engine, "skew", None)
    value = skew.skew(domain) if skew is not None else None
    return round(value, 3) if value is not None else None
