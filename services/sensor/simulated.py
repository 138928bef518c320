"""A simulated batch cluster: jobs really run on nodes for their duration, then finish.

Why it exists: the embedded demo (and tests of the loop above the sensor) need a cluster whose
queue drains when EPU adds nodes and whose nodes go idle when work runs out — in virtual or
scaled time. Time comes from an injected ``Clock`` (design rule 6): nothing sleeps here;
every public call first brings the cluster up to ``clock.now()`` by replaying job completions
in time order and scheduling after each.

Scheduling: FIFO with EASY-style backfill — the head job gets a reservation at the earliest
time enough nodes free up (its *shadow time*); a later job may jump ahead only if it fits now
and ends before that time, so backfill never delays the head job. Placement packs jobs onto
the fullest node that fits, so idle nodes stay idle and can be scaled down.

Node commands behave like a real batch system, idempotently: ``add`` of an existing node is
a no-op, ``remove`` of a missing one too; ``remove`` of a node running jobs is refused unless
``force`` (then its jobs go back to the head of the queue, like a requeue).

Identity: ``add`` may carry the EPU instance id (``instance_id=``), which the node then reports
as ``NodeInfo.instance_id`` — as the real backends carry it in a Slurm feature, an HTCondor
startd attribute or a Torque note. The simulator (``epu.sim``) also turns a node's daemon on and
off as its virtual machine lives and dies (``set_node_up``) and counts the jobs a dying node
takes with it (``on_kill``).
"""

from __future__ import annotations

import heapq
import itertools
import math
import operator
import threading
from dataclasses import dataclass, field
from typing import NamedTuple

from epu.common.clock import Clock, RealClock
from epu.common.messages import JobShape, NodeInfo, QueuedJob, group_jobs
from epu.services.sensor.backend import (
    BackendUnavailable,
    CommandOutcome,
    Observation,
    check_action,
    check_node_name,
)


def mismatched_add(node: str, have: int, asked: int) -> CommandOutcome:
    """An ``add`` of a node that exists with another core count: an error naming both (what the
    real backends answer), never an ok that leaves the old count."""
    return CommandOutcome(False, output=f"node {node}: {have} cores", error=(
        f"node {node} already exists with {have} core(s), not the {asked} asked: not changed"))


@dataclass
class SimNode:
    name: str
    cores: int
    offline: bool = False
    down: bool = False
    jobs: dict[str, int] = field(default_factory=dict)
    """job id → cores used on this node."""
    state_since: float = 0.0
    last_state: str = "free"
    instance_id: str | None = None
    memory_mb: int = 0
    """0 = unknown (not checked), as for a real node."""
    gpus: int = 0
    features: frozenset[str] = frozenset()
    partitions: frozenset[str] = frozenset()
    """Partitions it serves (empty: every one)."""
    version: int = 0
    """Moved by every change of its jobs or state (``SimulatedBatch._touch``): with the fields read
    directly, what says the last ``NodeInfo`` built for it is still true."""
    reported: tuple[int, str | None, NodeInfo] | None = None
    """(``version``, ``instance_id``, the NodeInfo) of the last snapshot: reused while both are the
    same (a NodeInfo is immutable)."""

    @property
    def used(self) -> int:
        return sum(self.jobs.values())

    @property
    def free_cores(self) -> int:
        return self.cores - self.used

    def usable(self) -> bool:
        return not self.offline and not self.down

    def state(self) -> str:
        if self.down:
            return "down"
        if self.offline:
            return "offline"
        return "busy" if self.used >= self.cores else "free"


_PLAIN = operator.attrgetter("plain")
_INSTANCE_ID = operator.attrgetter("instance_id")
_ROW_SHAPE = operator.attrgetter("nodes", "cores", "queue", "held")
_SUBMIT = operator.attrgetter("submit_time")

SAMPLE_JOBS = 20
"""Per-job records a snapshot keeps with ``group_at_source`` (for operators)."""


class _Row(NamedTuple):
    """A pending job (or array) as ``QueuedJob`` would carry it, without the model. In
    ``_Pending.rows`` ``wait_seconds`` holds minus the submit time (see ``_Pending``)."""

    job_id: str
    cores: int
    nodes: int
    queue: str
    submit_time: float
    wait_seconds: float
    state: str
    count: int
    memory_mb: int = 0


