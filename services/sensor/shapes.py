"""Grouping pending jobs into shapes as they are read, and naming nodes the same way everywhere.

Why group at the source: the engine needs "how many jobs ask for what", never one record per
job. 100,000 pending jobs are typically a few hundred distinct requests; building (and then
validating, sending, decoding) one object per job is what made a big site's snapshot cost
seconds and megabytes. A backend's parser calls ``ShapeGrouper.add`` once per pending job
with plain values (a dict update, no model), and ``shapes()`` validates the grouped result
once per shape.

``ShapeGrouper`` also keeps a small, bounded sample of per-job records (``sample``) so that
``epu sensor snapshot`` can still show an operator a few concrete job ids per shape; the
snapshot on the wire carries only the shapes.

Bounding the number of shapes: job requests are usually few, but free-form time limits
(``--time=7:13:00``) can make every job its own shape. Above ``max_shapes`` distinct shapes,
time limits are rounded *up* to a coarse ladder (``TIME_LADDER_S``) and the jobs regrouped:
a longer limit than asked is the cautious direction for scale-down decisions. Memory, cores,
GPUs and features are never rounded (rounding them could make a job look unsatisfiable).
"""

from __future__ import annotations

import bisect
import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from epu.common.messages import JobShape, QueuedJob

#: Time-limit ladder used only when there are more than ``max_shapes`` distinct shapes (seconds).
TIME_LADDER_S = (300, 900, 1800, 3600, 2 * 3600, 4 * 3600, 8 * 3600, 12 * 3600, 86400, 2 * 86400,
                 3 * 86400, 7 * 86400, 14 * 86400, 30 * 86400, 365 * 86400)
DEFAULT_MAX_SHAPES = 2000
DEFAULT_SAMPLE = 3


def coarse_time_limit(seconds: int) -> int:
    """Round a time limit up to the next ladder step (0 = none stays 0)."""
    if seconds <= 0:
        return 0
    i = bisect.bisect_left(TIME_LADDER_S, seconds)
    return TIME_LADDER_S[i] if i < len(TIME_LADDER_S) else seconds


def short_hostname(name: str) -> str:
    """The one place node names are normalized: ``exec01.example.org`` → ``exec01``.

    HTCondor's ``Machine`` (and some Torque setups) report the FQDN while EPU names workers by
    their short host name; matching must not depend on which one a batch system prints. IP
    addresses are left alone (``10.0.0.5`` is not a host ``10``)."""
    name = (name or "").strip().rstrip(".")
    if not name or "." not in name:
        return name
    if not name[0].isdigit() and ":" not in name:  # no IPv4 (digit first) or IPv6 (colons): skip the parse
        return name.split(".", 1)[0]
    try:
        ipaddress.ip_address(name)
        return name
    except ValueError:
        return name.split(".", 1)[0]


