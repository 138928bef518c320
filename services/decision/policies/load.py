"""load — AutoElastic-style (Righi et al., IEEE TCC 2016): the moving average of the
cluster's utilisation (cores used / cores) over ``window_seconds`` is compared to thresholds:

* average > ``upper`` → launch ``step`` instances (none while one is still pending);
* average < ``lower`` → offline ``step`` idle nodes (never below min_nodes);
* no node at all but jobs queued → launch ``step`` (a cluster at zero has no utilisation).

Samples are policy memory, stored by the engine.
"""

from __future__ import annotations

from epu.services.decision import lifecycle as lc
from epu.services.decision import shaped
from epu.services.decision.actions import Decision
from epu.services.decision.policies.base import Params, Policy
from epu.services.decision.view import DomainView
from pydantic import Field, model_validator


class LoadParams(Params):
    window_seconds: float = Field(300.0, gt=0)
    upper: float = Field(0.9, gt=0, le=1)
    lower: float = Field(0.3, ge=0, lt=1)
    step: int = Field(1, ge=1)

    @model_validator(mode="after")
    def _order(self) -> LoadParams:
        if self.lower >= self.upper:
            raise ValueError(f"lower ({self.lower}) must be below upper ({self.upper})")
        return self


def utilisation(view: DomainView) -> float | None:
    nodes = [n for n in view.nodes.values() if n.state in ("free", "busy") and n.cores]
    total = sum(n.cores for n in nodes)
    return sum(min(n.cores_used, n.cores) for n in nodes) / total if total else None


def decide(view: DomainView, params: LoadParams, now: float) -> Decision:  # type: ignore[override]
    cycle = lc.Cycle(view, params.stall_seconds, params.gang_deadline)
    notes: list[str] = []
    pending = len(cycle.pending)
    util = utilisation(view)
    samples = [(t, u) for t, u in view.memory.get("samples", []) if now - t < params.window_seconds]
    if util is not None:
        samples.append((now, util))
    avg = sum(u for _, u in samples) / len(samples) if samples else None
    want = 0
    sd = shaped.of_cycle(cycle) if view.catalogue is not None else None
    jobs = sd.satisfiable_jobs if sd is not None else view.demand.jobs
    if avg is None:
        if jobs and pending == 0:
            want = params.step
            notes.append("no node to measure yet and jobs queued: bootstrap launch")
    elif avg > params.upper and pending == 0:
        want = params.step
        notes.append(f"moving average {avg:.2f} over {len(samples)} samples > upper {params.upper}")
    why = "utilisation above upper threshold"
    launched = cycle.launch(want, why, typed=sd.take(want, why) if sd else ())
    if avg is not None and avg < params.lower and not launched:
        notes.append(f"moving average {avg:.2f} over {len(samples)} samples < lower {params.lower}")
        idle = sd.drainable(view.idle(0)) if sd is not None else view.idle(0)
        cycle.scale_down(idle, params.step, "utilisation below lower threshold")
    return cycle.decision({"samples": [list(s) for s in samples]}, notes)


POLICY = Policy("load", LoadParams, decide, "AutoElastic (Righi et al., IEEE TCC 2016)")  # type: ignore[arg-type]
