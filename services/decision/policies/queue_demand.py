"""queue-demand — the EPU paper's policy (Marshall, Tufo, Keahey: "Architecting a
Large-scale Elastic Environment", ICSOFT 2012).

    launch = cores requested by queued jobs − (free workers + pending instances)

in instances of ``cores_per_node`` cores, with multi-node jobs packed per node
(``demand.nodes_needed``). One iteration, in the paper's order:

1. decide launches (after giving up instances stalled for ``stall_seconds``, default 10
   minutes, which therefore get replaced in the same iteration);
2. tell the batch system to add newly running instances;
3. offline idle workers (only when the queue holds nothing they could run);
4. terminate workers offlined earlier (once drained and removed).
"""

from __future__ import annotations

from pydantic import Field

from services.decision import lifecycle as lc
from services.decision.actions import Action, Decision
from services.decision.demand import nodes_needed
from services.decision.policies.base import Params, Policy
from services.decision.view import DomainView


class QueueDemandParams(Params):
    idle_seconds: float = Field(0.0, ge=0)
    """A worker idle this long is offlined (0 = at the first iteration that sees it idle, as in the paper)."""


def decide(view: DomainView, params: QueueDemandParams, now: float) -> Decision:  # type: ignore[override]
    actions: list[Action] = []
    notes: list[str] = []
    gone = lc.stalled(view, params.stall_seconds)
    gone_ids = {i.instance_id for i in gone}
    pending = [i for i in view.pending if i.instance_id not in gone_ids]
    free = view.free_workers()
    supply = [n.cores - n.cores_used for n in free] + [i.cores for i in pending]
    result = nodes_needed(view.demand.shapes, supply, view.cores_per_node)
    notes.append(
        f"queued {view.demand.jobs} jobs / {view.demand.cores} cores; supply: {len(free)} free workers "
        f"+ {len(pending)} pending instances → {result.new_nodes} new node(s) of {view.cores_per_node} cores")
    if result.unsatisfiable:
        notes.append(f"never satisfiable with {view.cores_per_node}-core nodes: "
                     + ", ".join(f"{k} job(s) of {n}x{m} cores" for (m, n), k in result.unsatisfiable.items()))
    # 1. launches (reclaiming draining nodes first), stalled ones replaced
    back, need = lc.reclaim(view, result.new_nodes)
    actions += lc.give_up(view, gone, params.stall_seconds)
    active_after = len(view.active) - len(gone) + len(back)
    launches, more = lc.bounded_launches(view, need, view.cores_per_node,
                                         f"queue demand: {view.demand.cores} cores queued", active_after)
    notes += more
    actions += back + launches
    # 2. add newly running instances
    actions += lc.add_started(view)
    # 3. offline idle workers, only when nothing queued could use them
    if result.new_nodes == 0 and not _runnable_waiting(view, supply):
        idle = view.idle(params.idle_seconds)
        actions += lc.scale_down(view, idle, len(idle), "idle worker, empty queue",
                                 active_after + len(launches))
    # 4. terminate workers offlined earlier
    actions += lc.finish_drains(view)
    return Decision(actions, None, notes)


def _runnable_waiting(view: DomainView, supply: list[int]) -> bool:
    """True when some queued job could run on the current supply (then no worker is idle for long)."""
    return any(k and any(c >= m for c in supply) for (m, _n), k in view.demand.shapes.items())


POLICY = Policy("queue-demand", QueueDemandParams, decide,  # type: ignore[arg-type]
                "EPU paper (Marshall, Tufo, Keahey, ICSOFT 2012), queue-based policy")