class ShapeGrouper:
    """Accumulates pending jobs into shapes: ``add`` per job, ``shapes()`` once at the end."""

    __slots__ = ("_groups", "max_shapes", "sample_per_shape", "coarsened")

    def __init__(self, max_shapes: int = DEFAULT_MAX_SHAPES, sample_per_shape: int = DEFAULT_SAMPLE) -> None:
        # key → [count, max_wait, reason_class, sample job ids]
        self._groups: dict[tuple, list] = {}
        self.max_shapes = max_shapes
        self.sample_per_shape = sample_per_shape
        self.coarsened = False

    def add(self, *, nodes: int, cores: int, memory_mb: int, gpus: int, features: tuple[str, ...],
            partition: str, time_limit_s: int, demand: bool, reason: str, reason_class: str,
            wait_s: float, count: int = 1, job_id: str = "") -> None:
        key = (nodes, cores, memory_mb, gpus, features, partition, time_limit_s, demand, reason)
        g = self._groups.get(key)
        if g is None:
            self._groups[key] = [count, wait_s, reason_class, [job_id] if job_id else []]
            return
        g[0] += count
        if wait_s > g[1]:
            g[1] = wait_s
        if job_id and len(g[3]) < self.sample_per_shape:
            g[3].append(job_id)

    def add_group(self, *, nodes: int, cores: int, memory_mb: int, gpus: int, features: tuple[str, ...],
                  partition: str, time_limit_s: int, demand: bool, reason: str, reason_class: str,
                  wait_s: float, count: int, job_ids: Sequence[str]) -> None:
        """``count`` jobs of one shape at once (a parser that grouped them itself); ``job_ids``
        are the first few of them, in the order read, for the shape's sample."""
        for i, job_id in enumerate(job_ids or ("",)):  # the first counts them all; the rest add a sample id
            self.add(nodes=nodes, cores=cores, memory_mb=memory_mb, gpus=gpus, features=features, partition=partition,
                     time_limit_s=time_limit_s, demand=demand, reason=reason, reason_class=reason_class,
                     wait_s=wait_s, count=count if i == 0 else 0, job_id=job_id)

    def add_job(self, job: QueuedJob, *, demand: bool, reason: str, reason_class: str, gpus: int = 0,
                features: Iterable[str] = (), time_limit_s: int = 0) -> None:
        """Convenience for parsers that already built a ``QueuedJob`` (small inputs, tests)."""
        self.add(nodes=job.nodes, cores=job.cores, memory_mb=job.memory_mb, gpus=gpus,
                 features=tuple(sorted(features)), partition=job.queue, time_limit_s=time_limit_s,
                 demand=demand, reason=reason, reason_class=reason_class, wait_s=job.wait_seconds,
                 count=job.count, job_id=job.job_id)

    def __len__(self) -> int:
        return len(self._groups)

    def _bounded(self) -> dict[tuple, list]:
        if len(self._groups) <= self.max_shapes:
            return self._groups
        self.coarsened = True
        merged: dict[tuple, list] = {}
        for key, (count, wait, cls, ids) in self._groups.items():
            k = key[:6] + (coarse_time_limit(key[6]),) + key[7:]
            m = merged.get(k)
            if m is None:
                merged[k] = [count, wait, cls, list(ids)]
            else:
                m[0] += count
                m[1] = max(m[1], wait)
                m[3].extend(ids[: max(0, self.sample_per_shape - len(m[3]))])
        return merged

    def shapes(self) -> list[JobShape]:
        """The grouped result, validated once per shape, in a deterministic order."""
        out = []
        for key, (count, wait, cls, ids) in sorted(self._bounded().items(), key=_order):
            nodes, cores, mem, gpus, features, partition, limit, demand, reason = key
            out.append(JobShape(count=count, nodes=nodes, cores=cores, memory_mb=mem, gpus=gpus,
                                features=list(features), partition=partition, time_limit_s=limit,
                                demand=demand, reason=reason, reason_class=cls,
                                max_wait_s=round(float(wait), 1), sample_job_ids=ids))
        return out


def _order(item: tuple[tuple, list]) -> tuple:
    key = item[0]
    # demand first, then partition, then by size; repr of the rest keeps it total and stable
    return (not key[7], key[5], key[0], key[1], key[2], key[3], key[4], key[6], key[8])


@dataclass
class JobsRead:
    """One read of a batch system's jobs: pending jobs grouped into shapes as they were read,
    a bounded sample of per-job records for operators, and counts of the rest. Each backend's
    parser fills one (a subclass adds what only that backend reads)."""

    grouper: ShapeGrouper = field(default_factory=ShapeGrouper)
    sample: list[QueuedJob] = field(default_factory=list)
    running: int = 0
    finished: int = 0
    unknown_states: list[Any] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    sample_size: int = 200

    @property
    def queued(self) -> list[QueuedJob]:
        """The sample of pending jobs (all of them when fewer than ``sample_size``)."""
        return self.sample

    def shapes(self) -> list[JobShape]:
        return self.grouper.shapes()
