"""start-time — launch for a pending job only when a new node would start it sooner than the
nodes we already have (new in EPU; no peer policy does this).

queue-demand launches for every queued core the free and booting supply cannot hold *now*. But a
busy node whose jobs end in two minutes will start a queued job sooner than a new VM that boots
in three. This policy estimates, job by job (oldest first), when the existing supply could
start it, and launches only for the jobs a new node would start earlier:

* supply = per node, the time each of its cores frees up: free cores now; a busy node's cores
  at its jobs' expected ends (``NodeInfo.job_ends``: start + time limit; a job with no limit
  holds its cores indefinitely); a booting instance's cores when it should have joined (its
  launch time + the measured boot time of its site);
* a queued job of N nodes × M cores could start on the supply at the N-th earliest time a node
  has M cores free; a new node would start it at now + the site's measured boot time. If the
  supply is no later (by ``margin_seconds`` at least), the job is booked there (those cores are
  held for its time limit) — else N new nodes are launched for it and booked;
* boot time per site is measured (the mean of launch → joined over the last instances, kept in
  the policy's memory), ``boot_seconds`` until the first one joins;
* scale-down, billing-aware (CLUES's rule, generalized): with a billing period
  (``billing_period_seconds`` > 0) an idle node is kept until ``billing_margin_seconds`` before
  the end of its paid period — it is already paid; with per-second billing an idle node is kept
  ``keep_seconds`` (default: one measured boot time, the ski-rental break-even) when demand is
  likely (jobs were queued within ``demand_window_seconds``), else ``idle_seconds``.

By shapes (a domain with an instance-type catalogue): only the jobs some type can serve are
planned (the packer's satisfiable shapes; held, limit-blocked and unsatisfiable jobs never count),
a new node on the timeline is the largest type on offer, and the count of new nodes the timeline
asks for is launched as the packer's plan (its typed launches first, then the cheapest type that
fits every pending shape: ``ShapedDemand.take``); an idle node is offlined only if the pending
jobs would fit without it (``ShapedDemand.drainable``). The count and the types come from two
models (the timeline in new-node units and in cores only — which node a job may wait for ignores
partitions, memory and GPUs — the packer in typed instances): an approximation, like the policy.

Only the first ``lookahead_jobs`` queued jobs are planned one by one; jobs beyond them are left
for later iterations (the queue drains), so a queue of 100,000 jobs costs no more than 200.
Time limits are estimates: a job that ends early only makes the estimate pessimistic (the
policy then launches where waiting would have done); a job with no limit makes a busy node
count as never free (the policy then behaves like queue-demand).
"""

from __future__ import annotations

import heapq
import math

from epu.services.decision import lifecycle as lc
from epu.services.decision import shaped
from epu.services.decision.actions import Decision
from epu.services.decision.policies.base import Params, Policy
from epu.services.decision.policies.spare import near_period_end
from epu.services.decision.view import DomainView, Instance
from pydantic import Field, model_validator

INF = math.inf


class StartTimeParams(Params):
    boot_seconds: float = Field(180.0, gt=0)
    """Assumed boot time (launch → joined) of a site until one has been measured."""
    margin_seconds: float = Field(60.0, ge=0)
    """Wait for the supply only when it starts the job at least this much sooner than a new node
    would (a hedge: the batch scheduler may give a freed node to another job than the one booked)."""
    idle_seconds: float = Field(0.0, ge=0)
    """Per-second billing, no demand likely: offline a node idle this long."""
    keep_seconds: float = Field(0.0, ge=0)
    """Per-second billing, demand likely: keep an idle node this long (0 = the measured boot time)."""
    demand_window_seconds: float = Field(1800.0, ge=0)
    """Demand is likely when jobs were queued within this window."""
    billing_period_seconds: float = Field(0.0, ge=0)
    """The sites' billing period (3600 = per hour; 0 = per second)."""
    billing_margin_seconds: float = Field(300.0, ge=0)
    lookahead_jobs: int = Field(200, ge=1)
    experimental: bool = False
    """Must be set to use this policy on a real domain: it did not clear the issue's bar (cheaper
    than queue-demand, threshold *and* spare at equal or better p95 wait on a realistic workload;
    docs/experiments.md), so it is not offered as a production policy. ``epu simulate`` sets it."""

    @model_validator(mode="after")
    def _only_when_asked(self) -> StartTimeParams:
        if not self.experimental:
            raise ValueError("start-time is experimental (it did not beat queue-demand, threshold and spare "
                             "on cost at equal p95 wait: docs/experiments.md); set experimental=true to use it")
        return self


