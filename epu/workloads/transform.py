"""Reshape a workload: take a window of it, scale it in time or in size. Pure.

* ``window(w, start_days, days)``: the jobs submitted in [start, start + days) — shifted so the
  window starts at second 0 (a month of a three-month trace);
* ``scale_time(w, f)``: submit times × f (f < 1 packs the same jobs into less time: more load;
  run times are unchanged, so this changes the offered load by 1/f);
* ``scale_size(w, f)``: every job's processors (and nodes) × f, rounded, at least 1, and the
  machine with them (the same trace on a machine f times larger);
* ``limit(w, n)``: the first n jobs.

Each returns a new workload whose ``source`` says what was done, so a report shows it.
"""

from __future__ import annotations

import math
from dataclasses import replace

from epu.workloads.model import Workload, WorkloadError

DAY = 86400.0


def window(w: Workload, start_days: float = 0.0, days: float | None = None) -> Workload:
    if start_days < 0 or (days is not None and days <= 0):
        raise WorkloadError(f"window: start must be >= 0 and length > 0 days (got {start_days}, {days})")
    t0 = (w.jobs[0].submit if w.jobs else 0.0) + start_days * DAY
    t1 = math.inf if days is None else t0 + days * DAY
    jobs = [replace(j, submit=j.submit - t0) for j in w.jobs if t0 <= j.submit < t1]
    if not jobs:
        raise WorkloadError(f"window: no job submitted in days [{start_days}, {start_days + (days or 0)}) "
                            f"of {w.name} ({w.span / DAY:.1f} days)")
    out = w.copy(jobs, source=f"{w.source} | window {start_days:g}+{days if days is not None else 'rest'} days")
    if w.start_epoch is not None:
        out.start_epoch = w.start_epoch + t0
    return out


def scale_time(w: Workload, factor: float) -> Workload:
    if factor <= 0:
        raise WorkloadError(f"time scale must be > 0 (got {factor})")
    jobs = [replace(j, submit=j.submit * factor) for j in w.jobs]
    return w.copy(jobs, source=f"{w.source} | arrivals x{factor:g}")


def scale_size(w: Workload, factor: float) -> Workload:
    if factor <= 0:
        raise WorkloadError(f"size scale must be > 0 (got {factor})")
    jobs = [replace(j, procs=max(1, round(j.procs * factor)),
                    nodes=max(1, round(j.nodes * factor)) if j.nodes else 0) for j in w.jobs]
    return w.copy(jobs, source=f"{w.source} | size x{factor:g}",
                  machine_procs=max(1, round(w.machine_procs * factor)) if w.machine_procs else 0,
                  machine_nodes=max(1, round(w.machine_nodes * factor)) if w.machine_nodes else 0)


def limit(w: Workload, n: int) -> Workload:
    if n < 1:
        raise WorkloadError(f"max jobs must be >= 1 (got {n})")
    return w.copy(w.jobs[:n], source=f"{w.source} | first {n} jobs")
