"""The figures of a run, from what was measured. Pure.

Definitions (docs/experiments.md repeats them for readers of the results):

* wait = start − submit of each job that started (a job requeued after losing its node counts
  its last start); mean, p50, p95 (nearest rank), max;
* bounded slowdown = max(1, (wait + run) / max(run, 10 s)), averaged (Feitelson's BSLD, τ = 10 s);
* node-hours = the life of every instance (created → terminated, or the end of the run) in hours;
* cost = per instance, its life rounded up to the site's billing granularity (and minimum),
  times the site's price per hour;
* utilization of paid cores = core-seconds jobs ran / core-seconds paid;
* launches = instances the clouds created; failures = instances that never ran (boot failed,
  or never finished booting) plus transient API errors (counted apart); replacements =
  instances given up before they ever ran (terminated while still booting);
* peak nodes = the most instances alive at once;
* jobs killed = running jobs that lost their node and were requeued (EPU must keep it at 0);
* launches per job = launches / jobs (above 1: churn, flagged in ``warnings``);
* cloud model = each site's model in full and where it came from (``assumptions``).
* attribution = the cost per account, user and partition by ``epu cost``'s rule (``epu/cost.py``):
  each paid node-second shared equally among the jobs on the node then, time with no job (and
  the billing granularity's rounding) to ``(idle)``; the accounts sum to ``cost``.
"""

from __future__ import annotations

import math
from typing import Any