class _Pending(NamedTuple):
    """The queued part of a snapshot as far as it does not depend on ``now``: kept while the
    queue does not change (``SimulatedBatch._queue_version``) and only aged at each read.

    Why it is exact: everything but the waits is a function of the queue alone (its jobs, their
    order and held flags); a wait is ``max(0.0, now - submit_time)`` and a shape's longest wait
    the largest of its jobs' — which is the wait of its earliest submit time, as a float
    subtraction ``now - s`` never grows when ``s`` does. So a shape keeps its earliest submit time
    (``earliest``), a row its own, and a read computes the same floats the full rebuild did."""

    version: int
    rows: list[_Row]
    """Every pending row (``group_at_source``: only the sample), ``wait_seconds`` unset."""
    shapes: list[tuple[dict, float]]
    """(a ``JobShape``'s fields but ``max_wait_s``, the earliest submit time of its jobs)."""


@dataclass
class SimJob:
    job_id: str
    cores: int
    nodes: int
    duration: float
    submit_time: float
    queue: str = "batch"
    held: bool = False
    start_time: float | None = None
    end_time: float | None = None
    placed_on: list[str] = field(default_factory=list)
    array_id: str | None = None
    time_limit: float = 0.0
    """Requested wall time, seconds (0 = none): reported in shapes and as the running job's
    expected end (``NodeInfo.job_ends``); the job still runs ``duration``."""
    memory_mb: int = 0
    """Per node (0 = not requested)."""
    gpus: int = 0
    """Per node."""
    features: frozenset[str] = frozenset()
    blocked: str = ""
    """A limit no node can lift (``QOSMaxJobsPerUserLimit``...): never started, not demand."""
    account: str = ""
    user: str = ""
    pending_row: _Row | None = field(default=None, repr=False, compare=False)
    """Its row in snapshots while pending, not an array element (``row``)."""
    plain: bool = field(init=False, repr=False, compare=False)
    """Neither an array element nor asking for anything a row cannot show (time limit, memory,
    GPUs, features) nor blocked: what the fast grouping of ``_pending_part`` takes. Those fields
    never change once the job is queued."""

    def __post_init__(self) -> None:
        self.plain = self.array_id is None and not (self.time_limit or self.memory_mb or self.gpus or self.features
                                                    or self.blocked)

    def row(self) -> _Row:
        """Its pending row (not an array element), built once: of what a row shows only ``held``
        ever changes (``release``), and a row of the other ``held`` is built anew."""
        r = self.pending_row
        if r is None or (r.state == "held") != self.held:
            r = self.pending_row = _Row(self.job_id, self.cores, self.nodes, self.queue, self.submit_time,
                                        -self.submit_time, "held" if self.held else "queued", 1)
        return r


