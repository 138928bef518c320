"""``epu status``: the whole current picture of each domain, kept live. Pure fold + render.

Two sources, folded into one board. The engine's ``EngineStatus`` (its whole view of a domain:
every live instance, the queue, nodes by state, policy, breaker, last decision) is retained in a
latest-value queue, so the board starts complete; after that, events (snapshots, instance
events, decision records, and every new status) keep it live. Each piece is applied only if it
is newer than what the board holds: instances by their ``seq``, snapshots by when they were
taken, decisions and statuses by ``at``. The board works from any host with read access to the
broker and never touches a service's store.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from epu.common.messages import (
    DecisionRecord,
    EngineStatus,
    InstanceEvent,
    InstanceStatus,
    Message,
    SensorSnapshot,
)
from epu.services.decision.snaporder import SnapshotOrder

#: Seconds an instance event is given to reach the engine before a status not listing it counts.
UNLISTED_GRACE = 5.0


def queue_of(snap: SensorSnapshot) -> tuple[int, int]:
    """(jobs, cores) of the queued demand of a snapshot: what the board and the engine's status call queued."""
    q = snap.demand_shapes()
    return sum(j.count for j in q), sum(j.count * j.cores * j.nodes for j in q)


#: A sensor clock skew at least this large (seconds) is shown by ``epu status``.
SKEW_SHOWN = 2.0


@dataclass
class DomainStatus:
    name: str
    snapshot_at: float | None = None
    available: bool = True
    queued_jobs: int = 0
    queued_cores: int = 0
    nodes: dict[str, int] = field(default_factory=dict)
    instances: dict[str, InstanceStatus] = field(default_factory=dict)
    """Live instances by id (terminated and failed ones drop out)."""
    gone: dict[str, int] = field(default_factory=dict)
    """Ended instances → the seq that ended them (an older status must not bring them back)."""
    last_decision: DecisionRecord | None = None
    engine: EngineStatus | None = None
    order: SnapshotOrder = field(default_factory=SnapshotOrder, repr=False)
    """The newest status the engine published (policy, bounds, breaker); None: none seen."""

    def instances_by(self) -> dict[str, dict[str, int]]:
        """site → state → count, over instances not terminated."""
        out: dict[str, Counter[str]] = {}
        for i in self.instances.values():
            out.setdefault(i.site, Counter())[i.state] += 1
        return {s: dict(c) for s, c in sorted(out.items())}

    def apply_instance(self, entry: InstanceStatus, ended: bool, same_seq: bool = False) -> bool:
        """Events move an instance only with a higher seq; the engine's status also with the same
        seq (``same_seq``): joining the batch system moves no provisioner seq."""
        prev = self.instances.get(entry.instance_id)
        if prev is not None and (prev.seq > entry.seq or (prev.seq == entry.seq and not same_seq)):
            return False
        if self.gone.get(entry.instance_id, -1) >= entry.seq:
            return False
        if ended:
            self.instances.pop(entry.instance_id, None)
            self.gone[entry.instance_id] = entry.seq
        else:
            self.instances[entry.instance_id] = entry
        return True

    def apply_snapshot(self, snap: SensorSnapshot) -> bool:
        if snap.incarnation:  # by the sensor's count, as the engine orders them (snaporder.py)
            if not self.order.admit(snap):
                return False
        elif self.snapshot_at is not None and snap.taken_at < self.snapshot_at:
            return False
        self.snapshot_at, self.available = snap.taken_at, snap.available
        if snap.available:
            self.queued_jobs, self.queued_cores = queue_of(snap)
            self.nodes = dict(Counter(n.state for n in snap.nodes))
        return True

    def apply_status(self, st: EngineStatus) -> bool:
        """The engine's whole view: instances it lists replace older entries; entries it does not
        list are gone unless an event newer than the status put them here."""
        if self.engine is not None and st.at <= self.engine.at:
            return False
        self.engine = st
        listed = {i.instance_id for i in st.instances}
        # an instance the engine does not list has ended — unless its event may not have reached the
        # engine yet when the status was built (a launch just announced): that one stays
        for iid in [i for i, e in self.instances.items() if i not in listed and e.since <= st.at - UNLISTED_GRACE]:
            del self.instances[iid]
        for entry in st.instances:
            self.apply_instance(entry, ended=False, same_seq=True)
        if st.snapshot_at is not None and (self.snapshot_at is None or st.snapshot_at >= self.snapshot_at):
            self.snapshot_at, self.available = st.snapshot_at, st.sensor_available
            if st.sensor_available:
                self.queued_jobs, self.queued_cores, self.nodes = st.queued_jobs, st.queued_cores, dict(st.nodes_by_state)
        if st.last_decision is not None:
            self.apply_decision(st.last_decision)
        return True

    def apply_decision(self, d: DecisionRecord) -> bool:
        if self.last_decision is not None and d.at < self.last_decision.at:
            return False
        self.last_decision = d
        return True

    def as_dict(self) -> dict[str, Any]:
        d, e = self.last_decision, self.engine
        return {
            "domain": self.name, "snapshot_at": self.snapshot_at, "sensor_available": self.available,
            "queue": {"jobs": self.queued_jobs, "cores": self.queued_cores},
            "nodes_by_state": self.nodes,
            "instances_by_state": dict(Counter(i.state for i in self.instances.values())),
            "instances_by_site": self.instances_by(),
            "instances": [i.model_dump(mode="json") for i in sorted(self.instances.values(),
                                                                    key=lambda i: (i.site, i.instance_id))],
            "engine": None if e is None else {
                "status_at": e.at, "policy": e.policy, "version": e.policy_version, "paused": e.paused,
                "min_nodes": e.min_nodes, "max_nodes": e.max_nodes, "breaker": e.breaker,
                "budget_held": e.budget_held, "mode": e.mode, "spend_per_hour": e.spend_per_hour,
                "budget_per_hour": e.config.get("budget_per_hour"),
                "sensor_skew_seconds": e.sensor_skew_seconds},
            "instances_by_type": {} if d is None else d.saw.instances_by_type,
            "unsatisfiable": [] if d is None else [u.model_dump() for u in d.saw.unsatisfiable],
            "last_decision": None if d is None else {
                "at": d.at, "iteration": d.iteration, "policy": d.policy, "version": d.policy_version,
                "actions": [a.model_dump() for a in d.actions], "notes": d.notes, "shadow": d.shadow},
        }


