"""Building blocks every policy shares: the instance life cycle around the policy's choice. Pure.

* ``add_started`` — a running instance is told to the batch system (NodeCommand add);
* ``stalled`` — an instance not joined within the stall timeout is given up (and replaced,
  because it stops counting as pending);
* ``reclaim`` — a draining node that demand needs again is put back online;
* ``scale_down`` — offline (drain) idle nodes, never below ``min_nodes``;
* ``finish_drains`` — a drained node with no job is removed from the batch system, then
  terminated (offline → no jobs → remove → terminate).
"""

from __future__ import annotations

from services.decision.actions import Action, Launch, Node, Terminate
from services.decision.view import DomainView, Instance


def add_started(view: DomainView) -> list[Action]:
    return [Node("add", i.instance_id, "instance running, add it to the batch system")
            for i in view.pending if i.state == "started" and i.add_sent_at is None]


def stalled(view: DomainView, stall_seconds: float) -> list[Instance]:
    """Instances making no progress for ``stall_seconds``: pending ones that never joined, and
    joined ones whose node has been missing from the batch system (or ``down``) that long."""
    now = view.now
    out = [i for i in view.pending if now - i.launched_at >= stall_seconds]
    if view.available:
        out += [i for i in view.joined if i.missing_since is not None and now - i.missing_since >= stall_seconds]
    return out


def give_up(view: DomainView, insts: list[Instance], stall_seconds: float) -> list[Action]:
    out: list[Action] = []
    for i in insts:
        if i.state == "joined":
            assert i.missing_since is not None
            why = f"lost: node missing or down for {int(view.now - i.missing_since)}s (limit {int(stall_seconds)}s)"
            if view.node_of(i) is not None:
                out.append(Node("remove", i.instance_id, why))
            out.append(Terminate(i.instance_id, why))
            continue
        why = f"stalled: not joined {int(view.now - i.launched_at)}s after launch (limit {int(stall_seconds)}s)"
        if i.add_sent_at is not None:
            out.append(Node("remove", i.instance_id, why))
        out.append(Terminate(i.instance_id, why, stalled=True))
    return out


def reclaim(view: DomainView, need: int) -> tuple[list[Action], int]:
    """Online up to ``need`` draining nodes still in the batch system (never above ``max_nodes``:
    a node drained because an operator lowered the bound stays drained); return the rest."""
    out: list[Action] = []
    room = view.max_nodes - len(view.active)
    rest = max(0, need - room)
    need = min(need, room)
    for inst in view.draining:
        if need <= 0:
            break
        if not inst.removed and view.node_of(inst) is not None:
            out.append(Node("online", inst.instance_id, "draining node needed again"))
            need -= 1
    return out, need + rest


def bounded_launches(view: DomainView, wanted: int, cores: int, reason: str,
                     active_after: int | None = None) -> tuple[list[Action], list[str]]:
    """``wanted`` launches clamped so the domain stays within [min_nodes, max_nodes]."""
    active = len(view.active) if active_after is None else active_after
    n = max(wanted, view.min_nodes - active)
    notes = []
    if n > wanted:
        notes.append(f"min_nodes={view.min_nodes}: launching {n - wanted} more to reach the floor")
        reason = reason if wanted else f"below min_nodes={view.min_nodes}"
    room = max(0, view.max_nodes - active)
    if n > room:
        notes.append(f"max_nodes={view.max_nodes}: {n} wanted, {room} allowed")
        n = room
    return [Launch(cores, reason) for _ in range(n)], notes


def scale_down(view: DomainView, candidates: list[Instance], count: int, reason: str,
               active_after: int | None = None) -> list[Action]:
    """Offline up to ``count`` of ``candidates`` (in order), keeping at least ``min_nodes``."""
    active = len(view.active) if active_after is None else active_after
    allowed = max(0, min(count, active - view.min_nodes))
    return [Node("offline", i.instance_id, reason) for i in candidates[:allowed]]


def finish_drains(view: DomainView) -> list[Action]:
    """Move offlined nodes on: no job left → remove from the batch system → terminate."""
    out: list[Action] = []
    for inst in view.draining:
        node = view.node_of(inst)
        if inst.removed or (node is None and inst.add_sent_at is None):
            out.append(Terminate(inst.instance_id, "drained and removed from the batch system"))
        elif node is not None and not node.jobs and node.cores_used == 0:
            out.append(Node("remove", inst.instance_id, "drained: no job left"))
    return out


def ceil_div(a: int, b: int) -> int:
    return -(-a // b) if b > 0 else 0


__all__ = ["add_started", "bounded_launches", "ceil_div", "finish_drains", "give_up", "reclaim",
           "scale_down", "stalled"]