from epu.simulate.assumptions import churn_warning, describe_site
from epu.simulate.run import RunData


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (0 when empty)."""
    if not sorted_values:
        return 0.0
    k = max(0, min(len(sorted_values) - 1, math.ceil(q / 100.0 * len(sorted_values)) - 1))
    return sorted_values[k]


def wait_stats(waits: list[float], runs: list[float]) -> dict[str, float]:
    w = sorted(waits)
    bsld = [max(1.0, (a + r) / max(r, 10.0)) for a, r in zip(waits, runs, strict=True)]
    return {
        "wait_mean_s": round(sum(w) / len(w), 3) if w else 0.0,
        "wait_p50_s": round(percentile(w, 50), 3),
        "wait_p95_s": round(percentile(w, 95), 3),
        "wait_max_s": round(w[-1], 3) if w else 0.0,
        "bounded_slowdown": round(sum(bsld) / len(bsld), 4) if bsld else 0.0,
    }


def vm_life(vm: Any, end: float) -> tuple[float, float]:
    """(created, gone) of a VM, clipped to the end of the run."""
    gone = vm.terminated_at if vm.terminated_at is not None else end
    return vm.created_at, min(gone, end)


def summarize(d: RunData, with_attribution: bool = True) -> dict[str, Any]:
    """The run's figures; ``with_attribution``: and its cost per account, user and partition
    (``attribution``, the one costly part: a caller that needs only the totals leaves it out)."""
    started = [j for j in d.jobs if j.start is not None]
    completed = [j for j in d.jobs if j.end is not None]
    out: dict[str, Any] = {
        "workload": d.workload.name, "policy": d.policy, "domain": d.domain, "seed": d.seed,
        "jobs": len(d.jobs), "jobs_completed": len(completed), "jobs_started": len(started),
        "jobs_skipped": sum(d.skipped.values()), "jobs_killed": d.jobs_killed,
    }
    out.update(wait_stats([j.start - j.submit for j in started], [j.run for j in started]))  # type: ignore[operator]
    node_seconds = cost = paid_core_seconds = 0.0
    launches = never_ran = replaced = 0
    events: list[tuple[float, int]] = []
    per_site: dict[str, dict[str, float]] = {}
    cloud_model: dict[str, Any] = {}
    for site, vms in d.vms.items():
        model = d.cloud.site(site)
        price = model.price_per_hour if model.price_per_hour is not None else (d.config.sites[site].price_per_hour or 0.0)
        cloud_model[site] = {"source": d.cloud_sources.get(site, "default"), **describe_site(model, price)}
        cores = d.cores.get(site, 1)
        s_nodes = s_cost = 0.0
        for vm in vms:
            a, b = vm_life(vm, d.end)
            life = max(0.0, b - a)
            billed = model.billed_seconds(life)
            s_nodes += life
            s_cost += billed / 3600.0 * price
            paid_core_seconds += billed * cores
            launches += 1
            ran = not vm.boot_fails and vm.boot_at <= b
            if not ran:
                never_ran += 1
                if vm.terminated_at is not None and vm.destroyed_by is not None:
                    replaced += 1
            events.append((a, 1))
            events.append((b, -1))
        node_seconds += s_nodes
        cost += s_cost
        per_site[site] = {"launches": len(vms), "node_hours": round(s_nodes / 3600, 3), "cost": round(s_cost, 4)}
    events.sort()
    cur = peak = 0
    for _, delta in events:
        cur += delta
        peak = max(peak, cur)
    used = sum(j.run * j.nodes * j.cores for j in completed)
    out.update({
        "node_hours": round(node_seconds / 3600.0, 3),
        "cost": round(cost, 4),
        "utilization": round(used / paid_core_seconds, 4) if paid_core_seconds else 0.0,
        "launches": launches,
        "failures": never_ran,
        "api_errors": d.cloud_errors,
        "replacements": replaced,
        "peak_nodes": peak,
        "launches_per_job": round(launches / len(d.jobs), 3) if d.jobs else 0.0,
        "simulated_hours": round((d.end - d.start) / 3600.0, 3),
        "sites": per_site,
        "cloud_model": cloud_model,
        "engine_iterations": d.iterations,
        "engine_iterations_skipped": d.iterations_skipped,
        "engine_ms_per_iteration": round(1000 * d.engine_cpu_seconds / d.iterations, 3) if d.engine_cpu_seconds else None,
        "events": d.events,
        "digest": d.digest,
        "wall_seconds": round(d.wall_seconds, 3),
        "cpu_seconds": round(d.cpu_seconds, 3),
    })
    if d.skipped:
        out["skipped"] = dict(d.skipped)
    churn = churn_warning(launches, len(d.jobs), never_ran)
    out["warnings"] = [*d.warnings, *([churn] if churn else [])]
    if with_attribution:
        out["attribution"] = attribution(d, cost)
    return out


def attribution(d: RunData, billed_cost: float) -> dict[str, Any]:
    """Cost per account, user and partition (``epu.cost``'s rule), summing to ``billed_cost``."""
    from epu.cost import IDLE, Life, Occupancy, attribute, group

    lives, prices = [], {}
    for site, vms in d.vms.items():
        model = d.cloud.site(site)
        prices[(site, "")] = model.price_per_hour if model.price_per_hour is not None \
            else (d.config.sites[site].price_per_hour or 0.0)
        for vm in vms:
            a, b = vm_life(vm, d.end)
            lives.append(Life(vm.cloud_id, d.domain, site, "", a, b))
    occ = [Occupancy(vm_id, start, end if end is not None else d.end, job) for vm_id, start, end, job in d.occupancy]
    usage = attribute(lives, occ, d.owners, prices, d.start, d.end)
    out: dict[str, Any] = {}
    for dim in ("account", "user", "partition"):
        rows = {k[0]: u.cost for k, u in group(usage, [dim])}
        rows[IDLE] = rows.get(IDLE, 0.0) + max(0.0, billed_cost - sum(rows.values()))  # billing rounding
        out[f"by_{dim}"] = {k: round(v, 4) for k, v in sorted(rows.items(), key=lambda kv: -kv[1])}
    return out


TIMING_KEYS = ("wall_seconds", "cpu_seconds", "engine_ms_per_iteration")
"""Keys that differ between two runs of the same seed (the machine's, not the simulation's)."""