def boot_estimate(memory: dict, site: str, default: float) -> float:
    b = memory.get("boot", {}).get(site)
    return float(b[0]) if b else default


def measure_boots(view: DomainView, memory: dict) -> bool:
    """Fold the boots of instances that joined in this iteration into a running mean per site."""
    boots = {k: list(v) for k, v in memory.get("boot", {}).items()}
    changed = False
    for i in view.joined:
        if i.joined_at is not None and i.joined_at >= view.now and i.joined_at > i.launched_at:
            mean, n = boots.get(i.site, (0.0, 0))
            n = min(n + 1, 50)  # a moving mean over the last ~50 boots
            boots[i.site] = [round(mean + (i.joined_at - i.launched_at - mean) / n, 3), n]
            changed = True
    if changed:
        memory["boot"] = boots
    return changed


class Supply:
    """Per node, a heap of the times its cores become free."""

    def __init__(self) -> None:
        self.nodes: list[list[float]] = []

    def add(self, cores: int, free_at: list[float]) -> None:
        times = sorted(free_at)[:cores]
        times += [INF] * (cores - len(times))
        heapq.heapify(times)
        self.nodes.append(times)

    def earliest(self, cores: int, nodes: int) -> tuple[float, list[int]]:
        """The earliest time ``nodes`` distinct nodes each have ``cores`` cores free, and which."""
        ready = []
        for idx, times in enumerate(self.nodes):
            if len(times) >= cores:
                ready.append((heapq.nsmallest(cores, times)[-1], idx))
        if len(ready) < nodes:
            return INF, []
        ready.sort()
        chosen = ready[:nodes]
        return chosen[-1][0], [idx for _, idx in chosen]

    def book(self, idxs: list[int], cores: int, start: float, until: float) -> None:
        for idx in idxs:
            times = self.nodes[idx]
            for _ in range(cores):
                t = heapq.heappop(times)
                heapq.heappush(times, max(until, t, start))


def node_free_times(view: DomainView, name: str, cores: int, used: int, jobs: list[str],
                    job_ends: list[float], now: float) -> list[float]:
    free = [now] * max(0, cores - used)
    if used and jobs:
        per = used / len(jobs)
        ends = list(job_ends) if len(job_ends) == len(jobs) else [0.0] * len(jobs)
        share = 0.0
        for end in sorted(ends, key=lambda e: e if e > 0 else INF):
            share += per
            while len(free) < cores and share >= 1 - 1e-9:
                free.append(max(now, end) if end > 0 else INF)
                share -= 1
    return free + [INF] * (cores - len(free))


