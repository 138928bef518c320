"""queue-demand — the EPU paper's policy (Marshall, Tufo, Keahey: "Architecting a
Large-scale Elastic Environment", ICSOFT 2012).

    launch = cores requested by queued jobs − (free workers + pending instances)

in instances of ``cores_per_node`` cores, with multi-node jobs packed per node
(``demand.nodes_needed``). The policy decides how many nodes to launch and which idle workers to offline (only when the
queue holds nothing they could run); the shared life cycle (``lifecycle.Cycle``) runs the
paper's order around it — give up stalled instances (replaced in the same iteration), launch,
add newly running instances, offline, move drained workers on to removal and termination.
"""

from __future__ import annotations

from epu.services.decision import lifecycle as lc
from epu.services.decision import shaped
from epu.services.decision.actions import Decision
from epu.services.decision.demand import nodes_needed
from epu.services.decision.policies.base import Params, Policy
from epu.services.decision.view import DomainView
from pydantic import Field


class QueueDemandParams(Params):
    idle_seconds: float = Field(0.0, ge=0)
    """A worker idle this long is offlined (0 = at the first iteration that sees it idle, as in the paper)."""


def decide(view: DomainView, params: QueueDemandParams, now: float) -> Decision:  # type: ignore[override]
    cycle = lc.Cycle(view, params.stall_seconds, params.gang_deadline)
    if view.catalogue is not None:
        return _by_shapes(view, params, cycle)
    notes: list[str] = []
    free = view.free_workers()
    supply = [n.cores - n.cores_used for n in free] + [i.cores for i in cycle.pending]
    result = nodes_needed(view.demand.shapes, supply, view.cores_per_node)
    notes.append(
        f"queued {view.demand.jobs} jobs / {view.demand.cores} cores; supply: {len(free)} free workers "
        f"+ {len(cycle.pending)} pending instances → {result.new_nodes} new node(s) of {view.cores_per_node} cores")
    if result.unsatisfiable:
        notes.append(f"never satisfiable with {view.cores_per_node}-core nodes: "
                     + ", ".join(f"{k} job(s) of {n}x{m} cores" for (m, n), k in result.unsatisfiable.items()))
    # launches (reclaiming draining nodes first; stalled ones are replaced)
    cycle.launch(result.new_nodes, f"queue demand: {view.demand.cores} cores queued")
    # offline idle workers, only when nothing queued could use them
    if result.new_nodes == 0 and not _runnable_waiting(view, supply):
        idle = view.idle(params.idle_seconds)
        cycle.scale_down(idle, len(idle), "idle worker, empty queue")
    return cycle.decision(None, notes)


def _by_shapes(view: DomainView, params: QueueDemandParams, cycle: lc.Cycle) -> Decision:
    """The cheapest typed instances that let every satisfiable pending job start (``shaped``);
    an idle worker is offlined when the pending jobs would all still fit without it."""
    sd = shaped.of_cycle(cycle)
    cycle.launch(len(sd.launches) + len(sd.reclaim), "queue demand by shapes", typed=sd.launches,
                 filler=sd.filler, reclaim=sd.reclaim)
    drain = sd.drainable(view.idle(params.idle_seconds))
    cycle.scale_down(drain, len(drain), "idle: the pending jobs fit without it")
    return cycle.decision(None, sd.notes)


def _runnable_waiting(view: DomainView, supply: list[int]) -> bool:
    """True when some queued job could run on the current supply (then no worker is idle for long)."""
    return any(k and any(c >= m for c in supply) for (m, _n), k in view.demand.shapes.items())


POLICY = Policy("queue-demand", QueueDemandParams, decide,  # type: ignore[arg-type]
                "EPU paper (Marshall, Tufo, Keahey, ICSOFT 2012), queue-based policy")