class SimulatedBatch:
    """The demo's batch system. Thread-safe: the demo submits from one thread while the sensor
    service reads and commands from another."""

    name = "simulated"

    def __init__(self, clock: Clock | None = None, *, nodes: dict[str, int] | None = None,
                 queue: str = "batch") -> None:
        self.clock = clock or RealClock()
        self.queue_name = queue
        self._lock = threading.RLock()
        self._nodes: dict[str, SimNode] = {}
        self._order: tuple[tuple[SimNode, ...], list[SimNode]] | None = None
        """The nodes (insertion order) and the same sorted by name, of the last snapshot."""
        self._infos: tuple[list[SimNode], list[str | None], list[NodeInfo], dict[str, int] | None] | None = None
        """The last snapshot's order, its nodes' instance ids, their records, and (once needed)
        each name's position in it (``_node_infos``)."""
        self._stale: set[str] = set()
        """Names of the nodes whose ``version`` moved since the last snapshot."""
        self._queue: list[SimJob] = []
        self._running: dict[str, SimJob] = {}
        self._ends: list[tuple[float, int, str]] = []  # (end_time, seq, job_id) heap
        self._seq = itertools.count()
        self._ids = itertools.count(1)
        self._now = self.clock.now()
        self._dirty = True
        """Something a scheduling pass reads changed since the last pass that started nothing
        (see ``_schedule``)."""
        self._full = False
        """No usable node had a free core when the last pass ended, and no node changed since
        (``_touch``, ``_add``): a pass would start nothing (see ``_schedule``)."""
        self._queue_version = 0
        """Moved by every change of the queue (a job queued, started, requeued, released): what
        says the kept queued part of the snapshot (``_Pending``) is still the queue's."""
        self._pending: _Pending | None = None
        self._free: dict[str, int] = {}
        """Free cores of every usable node (neither offline nor down), kept by ``_add``, ``_touch``
        and the removal of a node: what a scheduling pass starts from, without a sum over every
        node's jobs per pass (a pass runs after most node commands; only the touched node moved)."""
        self.submitted = 0
        self._completed = 0
        self.available = True
        self.unavailable_reason = "simulated batch server not responding"
        self.on_kill: list = []
        """Called with (job_id, node_name, why) when a running job loses its node (requeued)."""
        self.on_start: list = []
        """Called with the ``SimJob`` when it starts (``epu simulate`` measures waits)."""
        self.on_finish: list = []
        """Called with the ``SimJob`` when it completes."""
        self.group_at_source = False
        """Report pending work as shapes grouped here, with only a sample of per-job records
        (``Observation``'s contract for backends that group at the source): the shapes the sensor
        core would have grouped from every record, without building a ``QueuedJob`` per pending
        job per read. The simulators (``epu.sim.batch``) turn it on; tests of the job records
        keep every one."""
        self.sample_jobs = SAMPLE_JOBS
        """How many per-job records a snapshot keeps with ``group_at_source`` (for operators)."""
        for name, cores in (nodes or {}).items():
            self._add(name, cores)

    # ------------------------------------------------------------------ demo-facing API
    def submit(self, cores: int = 1, nodes: int = 1, duration: float = 60.0, count: int = 1,
               queue: str | None = None, hold: bool = False, time_limit: float = 0.0,
               job_id: str | None = None, memory_mb: int = 0, gpus: int = 0, features: tuple[str, ...] = (),
               blocked: str = "", account: str = "", user: str = "") -> list[str]:
        """Queue ``count`` jobs, each needing ``nodes`` nodes with ``cores`` free cores for
        ``duration`` seconds of clock time. ``count`` > 1 makes an array (ids ``N[i]``).
        ``job_id`` names a single job (a trace's job number); ``time_limit`` is its requested
        wall time (0 = none)."""
        if cores < 1 or nodes < 1 or count < 1 or duration < 0:
            raise ValueError("cores, nodes and count must be >= 1 and duration >= 0")
        with self._lock:
            self._advance()
            base = next(self._ids)
            ids = []
            for i in range(count):
                name = f"{base}[{i}]" if count > 1 else (job_id or str(base))
                self._queue.append(SimJob(name, cores, nodes, duration, self._now,
                                          queue or self.queue_name, held=hold,
                                          array_id=str(base) if count > 1 else None,
                                          time_limit=max(0.0, time_limit), memory_mb=memory_mb, gpus=gpus,
                                          features=frozenset(features), blocked=blocked,
                                          account=account, user=user))
                ids.append(name)
            self.submitted += count
            self._dirty = True
            self._queue_version += 1
            self._schedule()
            return ids

    def release(self, job_id: str) -> None:
        with self._lock:
            for job in self._queue:
                if job.job_id == job_id or job.array_id == job_id:
                    job.held = False
            self._dirty = True
            self._queue_version += 1
            self._schedule()

    @property
    def completed(self) -> int:
        with self._lock:
            self._advance()
            return self._completed

    @property
    def running(self) -> int:
        with self._lock:
            self._advance()
            return len(self._running)

    @property
    def queued(self) -> int:
        with self._lock:
            self._advance()
            return sum(1 for j in self._queue if not j.held and not j.blocked)

    def node_names(self) -> list[str]:
        with self._lock:
            return sorted(self._nodes)

    def node(self, name: str) -> SimNode | None:
        with self._lock:
            self._advance()
            return self._nodes.get(name)

    def fail_node(self, name: str) -> None:
        """The node's daemon dies: it goes down and its jobs are requeued."""
        with self._lock:
            self._advance()
            node = self._nodes[name]
            self._requeue_jobs_of(node, "node failed")
            node.down = True
            self._touch(node)

    def set_resources(self, name: str, *, memory_mb: int = 0, gpus: int = 0, features: tuple[str, ...] = (),
                      partitions: tuple[str, ...] = ()) -> None:
        """What a node offers beyond cores (a Slurm CLOUD slot's RealMemory, Gres, Features, partitions)."""
        with self._lock:
            node = self._nodes.get(name)
            if node is not None:
                node.memory_mb, node.gpus = memory_mb, gpus
                node.features, node.partitions = frozenset(features), frozenset(partitions)
                node.version += 1  # what its NodeInfo shows moved (``_node_info``)
                self._stale.add(name)
                self._dirty = True
                self._schedule()

    def add_node(self, name: str, cores: int, *, instance_id: str | None = None, up: bool = True) -> bool:
        """Create a node (``up=False``: known to the batch system, its daemon not registered
        yet). Returns False when it already exists."""
        with self._lock:
            self._advance()
            if name in self._nodes:
                return False
            self._add(name, cores, instance_id)
            if not up:
                node = self._nodes[name]
                node.down = True
                node.last_state = "down"
                self._free.pop(name, None)  # not usable: no free cores to offer
            self._schedule()
            return True

    def set_node_up(self, name: str, up: bool, why: str = "node daemon gone") -> None:
        """The node's daemon comes (back) up, or dies with its machine: down, jobs requeued."""
        with self._lock:
            self._advance()
            node = self._nodes.get(name)
            if node is None or node.down == (not up):
                return
            if not up:
                self._requeue_jobs_of(node, why)
            node.down = not up
            self._touch(node)
            if up:
                self._schedule()

    def set_available(self, available: bool, reason: str | None = None) -> None:
        """Make the batch server unreadable (``snapshot`` raises) — to exercise the sensor's
        ``available=False`` path."""
        with self._lock:
            self.available = available
            if reason:
                self.unavailable_reason = reason

    def advance(self) -> None:
        """Bring the cluster up to the clock's now (every other call does this too)."""
        with self._lock:
            self._advance()

    # ------------------------------------------------------------------ BatchBackend
    def snapshot(self) -> Observation:
        with self._lock:
            if not self.available:
                raise BackendUnavailable(self.unavailable_reason)
            self._advance()
            pending = self._pending_part()
            now = self._now
            nodes = self._node_infos(self._by_name())
            shapes = [JobShape(**fields, max_wait_s=max(0.0, now - earliest)) for fields, earliest in pending.shapes]
            jobs = [QueuedJob(job_id=r.job_id, cores=r.cores, nodes=r.nodes, queue=r.queue, submit_time=r.submit_time,
                              wait_seconds=max(0.0, now - r.submit_time), state=r.state,  # type: ignore[arg-type]
                              count=r.count)
                    for r in pending.rows]
            owners = {j.job_id: [j.account, j.user, j.queue] for j in self._running.values()
                      if j.account or j.user}
            return Observation(jobs=jobs, nodes=nodes, running_jobs=len(self._running),
                               finished_jobs=self._completed, shapes=shapes, owners=owners)

    def _by_name(self) -> list[SimNode]:
        """The nodes sorted by name; the last order again while the very same node objects are
        there in the same insertion order (the last order holds them, so no new node can reuse
        an old one's id)."""
        nodes = tuple(self._nodes.values())
        last = self._order
        if last is not None and len(last[0]) == len(nodes) and all(map(operator.is_, last[0], nodes)):
            return last[1]
        order = sorted(nodes, key=lambda n: n.name)
        self._order = (nodes, order)
        return order

    def _node_infos(self, order: list[SimNode]) -> list[NodeInfo]:
        """Every node's ``NodeInfo``, in ``order`` (a new list: an earlier one may still be held).

        While the order is the very list of the last read (the same node objects, ``_by_name``)
        and every node's ``instance_id`` the same object (it is also set from outside), only the
        nodes whose ``version`` moved since — ``_stale``: ``_touch`` and ``set_resources`` note
        them — can read differently; the others keep the last read's record. Otherwise each node
        is checked (``_node_info``'s test, inlined)."""
        ids = list(map(_INSTANCE_ID, order))
        last = self._infos
        stale = self._stale
        if last is not None and last[0] is order and all(map(operator.is_, last[1], ids)):
            infos, pos = list(last[2]), last[3]
            if stale:
                if pos is None:
                    pos = {n.name: i for i, n in enumerate(order)}
                for name in stale:
                    i = pos.get(name)
                    if i is not None:
                        infos[i] = self._node_info(order[i])
        else:
            infos, pos = [], None
            for n in order:
                r = n.reported
                infos.append(r[2] if r is not None and r[0] == n.version and r[1] is n.instance_id
                             else self._node_info(n))
        stale.clear()
        self._infos = (order, ids, infos, pos)
        return infos

    def _node_info(self, n: SimNode) -> NodeInfo:
        """What the batch system reports of ``n``: one pass over its jobs gives their ids, expected
        ends (start + time limit, 0 = no limit; sorted by job id) and the memory and GPUs they
        hold. A snapshot of every node is read every poll and most nodes did not change since the
        last one: the last ``NodeInfo`` (immutable) is reused while nothing it was built from moved.
        Every change of a node's jobs, state or resources moves ``SimNode.version`` (``_touch``,
        ``set_resources``; ``cores`` never changes, and a subclass sets resources only as the node
        is created, before any read); ``instance_id`` is also set from outside (``epu.sim.batch``),
        so it is compared itself (by identity: a new string is a new id, or the same one rebuilt)."""
        r = n.reported
        if r is not None and r[0] == n.version and r[1] is n.instance_id:
            return r[2]
        info = self._build_node_info(n)
        n.reported = (n.version, n.instance_id, info)
        return info

    def _build_node_info(self, n: SimNode) -> NodeInfo:
        ids = sorted(n.jobs)
        running = self._running
        ends: list[float] = []
        memory = gpus = 0
        for job_id in ids:
            job = running.get(job_id)
            if job is None:
                ends.append(0.0)
                continue
            ends.append(job.start_time + job.time_limit if job.time_limit and job.start_time is not None else 0.0)
            memory += job.memory_mb
            gpus += job.gpus
        state = n.state()
        return NodeInfo(name=n.name, state=state, cores=n.cores, cores_used=sum(n.jobs.values()),  # type: ignore[arg-type]
                        jobs=ids, state_since=n.state_since, native_state=state, instance_id=n.instance_id,
                        job_ends=ends, memory_mb=n.memory_mb, memory_used_mb=memory, gpus=n.gpus, gpus_used=gpus,
                        features=sorted(n.features), partitions=sorted(n.partitions))

    def _pending_part(self) -> _Pending:
        """The queued part of the snapshot but its waits (``_Pending``): the one kept, or built
        anew when the queue changed since."""
        kept = self._pending
        if kept is not None and kept.version == self._queue_version:
            return kept
        if self.group_at_source and all(map(_PLAIN, self._queue)):
            self._pending = self._plain_part()
            return self._pending
        rows: list[_Row] = []
        arrays: dict[tuple[str, bool], int] = {}
        first: dict[tuple[str, bool], SimJob] = {}
        for job in self._queue:
            if job.array_id is not None:
                key = (job.array_id, job.held)
                arrays[key] = arrays.get(key, 0) + 1
                first.setdefault(key, job)
                continue
            rows.append(job.row())
        for key, n in arrays.items():
            j = first[key]
            rows.append(_Row(f"{key[0]}[]", j.cores, j.nodes, j.queue, j.submit_time, -j.submit_time,
                             "held" if j.held else "queued", n))
        shapes = self._shapes() if any(j.time_limit or j.memory_mb or j.gpus or j.features or j.blocked
                                       for j in self._queue) else []
        if self.group_at_source:
            if not shapes and rows:
                # a row's "wait" is minus its submit time, so a shape's longest is minus its earliest
                shapes = [({k: v for k, v in s if k != "max_wait_s"}, -s.max_wait_s)
                          for s in group_jobs(rows)]  # type: ignore[arg-type] # the rows quack like QueuedJobs
            rows = rows[:self.sample_jobs]
        self._pending = _Pending(self._queue_version, rows, shapes)
        return self._pending

    def _plain_part(self) -> _Pending:
        """``_Pending`` of a queue of plain jobs (``SimJob.plain``), grouped at the source, without
        a Python step per job: the jobs sorted (stably) by what makes their rows' shape — nodes,
        cores, queue, held: exactly ``group_jobs``' key of such a row — and per group only its
        first three rows (the shape's sample ids) and one row standing for the others (their
        count, their earliest submit time) go to ``group_jobs``. It then finds the same shapes:
        the same partition, counts summing to the group's, the longest "wait" (minus the earliest
        submit time, see ``_Pending``) the group's, the ids its first three in queue order."""
        queue = self._queue
        few: list[_Row] = []
        rest: list[_Row] = []
        one = len(set(map(_ROW_SHAPE, queue))) == 1  # the usual case: no need to sort
        for jobs in ([queue] if one else (list(g) for _, g in itertools.groupby(sorted(queue, key=_ROW_SHAPE),
                                                                               _ROW_SHAPE))):
            few += [j.row() for j in jobs[:3]]
            if len(jobs) > 3:
                f, earliest = jobs[3], min(map(_SUBMIT, jobs[3:]))
                rest.append(_Row("", f.cores, f.nodes, f.queue, earliest, -earliest, f.row().state, len(jobs) - 3))
        shapes = [({k: v for k, v in s if k != "max_wait_s"}, -s.max_wait_s)
                  for s in group_jobs(few + rest)] if queue else []  # type: ignore[arg-type]
        return _Pending(self._queue_version, [j.row() for j in queue[:self.sample_jobs]], shapes)

    def _shapes(self) -> list[tuple[dict, float]]:
        """Pending jobs grouped with their time limits (only when some job has one: otherwise the
        sensor core groups ``jobs`` as before), each with its jobs' earliest submit time."""
        groups: dict[tuple, list] = {}
        for job in self._queue:
            key = (job.nodes, job.cores, job.queue, int(job.time_limit), not job.held and not job.blocked,
                   job.memory_mb, job.gpus, tuple(sorted(job.features)), job.blocked)
            g = groups.get(key)
            if g is None:
                groups[key] = [1, job.submit_time]
            else:
                g[0] += 1
                g[1] = min(g[1], job.submit_time)
        return [(dict(count=c, nodes=k[0], cores=k[1], partition=k[2], time_limit_s=k[3], demand=k[4],
                      reason="" if k[4] else (k[8] or "held"), memory_mb=k[5], gpus=k[6], features=list(k[7])), s)
                for k, (c, s) in sorted(groups.items(), key=lambda kv: repr(kv[0]))]

    def execute(self, action: str, node: str, *, cores: int | None = None, address: str | None = None,
                reason: str = "", force: bool = False, instance_id: str | None = None) -> CommandOutcome:
        check_action(action)
        with self._lock:
            existing, refused = self._command_target(node)
            if refused is not None:
                return refused
            if action == "add":
                if existing is not None:
                    if cores and existing.cores != cores:
                        return mismatched_add(node, existing.cores, cores)
                    if instance_id and existing.instance_id is None:
                        existing.instance_id = instance_id
                    return CommandOutcome(True, output=f"node {node} already exists")
                self._add(node, cores or 1, instance_id)
                self._schedule()
                return CommandOutcome(True, changed=True, output=f"node {node} added with {cores or 1} cores")
            if action in ("give_back", "release"):
                return CommandOutcome(False, error=f"{action}: this simulated batch system has no power saving")
            if existing is None:
                if action == "remove":
                    return CommandOutcome(True, output=f"node {node} does not exist (already removed)")
                return CommandOutcome(False, error=f"unknown node {node}", output=f"Unknown node {node}")
            if action == "offline":
                if existing.offline:
                    return CommandOutcome(True, output=f"node {node} already offline")
                existing.offline = True
                self._touch(existing)
                return CommandOutcome(True, changed=True, output=f"node {node} offline ({reason or 'no reason'})")
            if action == "online":
                if not existing.offline:
                    return CommandOutcome(True, output=f"node {node} already online")
                existing.offline = False
                self._touch(existing)
                self._schedule()
                return CommandOutcome(True, changed=True, output=f"node {node} online")
            # remove
            if existing.jobs and not force:
                return CommandOutcome(False, error=f"node {node} runs {len(existing.jobs)} job(s): "
                                                   "offline it and wait for them, or force",
                                      output=", ".join(sorted(existing.jobs)))
            self._requeue_jobs_of(existing, "node removed by force")
            del self._nodes[node]
            self._free.pop(node, None)
            self._dirty = True
            self._schedule()
            return CommandOutcome(True, changed=True, output=f"node {node} removed")

    def freeze_node(self, name: str) -> list[str]:
        """The node's machine died and the batch system has not noticed: its jobs stay counted
        as running there but never finish (until requeued, or the node is marked down)."""
        with self._lock:
            self._advance()
            node = self._nodes.get(name)
            if node is None:
                return []
            for job_id in node.jobs:
                job = self._running.get(job_id)
                if job is not None:
                    job.end_time = math.inf  # its heap entry goes stale: it never ends by itself
            self._dirty = True  # the head job's reservation moves
            return sorted(node.jobs)

    def restart_job(self, job_id: str) -> bool:
        """A frozen job's clock starts now (Slurm: a job allocated to nodes being powered up is
        CONFIGURING until they registered, then it runs its whole duration). False: not running."""
        with self._lock:
            self._advance()
            job = self._running.get(job_id)
            if job is None:
                return False
            job.start_time = self._now
            job.end_time = self._now + job.duration
            heapq.heappush(self._ends, (job.end_time, next(self._seq), job.job_id))
            self._dirty = True
            return True

    def evict_jobs(self, name: str, why: str) -> list[str]:
        """The batch system vacates the node's running jobs (an HTCondor drain whose retirement
        time is spent): they go back to the queue and ``on_kill`` hears ``why``."""
        with self._lock:
            self._advance()
            node = self._nodes.get(name)
            if node is None or not node.jobs:
                return []
            jobs = sorted(node.jobs)
            self._requeue_jobs_of(node, why)
            self._schedule()
            return jobs

    def requeue_jobs(self, node: str, reason: str = "") -> CommandOutcome:
        """Put the jobs running on ``node`` back at the head of the queue (its machine is gone:
        the cloud preempted it). ``on_kill`` hears why: ``requeued: ...``, never "by force"."""
        with self._lock:
            existing, refused = self._command_target(node)
            if refused is not None:
                return refused
            if existing is None or not existing.jobs:
                return CommandOutcome(True, output=f"no job on {node} to requeue")
            jobs = sorted(existing.jobs)
            existing.offline = True  # first, so the scheduler does not put them back there
            self._requeue_jobs_of(existing, f"requeued: {reason or 'node preempted'}")
            self._schedule()
            return CommandOutcome(True, changed=True, output=f"requeued {', '.join(jobs)}")

    # ------------------------------------------------------------------ internals
    def _command_target(self, node: str) -> tuple[SimNode | None, CommandOutcome | None]:
        """(the node, None), or (None, the refusal) while the controller is down. Under the lock."""
        check_node_name(node)
        if not self.available:
            return None, CommandOutcome(False, error=self.unavailable_reason, transient=True)
        self._advance()
        return self._nodes.get(node), None

    def _add(self, name: str, cores: int, instance_id: str | None = None) -> None:
        node = self._nodes[name] = SimNode(name, max(1, cores), state_since=self._now, instance_id=instance_id)
        self._free[name] = node.cores
        self._dirty = True
        self._full = False

    def _touch(self, node: SimNode) -> None:
        self._dirty = True  # offline/online, down/up, a job placed or gone: what a pass reads
        self._full = False  # its free cores may have changed
        node.version += 1
        self._stale.add(node.name)
        if node.offline or node.down:
            self._free.pop(node.name, None)
            state = "down" if node.down else "offline"
        else:
            free = self._free[node.name] = node.cores - sum(node.jobs.values())
            state = "free" if free > 0 else "busy"  # ``SimNode.state``: busy when used >= cores
        if state != node.last_state:
            node.last_state = state
            node.state_since = self._now

    def _advance(self) -> None:
        target = max(self._now, self.clock.now())
        while self._ends and self._ends[0][0] <= target:
            end, _, job_id = heapq.heappop(self._ends)
            job = self._running.get(job_id)
            if job is None or job.end_time != end:
                continue  # requeued meanwhile: stale heap entry
            self._now = max(self._now, end)
            self._finish(job)
            # everything else ending at the same instant first, then schedule once
            while self._ends and self._ends[0][0] <= end:
                _, _, other_id = heapq.heappop(self._ends)
                other = self._running.get(other_id)
                if other is not None and other.end_time is not None and other.end_time <= end:
                    self._finish(other)
            self._schedule()
        self._now = target
        self._schedule()

    def _finish(self, job: SimJob) -> None:
        del self._running[job.job_id]
        self._dirty = True
        for name in job.placed_on:
            node = self._nodes.get(name)
            if node is not None:
                node.jobs.pop(job.job_id, None)
                self._touch(node)
        self._completed += 1
        for fn in self.on_finish:
            fn(job)

    def _requeue_jobs_of(self, node: SimNode, why: str = "") -> None:
        for job_id in list(node.jobs):
            job = self._running.pop(job_id, None)
            if job is None:
                continue
            for fn in self.on_kill:
                fn(job_id, node.name, why)
            for name in job.placed_on:
                other = self._nodes.get(name)
                if other is not None:
                    other.jobs.pop(job_id, None)
                    self._touch(other)
            job.start_time = job.end_time = None
            job.placed_on = []
            self._queue.insert(0, job)
            self._queue_version += 1
        self._touch(node)

    def _used(self, node: SimNode, what: str) -> int:
        return sum(getattr(self._running[j], what) for j in node.jobs if j in self._running)

    def _serves(self, job: SimJob, name: str) -> bool:
        """Partition, features, memory and GPUs (cores are the caller's)."""
        node = self._nodes[name]
        if node.partitions and job.queue not in node.partitions:
            return False
        if not job.features <= node.features:
            return False
        if job.memory_mb and node.memory_mb and node.memory_mb - self._used(node, "memory_mb") < job.memory_mb:
            return False
        return not job.gpus or node.gpus - self._used(node, "gpus") >= job.gpus

    def _fit(self, job: SimJob, free: dict[str, int]) -> list[str] | None:
        """Nodes for ``job`` given free cores per usable node, fullest first (packing)."""
        candidates = sorted((c, name) for name, c in free.items() if c >= job.cores and self._serves(job, name))
        if len(candidates) < job.nodes:
            return None
        return [name for _, name in candidates[: job.nodes]]

    def _shadow_time(self, job: SimJob, free: dict[str, int]) -> float:
        """Earliest time the head job could start if nothing else starts (EASY reservation).

        The running jobs end one by one (by end time) and give their cores back; the job fits as
        soon as ``job.nodes`` usable nodes that serve it have ``job.cores`` free — ``_fit``'s test,
        kept as a count: a node's free cores only grow here, and whether it serves the job
        (``_serves``: partitions, features, memory, GPUs of the jobs running now) does not
        change during the walk, so it is asked once per node, not once per node per ended job."""
        need, cores = job.nodes, job.cores
        free = dict(free)
        serves: dict[str, bool] = {}
        fits = 0
        for name, c in free.items():
            if c >= cores:
                serves[name] = ok = self._serves(job, name)
                fits += ok
        for run in sorted(self._running.values(), key=lambda j: j.end_time or 0.0):
            for name in run.placed_on:
                c = free.get(name)
                if c is None:
                    continue
                after = c + self._nodes[name].jobs.get(run.job_id, 0)
                free[name] = after
                if c < cores <= after:
                    ok = serves.get(name)
                    if ok is None:
                        serves[name] = ok = self._serves(job, name)
                    fits += ok
            if fits >= need:
                return run.end_time or self._now
        return float("inf")

    def _schedule(self) -> None:
        """One FIFO + backfill pass over the queue, only when it can start something.

        Why passes are skipped: a pass reads the queue, the nodes (usable, free cores, resources)
        and the running jobs (their end times make the head job's reservation), plus ``now`` in
        the backfill test ``now + duration <= shadow``. If none of the first changed since a pass
        that started nothing, this pass starts nothing either: fits are the same, the reservation
        is the same, and a later ``now`` only makes backfill harder. So every mutation sets
        ``_dirty`` (``_touch``, ``_add``, ``_finish``...), a pass that started a job leaves it set
        (its starts changed what the next pass reads), and a clean call returns at once. Within a
        pass free capacity only shrinks, so a request shape that did not fit stays unfit until
        the pass ends (``unfit``), and nodes without a free core are never candidates (``avail``):
        once none is left, the rest of the queue stays as it is (each job would be unfit and kept).
        Free cores change only with a node (``_touch``, ``_add``; a removed node only takes them
        away): while none changed since a pass ended with none free (``_full``), a pass, even
        one a queue change asked for, would find none and start nothing.
        The head job's reservation (``_shadow_time``, a walk over the running jobs) is only
        computed when a later job could start now (most passes have none): it is the same number
        as when the head job blocked, as nothing starts in between (a start needs it) and the
        free cores, the running jobs and ``now`` are what they were then.
        The placements are exactly those of the full re-fit (tests/sensor/test_simulated_kept.py,
        the replay digests of tests/sim)."""
        if not self._dirty:
            return
        self._dirty = False  # a start below sets it again
        if not self._queue or self._full:
            return
        free = dict(self._free)
        avail = {name: c for name, c in free.items() if c > 0}
        if not avail:
            self._full = True
            return  # every job needs at least one core
        unfit: set[tuple] = set()
        head: SimJob | None = None
        shadow: float | None = None
        remaining: list[SimJob] = []
        queue = self._queue
        for i, job in enumerate(queue):
            if not avail:  # no free core left: every job from here on stays queued, in order
                remaining.extend(queue[i:])
                break
            if job.held or job.blocked:
                remaining.append(job)
                continue
            key = (job.cores, job.nodes, job.queue, job.features, job.memory_mb, job.gpus)
            placement = None if key in unfit or len(avail) < job.nodes else self._fit(job, avail)
            if placement is not None and head is not None and shadow is None:
                shadow = self._shadow_time(head, free)  # nothing started since ``head`` blocked
            if placement is None:
                unfit.add(key)
            elif head is None or self._now + job.duration <= shadow:  # type: ignore[operator]
                self._start(job, placement)
                for name in placement:
                    free[name] -= job.cores
                    left = avail[name] - job.cores
                    if left > 0:
                        avail[name] = left
                    else:
                        del avail[name]
                continue
            if head is None:  # first job that cannot start: it holds the reservation
                head = job
            remaining.append(job)
        if not avail:
            self._full = True  # what the next pass would find first, unless a node changes
        if len(remaining) != len(self._queue):  # a subsequence: the same length is the same queue
            self._queue_version += 1
        self._queue = remaining

    def _start(self, job: SimJob, placement: list[str]) -> None:
        job.start_time = self._now
        job.end_time = self._now + job.duration
        job.placed_on = placement
        self._running[job.job_id] = job
        self._dirty = True
        for name in placement:
            node = self._nodes[name]
            node.jobs[job.job_id] = job.cores
            self._touch(node)
        heapq.heappush(self._ends, (job.end_time, next(self._seq), job.job_id))
        for fn in self.on_start:
            fn(job)
