"""threshold — elastiq's rules (github.com/dberzano/elastiq).

* waiting jobs above ``waiting_jobs_threshold`` continuously for ``waiting_jobs_time_s`` →
  launch ``ceil(waiting / jobs_per_vm)`` minus instances already pending;
* a worker idle for ``idle_for_time_s`` → drain and terminate;
* always within [min_nodes, max_nodes].

The "above since" timer is policy memory, stored by the engine.
"""

from __future__ import annotations

from pydantic import Field

from services.decision import lifecycle as lc
from services.decision.actions import Action, Decision
from services.decision.policies.base import Params, Policy
from services.decision.view import DomainView


class ThresholdParams(Params):
    waiting_jobs_threshold: int = Field(0, ge=0)
    waiting_jobs_time_s: float = Field(40.0, ge=0)
    jobs_per_vm: int = Field(4, ge=1)
    idle_for_time_s: float = Field(3600.0, ge=0)


def decide(view: DomainView, params: ThresholdParams, now: float) -> Decision:  # type: ignore[override]
    actions: list[Action] = []
    notes: list[str] = []
    memory = dict(view.memory)
    waiting = view.demand.jobs
    gone = lc.stalled(view, params.stall_seconds)
    actions += lc.give_up(view, gone, params.stall_seconds)
    gone_ids = {i.instance_id for i in gone}
    pending = sum(1 for i in view.pending if i.instance_id not in gone_ids)
    active_after = len(view.active) - len(gone)
    launches: list[Action] = []
    if waiting > params.waiting_jobs_threshold:
        since = memory.setdefault("above_since", now)
        held = now - since
        if held >= params.waiting_jobs_time_s:
            wanted = lc.ceil_div(waiting, params.jobs_per_vm) - pending
            notes.append(f"{waiting} waiting > {params.waiting_jobs_threshold} for {held:.0f}s: "
                         f"ceil({waiting}/{params.jobs_per_vm}) - {pending} pending = {max(0, wanted)}")
            back, wanted = lc.reclaim(view, max(0, wanted))
            actions += back
            active_after += len(back)
            launches, more = lc.bounded_launches(view, wanted, view.cores_per_node,
                                                 f"{waiting} jobs waiting over threshold", active_after)
            notes += more
        else:
            notes.append(f"{waiting} waiting > threshold for {held:.0f}s < {params.waiting_jobs_time_s}s")
            launches, more = lc.bounded_launches(view, 0, view.cores_per_node, "", active_after)
    else:
        memory.pop("above_since", None)
        launches, more = lc.bounded_launches(view, 0, view.cores_per_node, "", active_after)
    notes += more
    actions += launches
    actions += lc.add_started(view)
    if waiting == 0:
        idle = view.idle(params.idle_for_time_s)
        actions += lc.scale_down(view, idle, len(idle), f"idle for {params.idle_for_time_s:.0f}s",
                                 active_after + len(launches))
    actions += lc.finish_drains(view)
    return Decision(actions, memory, notes)


POLICY = Policy("threshold", ThresholdParams, decide, "elastiq (D. Berzano), threshold rules")  # type: ignore[arg-type]
