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

from epu.common.messages import DecisionRecord, EngineStatus, InstanceStatus, Message
from epu.services.decision.status import queue_of
from epu.services.decision.view import NodeIndex

log = logging.getLogger("epu.decision")

#: Seconds after which an unchanged status is published again.
HEARTBEAT_SECONDS = 30.0


def build_status(engine: Any, domain: str, now: float, last: DecisionRecord | None) -> EngineStatus | None:
    """The engine's view of ``domain`` as one message (None: the domain has no configuration yet)."""
    current = engine.store.current_config(domain)
    if current is None:
        return None
    version, cfg = current
    snap = engine.latest_snapshot(domain)
    nodes = NodeIndex(snap.nodes if snap is not None and snap.available else [])
    entries = []
    for inst in engine.store.instances(domain):
        node = nodes.find(inst)
        entries.append(InstanceStatus(
            instance_id=inst.instance_id, site=inst.site, state=inst.state, seq=max(0, inst.seq),
            node_name=inst.node_name, ip=inst.ip, in_batch=inst.joined_at is not None and not inst.removed,
            node_state=node.state if node is not None else "", retire=inst.retire, since=float(inst.state_at)))
    jobs, cores = queue_of(snap) if snap is not None and snap.available else (0, 0)
    return EngineStatus(
        domain=domain, at=float(now), policy=cfg.policy, policy_version=version, paused=cfg.paused,
        min_nodes=cfg.min_nodes, max_nodes=cfg.max_nodes, breaker=engine.breakers().get(domain, ""),
        snapshot_at=float(snap.taken_at) if snap is not None else None,
        sensor_available=snap.available if snap is not None else True, queued_jobs=jobs, queued_cores=cores,
        nodes_by_state=dict(Counter(n.state for n in snap.nodes)) if snap is not None and snap.available else {},
        instances=entries, last_decision=last, config=cfg.model_dump(mode="json"))


def body_digest(status: EngineStatus) -> bytes:
    """What tells two statuses apart, but ``at``: a hash of its JSON, serialised by pydantic in
    one call without building the dict tree ``model_dump`` would."""
    return hashlib.blake2b(status.model_dump_json(exclude={"at"}).encode(), digest_size=16).digest()


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
                status = build_status(self.engine, domain, now, self.last_decision.get(domain))
                if status is None:
                    continue
                body = body_digest(status)
                prev = self._sent.get(domain)
                if prev is not None and prev[1] == body and now - prev[0] < self.heartbeat:
                    continue
                self.publish(status)
            except Exception as exc:
                log.warning("status not published", extra={"domain": domain, "error": f"{type(exc).__name__}: {exc}"})
                continue
            self._sent[domain] = (now, body)
            out.append(status)
        return out