def _from_event(evt: InstanceEvent, prev: InstanceStatus | None) -> InstanceStatus:
    joined = evt.state == "joined" or (prev is not None and prev.in_batch and evt.state == "draining")
    return InstanceStatus(instance_id=evt.instance_id, site=evt.site, state=evt.state, seq=evt.seq,
                          node_name=evt.node_name or (prev.node_name if prev else ""),
                          ip=evt.ip or (prev.ip if prev else None), in_batch=joined,
                          node_state=prev.node_state if prev else "", retire=prev.retire if prev else "",
                          since=float(evt.at))


@dataclass
class Board:
    only: str | None = None
    domains: dict[str, DomainStatus] = field(default_factory=dict)

    def apply(self, msg: Message) -> bool:
        """Fold one message in; True when it changed the board."""
        domain = getattr(msg, "domain", None)
        if domain is None or (self.only and domain != self.only):
            return False
        if not isinstance(msg, SensorSnapshot | InstanceEvent | DecisionRecord | EngineStatus):
            return False
        st = self.domains.setdefault(domain, DomainStatus(domain))
        if isinstance(msg, SensorSnapshot):
            return st.apply_snapshot(msg)
        if isinstance(msg, InstanceEvent):
            entry = _from_event(msg, st.instances.get(msg.instance_id))
            return st.apply_instance(entry, ended=msg.state in ("terminated", "failed"))
        if isinstance(msg, DecisionRecord):
            return st.apply_decision(msg)
        return st.apply_status(msg)

    def as_json(self) -> list[dict[str, Any]]:
        return [self.domains[d].as_dict() for d in sorted(self.domains)]


