"""fixed — keep exactly ``nodes`` instances (clamped to [min_nodes, max_nodes]).

Launch the shortfall; on excess drain idle nodes first, then the youngest busy ones (a
drain lets their jobs finish: nothing running is killed)."""

from __future__ import annotations

from epu.services.decision import lifecycle as lc
from epu.services.decision import shaped
from epu.services.decision.actions import Decision
from epu.services.decision.policies.base import Params, Policy
from epu.services.decision.view import DomainView
from pydantic import Field


class FixedParams(Params):
    nodes: int = Field(1, ge=0)


def decide(view: DomainView, params: FixedParams, now: float) -> Decision:  # type: ignore[override]
    cycle = lc.Cycle(view, params.stall_seconds, params.gang_deadline)
    target = min(max(params.nodes, view.min_nodes), view.max_nodes)
    active = cycle.active
    notes = [f"target {target} (nodes={params.nodes} within [{view.min_nodes}, {view.max_nodes}]), active {active}"]
    filler = None
    if view.catalogue is not None:  # the cheapest type that fits the pending jobs
        filler = shaped.of_cycle(cycle).filler
    cycle.launch(target - active, f"fixed size {target}", filler=filler)
    if active > target:
        idle = view.idle(0)
        idle_ids = {i.instance_id for i in idle}
        busy = sorted((i for i in view.joined if i.instance_id not in idle_ids), key=lambda i: -i.launched_at)
        cycle.scale_down(idle + busy, active - target, f"above fixed size {target}")
    return cycle.decision(None, notes)


POLICY = Policy("fixed", FixedParams, decide, "EPU (static allocation baseline)")  # type: ignore[arg-type]
