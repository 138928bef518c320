"""``epu status``: a live picture of each domain folded from the event stream. Pure fold + render.

The board only listens (snapshots, instance events, decision records), so it works from any
host with broker access and never touches a service's store.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from epu.common.messages import DecisionRecord, InstanceEvent, Message, SensorSnapshot


@dataclass
class DomainStatus:
    name: str
    snapshot_at: float | None = None
    available: bool = True
    queued_jobs: int = 0
    queued_cores: int = 0
    nodes: dict[str, int] = field(default_factory=dict)
    instances: dict[str, tuple[str, str, int]] = field(default_factory=dict)
    """instance id → (state, site, seq)"""
    last_decision: DecisionRecord | None = None

    def instances_by(self) -> dict[str, dict[str, int]]:
        """site → state → count, over instances not terminated."""
        out: dict[str, Counter[str]] = {}
        for state, site, _ in self.instances.values():
            out.setdefault(site, Counter())[state] += 1
        return {s: dict(c) for s, c in sorted(out.items())}

    def as_dict(self) -> dict[str, Any]:
        d = self.last_decision
        return {
            "domain": self.name, "snapshot_at": self.snapshot_at, "sensor_available": self.available,
            "queue": {"jobs": self.queued_jobs, "cores": self.queued_cores},
            "nodes_by_state": self.nodes,
            "instances_by_state": dict(Counter(s for s, _, _ in self.instances.values())),
            "instances_by_site": self.instances_by(),
            "instances_by_type": {} if d is None else d.saw.instances_by_type,
            "unsatisfiable": [] if d is None else [u.model_dump() for u in d.saw.unsatisfiable],
            "last_decision": None if d is None else {
                "at": d.at, "iteration": d.iteration, "policy": d.policy, "version": d.policy_version,
                "actions": [a.model_dump() for a in d.actions], "notes": d.notes},
        }


@dataclass
class Board:
    only: str | None = None
    domains: dict[str, DomainStatus] = field(default_factory=dict)

    def apply(self, msg: Message) -> bool:
        """Fold one event in; True when it changed the board."""
        domain = getattr(msg, "domain", None)
        if domain is None or (self.only and domain != self.only):
            return False
        st = self.domains.setdefault(domain, DomainStatus(domain))
        if isinstance(msg, SensorSnapshot):
            st.snapshot_at, st.available = msg.taken_at, msg.available
            if msg.available:
                q = msg.demand_shapes()
                st.queued_jobs = sum(j.count for j in q)
                st.queued_cores = sum(j.count * j.cores * j.nodes for j in q)
                st.nodes = dict(Counter(n.state for n in msg.nodes))
        elif isinstance(msg, InstanceEvent):
            prev = st.instances.get(msg.instance_id)
            if prev is not None and prev[2] >= msg.seq:
                return False
            if msg.state in ("terminated", "failed"):
                st.instances.pop(msg.instance_id, None)
            else:
                st.instances[msg.instance_id] = (msg.state, msg.site, msg.seq)
        elif isinstance(msg, DecisionRecord):
            st.last_decision = msg
        else:
            return False
        return True

    def as_json(self) -> list[dict[str, Any]]:
        return [self.domains[d].as_dict() for d in sorted(self.domains)]


def render(board: Board) -> Any:
    """A rich renderable: one panel per domain."""
    import time

    from rich.console import Group
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
        age = f"{time.time() - st.snapshot_at:.0f}s ago" if st.snapshot_at else "none yet"
        t.add_row("sensor", ("ok" if st.available else "[red]UNAVAILABLE[/]") + f", snapshot {age}")
        t.add_row("queue", f"{st.queued_jobs} jobs, {st.queued_cores} cores")
        t.add_row("nodes", ", ".join(f"{k}={v}" for k, v in sorted(st.nodes.items())) or "-")
        for site, states in st.instances_by().items():
            t.add_row(f"site {site}", ", ".join(f"{k}={v}" for k, v in sorted(states.items())))
        d = st.last_decision
        if d is not None and d.saw.instances_by_type:
            t.add_row("by type", ", ".join(f"{k or '(site default)'}={v}"
                                          for k, v in sorted(d.saw.instances_by_type.items())))
        if d is not None and d.saw.unsatisfiable:
            t.add_row("[red]unsatisfiable[/]", "; ".join(f"{u.count} x {u.shape} ({u.constraint})"
                                                       for u in d.saw.unsatisfiable[:5]))
        if d is not None:
            acts = Counter(a.kind for a in d.actions)
            t.add_row("last decision", f"#{d.iteration} {d.policy} v{d.policy_version} "
                      f"{time.strftime('%H:%M:%S', time.localtime(d.at))}: "
                      + ", ".join(f"{k}×{v}" for k, v in acts.items()))
            for note in d.notes[:3]:
                t.add_row("", f"[dim]{note}[/]")
        panels.append(Panel(t, title=f"domain {name}"))
    return Group(*panels)