#: Instances listed one per line on the board (all of them are in --json).
MAX_ROWS = 20


def render(board: Board) -> Any:
    """A rich renderable: one panel per domain."""
    import time

    from rich.console import Group
    from rich.markup import escape
    from rich.panel import Panel
    from rich.table import Table

    panels = []
    if not board.domains:
        return Panel("waiting for events (snapshots, instance events, decision records)...", title="epu status")
    for name in sorted(board.domains):
        st = board.domains[name]
        t = Table.grid(padding=(0, 2))
        t.add_column(style="bold")
        t.add_column()
        skew = st.engine.sensor_skew_seconds if st.engine is not None else None
        taken = st.snapshot_at - (skew or 0.0) if st.snapshot_at else None  # in the engine's clock
        age = f"{time.time() - taken:.0f}s ago" if taken else "none yet"
        t.add_row("sensor", ("ok" if st.available else "[red]UNAVAILABLE[/]") + f", snapshot {age}"
                  + (f", [yellow]clock {skew:+.0f}s off the engine's[/]" if skew is not None and abs(skew) >= SKEW_SHOWN
                     else ""))
        t.add_row("queue", f"{st.queued_jobs} jobs, {st.queued_cores} cores")
        t.add_row("nodes", ", ".join(f"{k}={v}" for k, v in sorted(st.nodes.items())) or "-")
        for site, states in st.instances_by().items():
            t.add_row(f"site {site}", ", ".join(f"{k}={v}" for k, v in sorted(states.items())))
        e = st.engine
        if e is not None:
            t.add_row("engine", f"{escape(e.policy)} v{e.policy_version}, nodes {e.min_nodes}..{e.max_nodes}"
                      + (", [yellow]PAUSED[/]" if e.paused else "")
                      + (f", [red]breaker open: {escape(e.breaker)}[/]" if e.breaker else "")
                      + (", [yellow]OBSERVE (shadow: decides, does nothing)[/]" if e.mode == "observe" else "")
                      + f", status {time.time() - e.at:.0f}s ago")
            cap = e.config.get("budget_per_hour")
            if cap or e.budget_held or e.spend_per_hour:
                t.add_row("spend", f"{e.spend_per_hour:.2f}/h" + (f" of budget {cap}/h" if cap else "")
                          + (f", [red]launches held: {escape(e.budget_held)}[/]" if e.budget_held else ""))
        for i in sorted(st.instances.values(), key=lambda i: (i.site, i.instance_id))[:MAX_ROWS]:
            batch = f"in batch ({i.node_state or 'not listed'})" if i.in_batch else "not in batch"
            t.add_row("", "[dim]" + escape(f"{i.instance_id[:12]} {i.site} {i.state} {i.node_name} {batch}"
                                            + (f" retiring: {i.retire}" if i.retire else "")) + "[/]")
        if len(st.instances) > MAX_ROWS:
            t.add_row("", f"[dim]... {len(st.instances) - MAX_ROWS} more (--json lists them all)[/]")
        d = st.last_decision
        if d is not None and d.saw.instances_by_type:
            t.add_row("by type", ", ".join(f"{k or '(site default)'}={v}"
                                          for k, v in sorted(d.saw.instances_by_type.items())))
        if d is not None and d.saw.unsatisfiable:
            t.add_row("[red]unsatisfiable[/]", "; ".join(f"{u.count} x {u.shape} ({u.constraint})"
                                                       for u in d.saw.unsatisfiable[:5]))
        if d is not None:
            acts = Counter(a.kind for a in d.actions)
            t.add_row("last decision" + (" (shadow)" if d.shadow else ""),
                      f"#{d.iteration} {d.policy} v{d.policy_version} "
                      f"{time.strftime('%H:%M:%S', time.localtime(d.at))}: "
                      + ", ".join(f"{k}×{v}" for k, v in acts.items()))
            for note in d.notes[:3]:
                t.add_row("", f"[dim]{note}[/]")
        panels.append(Panel(t, title=f"domain {name}"))
    return Group(*panels)
