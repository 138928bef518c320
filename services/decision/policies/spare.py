"""spare — CLUES-style (github.com/grycap/clues): serve the queue and keep ``spare_nodes``
idle nodes ready; power off a node idle for ``idle_seconds``, but — billing-period aware —
only within ``billing_margin_seconds`` of the end of its paid period (a paid hour is kept
to the end, where a new job may still use it for free).

    launch = nodes needed by the queue + spare_nodes − (idle workers + pending instances)
"""

from __future__ import annotations

from epu.services.decision import lifecycle as lc
from epu.services.decision import shaped
from epu.services.decision.actions import Decision
from epu.services.decision.demand import nodes_needed
from epu.services.decision.policies.base import Params, Policy
from epu.services.decision.view import DomainView, Instance, is_idle
from pydantic import Field


class SpareParams(Params):
    spare_nodes: int = Field(1, ge=0)
    idle_seconds: float = Field(300.0, ge=0)
    billing_period_seconds: float = Field(3600.0, ge=0)
    """0 = billed per second (no period to wait for)."""
    billing_margin_seconds: float = Field(300.0, ge=0)


def near_period_end(inst: Instance, now: float, period: float, margin: float) -> bool:
    if period <= 0:
        return True
    used = (now - inst.launched_at) % period
    return used >= period - margin


def decide(view: DomainView, params: SpareParams, now: float) -> Decision:  # type: ignore[override]
    cycle = lc.Cycle(view, params.stall_seconds, params.gang_deadline)
    if view.catalogue is not None:
        return _by_shapes(view, params, cycle, now)
    notes: list[str] = []
    free = view.free_workers()
    supply = [n.cores - n.cores_used for n in free] + [i.cores for i in cycle.pending]
    result = nodes_needed(view.demand.shapes, supply, view.cores_per_node)
    # bins left untouched by the queue are the spares
    spare_now = max(0, len(free) + len(cycle.pending) - _bins_used(view, supply))
    want = result.new_nodes + max(0, params.spare_nodes - spare_now)
    notes.append(f"queue needs {result.new_nodes} new node(s); {spare_now} spare of {params.spare_nodes} wanted")
    cycle.launch(want, "queue demand plus spare nodes")
    excess = spare_now - params.spare_nodes
    if result.new_nodes == 0 and excess > 0:
        idle = [i for i in view.idle(params.idle_seconds)
                if near_period_end(i, now, params.billing_period_seconds, params.billing_margin_seconds)]
        kept = len(view.idle(params.idle_seconds)) - len(idle)
        if kept:
            notes.append(f"{kept} idle node(s) kept until near the end of their paid period")
        cycle.scale_down(idle, excess, "idle beyond the spare count, paid period ending")
    return cycle.decision(None, notes)


def _by_shapes(view: DomainView, params: SpareParams, cycle: lc.Cycle, now: float) -> Decision:
    """The packer's launches for the queue, plus spares of the filler type; the spares now are
    the idle nodes and pending instances the packer leaves unused."""
    sd = shaped.of_cycle(cycle)
    unused = sd.plan.unused_supply
    spare_now = (sum(1 for n in view.free_workers() if is_idle(n) and n.name in unused)
                 + sum(1 for i in cycle.pending if i.instance_id in unused))
    extra = max(0, params.spare_nodes - spare_now)
    typed = sd.launches + sd.take(len(sd.launches) + extra, "spare node")[len(sd.launches):]
    notes = [*sd.notes, f"queue needs {len(sd.launches)} new instance(s); {spare_now} spare of "
             f"{params.spare_nodes} wanted"]
    cycle.launch(len(typed) + len(sd.reclaim), "queue demand plus spare nodes", typed=typed, filler=sd.filler,
                 reclaim=sd.reclaim)
    excess = spare_now - params.spare_nodes
    if not sd.launches and excess > 0:
        idle = sd.drainable(view.idle(params.idle_seconds))
        paid_out = [i for i in idle
                    if near_period_end(i, now, params.billing_period_seconds, params.billing_margin_seconds)]
        if len(idle) > len(paid_out):
            notes.append(f"{len(idle) - len(paid_out)} idle node(s) kept until near the end of their paid period")
        cycle.scale_down(paid_out, excess, "idle beyond the spare count, paid period ending")
    return cycle.decision(None, notes)


def _bins_used(view: DomainView, supply: list[int]) -> int:
    """How many supply bins the queue occupies (single-node shapes; an upper bound otherwise)."""
    used = 0
    for (m, n), k in view.demand.shapes.items():
        used += k * n if m else 0
    return min(used, len(supply))


POLICY = Policy("spare", SpareParams, decide, "CLUES (GRyCAP, UPV), power management with spare nodes")  # type: ignore[arg-type]
