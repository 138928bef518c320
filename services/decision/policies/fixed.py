"""fixed — keep exactly ``nodes`` instances (clamped to [min_nodes, max_nodes]).

Launch the shortfall; on excess drain idle nodes first, then the youngest busy ones (a
drain lets their jobs finish: nothing running is killed)."""

from __future__ import annotations

from pydantic import Field

from services.decision import lifecycle as lc
from services.decision.actions import Action, Decision
from services.decision.policies.base import Params, Policy
from services.decision.view import DomainView


class FixedParams(Params):
    nodes: int = Field(1, ge=0)


def decide(view: DomainView, params: FixedParams, now: float) -> Decision:  # type: ignore[override]
    actions: list[Action] = []
    gone = lc.stalled(view, params.stall_seconds)
    actions += lc.give_up(view, gone, params.stall_seconds)
    target = min(max(params.nodes, view.min_nodes), view.max_nodes)
    active = len(view.active) - len(gone)
    notes = [f"target {target} (nodes={params.nodes} within [{view.min_nodes}, {view.max_nodes}]), active {active}"]
    back, need = lc.reclaim(view, target - active)
    launches, more = lc.bounded_launches(view, need, view.cores_per_node, f"fixed size {target}",
                                         active + len(back))
    actions += back + launches + lc.add_started(view)
    if active > target:
        idle = view.idle(0)
        idle_ids = {i.instance_id for i in idle}
        busy = sorted((i for i in view.joined if i.instance_id not in idle_ids), key=lambda i: -i.launched_at)
        actions += lc.scale_down(view, idle + busy, active - target, f"above fixed size {target}", active)
    actions += lc.finish_drains(view)
    return Decision(actions, None, notes + more)


POLICY = Policy("fixed", FixedParams, decide, "EPU (static allocation baseline)")  # type: ignore[arg-type]