def plan_launches(view: DomainView, params: StartTimeParams, pending: list[Instance],
                  memory: dict, site: str, sd: shaped.ShapedDemand | None = None) -> tuple[int, list[str]]:
    """How many new nodes start some queued job sooner than the supply would (see the module
    docstring); by shapes (``sd``), only satisfiable jobs, new nodes of the largest offered type."""
    now = view.now
    supply = Supply()
    for n in view.nodes.values():
        if n.state in ("free", "busy") and n.cores:
            supply.add(n.cores, node_free_times(view, n.name, n.cores, n.cores_used, n.jobs, n.job_ends, now))
    # Cloud supply (booting instances, new nodes) is dated margin_seconds earlier than it is:
    # busy nodes must then free up margin_seconds before a new node would be ready to be waited for.
    margin = params.margin_seconds
    for i in pending:
        at = max(now, i.launched_at + boot_estimate(memory, i.site, params.boot_seconds) - margin)
        supply.add(i.cores, [at] * i.cores)
    new_start = now + boot_estimate(memory, site, params.boot_seconds) - margin
    cpn = view.cores_per_node
    jobs = sorted(view.demand.detail, key=lambda s: -s.max_wait_s)
    if sd is not None:
        jobs = sorted(sd.plan.shapes, key=lambda s: -s.max_wait_s)
        cpn = max((o.cores for o in view.catalogue.offers if o.room > 0), default=cpn)
    launch = 0
    planned = 0
    for shape in jobs:
        if shape.cores > cpn:
            continue  # no new node can hold it
        limit = shape.time_limit_s or INF
        for _ in range(shape.count):
            if planned >= params.lookahead_jobs:
                break
            planned += 1
            t, idxs = supply.earliest(shape.cores, shape.nodes)
            if t <= new_start:
                supply.book(idxs, shape.cores, t, t + limit)
                continue
            # new nodes: as many as the job lacks among nodes ready by then
            have = [i for i, times in enumerate(supply.nodes)
                    if len(times) >= shape.cores and heapq.nsmallest(shape.cores, times)[-1] <= new_start]
            lack = max(0, shape.nodes - len(have))
            for _ in range(lack):
                supply.add(cpn, [new_start] * cpn)
            launch += lack
            t, idxs = supply.earliest(shape.cores, shape.nodes)
            if idxs:
                supply.book(idxs, shape.cores, t, t + limit)
    notes = [f"planned {planned} queued job(s): {launch} new node(s) start some sooner than the supply "
             f"(new node ready at +{new_start + margin - now:.0f}s)"]
    return launch, notes


def decide(view: DomainView, params: StartTimeParams, now: float) -> Decision:  # type: ignore[override]
    cycle = lc.Cycle(view, params.stall_seconds, params.gang_deadline)
    memory = dict(view.memory)
    measure_boots(view, memory)
    if view.demand.jobs and now - float(memory.get("demand_at", 0.0)) >= 60.0:
        memory["demand_at"] = now
    boots = memory.get("boot", {})
    site = min(boots, key=lambda s: boots[s][0]) if boots else ""  # the fastest measured site
    sd = shaped.of_cycle(cycle) if view.catalogue is not None else None
    need, notes = plan_launches(view, params, cycle.pending, memory, site, sd)
    why = "a new node starts a queued job sooner"
    if sd is not None:
        notes = sd.notes + notes
        cycle.launch(need, why, typed=sd.take(need, why))
    else:
        cycle.launch(need, why)
    if sd is not None:
        keep = params.keep_seconds or boot_estimate(memory, site, params.boot_seconds)
        idle = sd.drainable(view.idle(keep if sd.satisfiable_jobs else params.idle_seconds))
        cycle.scale_down(idle, len(idle), "idle: the pending jobs fit without it")
    elif not view.demand.jobs:
        likely = now - float(memory.get("demand_at", -INF)) <= params.demand_window_seconds
        if params.billing_period_seconds > 0:
            idle = [i for i in view.idle(0.0) if near_period_end(i, now, params.billing_period_seconds,
                                                                   params.billing_margin_seconds)]
            why = "idle, paid period ending"
        else:
            keep = (params.keep_seconds or boot_estimate(memory, site, params.boot_seconds)) if likely \
                else params.idle_seconds
            idle = view.idle(keep)
            why = f"idle {keep:.0f}s ({'demand likely' if likely else 'no demand lately'})"
        cycle.scale_down(idle, len(idle), why)
    return cycle.decision(memory if memory != view.memory else None, notes)


POLICY = Policy("start-time", StartTimeParams, decide,  # type: ignore[arg-type]
                "EPU: start-time-aware launches, billing-aware retention")
