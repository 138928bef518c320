"""The baseline: the same workload on a static cluster, no elasticity (what a site pays today).

The batch model is the simulated batch system of every run (FIFO with EASY backfill), on
``nodes`` always-on nodes; cost is every node for the whole span of the workload (first submit
to last completion) at the site's price, node-hours likewise. Nothing else runs, so it takes
a fraction of a second even for a three-month trace.
"""

from __future__ import annotations

import math
from typing import Any

from epu.services.sensor.simulated import SimulatedBatch
from epu.simulate.report import wait_stats
from epu.workloads.model import Workload


class ManualClock:
    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def now(self) -> float:
        return self.t

    def monotonic(self) -> float:
        return self.t

    def sleep(self, _seconds: float) -> None:
        """Nothing waits here."""


def replay_static(workload: Workload, nodes: int, cores_per_node: int = 1) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Every job's (submit, start, end, run, nodes, cores) on a static cluster; jobs wider than
    the cluster are left out and counted."""
    clock = ManualClock(0.0)
    batch = SimulatedBatch(clock, nodes={f"static{i:05d}": cores_per_node for i in range(nodes)})
    records: dict[str, dict[str, Any]] = {}
    skipped: dict[str, int] = {}
    batch.on_start.append(lambda j: records[j.job_id].update(start=j.start_time))
    batch.on_finish.append(lambda j: records[j.job_id].update(end=j.end_time))
    first = workload.jobs[0].submit if workload.jobs else 0.0
    seen: set[str] = set()
    horizon = 0.0
    for job in workload.jobs:
        n, c = job.shape(cores_per_node)
        if n > nodes:
            why = f"needs more than the {nodes} static nodes"
            skipped[why] = skipped.get(why, 0) + 1
            continue
        jid = job.job_id
        while jid in seen:
            jid += "+"
        seen.add(jid)
        clock.t = job.submit - first
        records[jid] = {"submit": clock.t, "run": job.run, "nodes": n, "cores": c, "start": None, "end": None}
        batch.submit(cores=c, nodes=n, duration=job.run, job_id=jid, time_limit=job.time_limit)
        horizon += job.run
    clock.t += horizon + 1.0
    batch.advance()
    return list(records.values()), skipped


def static_summary(workload: Workload, nodes: int, cores_per_node: int, price_per_hour: float,
                   billing_period: float = 1.0) -> dict[str, Any]:
    jobs, skipped = replay_static(workload, nodes, cores_per_node)
    done = [j for j in jobs if j["end"] is not None]
    span = max((j["end"] for j in done), default=0.0) - min((j["submit"] for j in jobs), default=0.0)
    billed = math.ceil(span / billing_period - 1e-9) * billing_period if span > 0 else 0.0
    used = sum(j["run"] * j["nodes"] * j["cores"] for j in done)
    out: dict[str, Any] = {"workload": workload.name, "policy": f"static-{nodes}", "jobs": len(jobs),
                           "jobs_completed": len(done), "jobs_started": sum(1 for j in jobs if j["start"] is not None),
                           "jobs_skipped": sum(skipped.values())}
    started = [j for j in jobs if j["start"] is not None]
    out.update(wait_stats([j["start"] - j["submit"] for j in started], [j["run"] for j in started]))
    out.update({"node_hours": round(nodes * span / 3600.0, 3), "cost": round(nodes * billed / 3600.0 * price_per_hour, 4),
                "utilization": round(used / (nodes * cores_per_node * span), 4) if span else 0.0,
                "launches": 0, "failures": 0, "api_errors": 0, "replacements": 0, "peak_nodes": nodes,
                "simulated_hours": round(span / 3600.0, 3)})
    if skipped:
        out["skipped"] = skipped
    return out
