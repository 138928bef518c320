"""threshold — elastiq's rules (github.com/dberzano/elastiq).

* waiting jobs above ``waiting_jobs_threshold`` continuously for ``waiting_jobs_time_s`` →
  launch ``ceil(waiting / jobs_per_vm)`` minus instances already pending;
* a worker idle for ``idle_for_time_s`` → drain and terminate;
* always within [min_nodes, max_nodes].

The "above since" timer is policy memory, stored by the engine.
"""

from __future__ import annotations

from epu.services.decision import lifecycle as lc
from epu.services.decision import shaped
from epu.services.decision.actions import Decision
from epu.services.decision.policies.base import Params, Policy
from epu.services.decision.view import DomainView
from pydantic import Field


class ThresholdParams(Params):
    waiting_jobs_threshold: int = Field(0, ge=0)
    waiting_jobs_time_s: float = Field(40.0, ge=0)
    jobs_per_vm: int = Field(4, ge=1)
    idle_for_time_s: float = Field(3600.0, ge=0)


def decide(view: DomainView, params: ThresholdParams, now: float) -> Decision:  # type: ignore[override]
    cycle = lc.Cycle(view, params.stall_seconds, params.gang_deadline)
    notes: list[str] = []
    memory = dict(view.memory)
    waiting = view.demand.jobs
    pending = len(cycle.pending)
    sd = shaped.of_cycle(cycle) if view.catalogue is not None else None
    if sd is not None:
        waiting = sd.satisfiable_jobs  # unsatisfiable jobs are no reason to launch
        notes += sd.notes
    if waiting > params.waiting_jobs_threshold:
        since = memory.setdefault("above_since", now)
        held = now - since
        if held >= params.waiting_jobs_time_s:
            wanted = lc.ceil_div(waiting, params.jobs_per_vm) - pending
            notes.append(f"{waiting} waiting > {params.waiting_jobs_threshold} for {held:.0f}s: "
                         f"ceil({waiting}/{params.jobs_per_vm}) - {pending} pending = {max(0, wanted)}")
            why = f"{waiting} jobs waiting over threshold"
            cycle.launch(max(0, wanted), why, typed=sd.take(max(0, wanted), why) if sd else ())
        else:
            notes.append(f"{waiting} waiting > threshold for {held:.0f}s < {params.waiting_jobs_time_s}s")
    else:
        memory.pop("above_since", None)
    if waiting == 0 or sd is not None:
        idle = view.idle(params.idle_for_time_s)
        if sd is not None:  # by shapes: only nodes the waiting jobs would not use
            idle = sd.drainable(idle)
        cycle.scale_down(idle, len(idle), f"idle for {params.idle_for_time_s:.0f}s")
    return cycle.decision(memory, notes)


POLICY = Policy("threshold", ThresholdParams, decide, "elastiq (D. Berzano), threshold rules")  # type: ignore[arg-type]
