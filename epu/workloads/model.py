"""What a workload is: jobs with a submit time, a run time and a size. Pure data.

Every input — a Parallel Workloads Archive trace (SWF), Slurm accounting, HTCondor history, a
generator — becomes a ``Workload``, so ``epu simulate`` and the simulated batch backend take any
of them the same way. Times are seconds from the workload's own start (the first job's submit
time is not forced to 0: a window keeps its gaps), sizes are processors (cores) in total plus,
where the source says so, the number of nodes.

How a job lands on a cluster (``shape``): the simulated batch system, like Slurm, runs a job as
N nodes × M cores each. A source that gives nodes (Slurm ``NNodes``, an MPI generator) keeps
them; one that gives only processors (SWF) is spread over nodes of the cluster's
``cores_per_node``: ``ceil(P / C)`` nodes of ``min(P, C)`` cores — a 128-processor SWF job on a
1-core-per-node cluster is 128 nodes of 1 core, as on the iPSC/860 it came from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace


@dataclass(frozen=True, slots=True)
class TraceJob:
    job_id: str
    submit: float
    """Seconds from the workload's start."""
    run: float
    """Run time, seconds (how long the job holds its nodes once started)."""
    procs: int
    """Processors (cores) in total."""
    nodes: int = 0
    """Nodes, when the source says (0: derive from ``procs`` and the cluster's cores per node)."""
    time_limit: float = 0.0
    """Requested wall time, seconds (0: unknown). A scheduler's estimate of the job's end."""
    user: str = ""
    queue: str = ""
    """Queue or partition (cost accounting's partition)."""
    status: str = ""
    """What the source says happened (completed, failed, cancelled, timeout...)."""
    wait: float | None = None
    """The wait the source recorded, seconds (None: unknown)."""
    account: str = ""
    """The account (group) the job is charged to, when the source says (SWF: the group id)."""

    def shape(self, cores_per_node: int) -> tuple[int, int]:
        """(nodes, cores per node) of this job on a cluster of ``cores_per_node``-core nodes."""
        c = max(1, cores_per_node)
        if self.nodes > 0:
            per = max(1, math.ceil(self.procs / self.nodes))
            if per <= c:
                return self.nodes, per
        return max(1, math.ceil(self.procs / c)), min(self.procs, c)


@dataclass
class Workload:
    name: str
    jobs: list[TraceJob]
    source: str = ""
    """Where it came from (a file, a generator and its parameters)."""
    machine_procs: int = 0
    """Processors of the machine the trace was recorded on (0: unknown)."""
    machine_nodes: int = 0
    start_epoch: float | None = None
    """Wall-clock time of the workload's second 0, when the source says (SWF UnixStartTime)."""
    notes: list[str] = field(default_factory=list)
    """What an operator must know to read results (e.g. "submit times are start times")."""
    skipped: dict[str, int] = field(default_factory=dict)
    """Records left out while reading, by reason (e.g. "run time unknown": 12)."""

    def __post_init__(self) -> None:
        self.jobs.sort(key=lambda j: (j.submit, j.job_id))

    @property
    def span(self) -> float:
        """Seconds from the first submit to the last submit."""
        return self.jobs[-1].submit - self.jobs[0].submit if self.jobs else 0.0

    @property
    def max_procs(self) -> int:
        return max((j.procs for j in self.jobs), default=0)

    def core_seconds(self) -> float:
        return sum(j.procs * j.run for j in self.jobs)

    def peak_procs(self) -> int:
        """Most processors in use at once if every job started at its submit time."""
        events = sorted([(j.submit, j.procs) for j in self.jobs] + [(j.submit + j.run, -j.procs) for j in self.jobs],
                        key=lambda e: (e[0], e[1]))
        cur = peak = 0
        for _, d in events:
            cur += d
            peak = max(peak, cur)
        return peak

    def copy(self, jobs: list[TraceJob], **changes: object) -> Workload:
        w = replace(self, jobs=jobs, notes=list(self.notes), skipped=dict(self.skipped))
        for k, v in changes.items():
            setattr(w, k, v)
        return w

    def describe(self) -> dict[str, object]:
        """Figures an operator checks first (JSON-ready)."""
        runs = sorted(j.run for j in self.jobs)
        return {"name": self.name, "source": self.source, "jobs": len(self.jobs),
                "span_hours": round(self.span / 3600, 2), "machine_procs": self.machine_procs,
                "max_procs": self.max_procs, "core_hours": round(self.core_seconds() / 3600, 1),
                "run_p50_s": runs[len(runs) // 2] if runs else 0, "notes": list(self.notes),
                "skipped": dict(self.skipped)}


class WorkloadError(ValueError):
    """A workload that cannot be read or built; the message names the file, line and field."""
