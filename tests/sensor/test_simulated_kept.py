"""The simulated batch's kept state is exact: over random sequences of submissions, releases,
node commands, failures, requeues and time, its snapshot (the queued part kept between reads
and only aged, the node records reused) equals one rebuilt from scratch, and its scheduler
(passes skipped while nothing changed, a pass cut short once no core is free) places every job
where a full re-fit at every call does.

The snapshot a sensor publishes is what the engine's terminate decisions read: a kept part that
showed an idle node running a job, or missed a change of the queue, would be a safety bug."""

from __future__ import annotations

import random

import pytest
from epu.common.clock import ManualClock
from epu.common.messages import JobShape, NodeInfo, QueuedJob, group_jobs
from epu.services.sensor.backend import Observation
from epu.services.sensor.simulated import SAMPLE_JOBS, SimJob, SimulatedBatch


class FullRefit(SimulatedBatch):
    """The reference scheduler: one FIFO + backfill pass over the whole queue at every call, each
    reservation re-fitted from nothing."""

    def _schedule(self) -> None:
        if not self._queue:
            return
        free = {n.name: n.free_cores for n in self._nodes.values() if n.usable()}
        shadow: float | None = None
        remaining: list[SimJob] = []
        for job in self._queue:
            if job.held or job.blocked:
                remaining.append(job)
                continue
            placement = self._fit(job, {k: v for k, v in free.items() if v > 0})
            if placement is not None and (shadow is None or self._now + job.duration <= shadow):
                self._start(job, placement)
                for name in placement:
                    free[name] -= job.cores
                continue
            if shadow is None:
                shadow = self._shadow_time(job, free)
            remaining.append(job)
        if len(remaining) != len(self._queue):
            self._queue_version += 1
        self._queue = remaining

    def _shadow_time(self, job: SimJob, free: dict[str, int]) -> float:
        """The reservation as first written: a full ``_fit`` after each running job ends (the
        kept scheduler counts the nodes that come to fit instead)."""
        free = dict(free)
        for run in sorted(self._running.values(), key=lambda j: j.end_time or 0.0):
            for name in run.placed_on:
                if name in free:
                    free[name] += self._nodes[name].jobs.get(run.job_id, 0)
            if self._fit(job, free) is not None:
                return run.end_time or self._now
        return float("inf")


def rebuilt(b: SimulatedBatch) -> tuple[list[QueuedJob], list[JobShape], list[NodeInfo]]:
    """The snapshot's jobs, shapes and nodes built from the batch's state at its ``now``, from
    nothing kept (the code before the queued part was kept)."""
    now = b._now
    rows: list[QueuedJob] = []
    arrays: dict[tuple[str, bool], list[SimJob]] = {}
    for job in b._queue:
        if job.array_id is not None:
            arrays.setdefault((job.array_id, job.held), []).append(job)
            continue
        rows.append(QueuedJob(job_id=job.job_id, cores=job.cores, nodes=job.nodes, queue=job.queue,
                              submit_time=job.submit_time, wait_seconds=max(0.0, now - job.submit_time),
                              state="held" if job.held else "queued", count=1))
    for (array_id, held), jobs in arrays.items():
        first = jobs[0]
        rows.append(QueuedJob(job_id=f"{array_id}[]", cores=first.cores, nodes=first.nodes, queue=first.queue,
                              submit_time=first.submit_time, wait_seconds=max(0.0, now - first.submit_time),
                              state="held" if held else "queued", count=len(jobs)))
    shapes: list[JobShape] = []
    if any(j.time_limit or j.memory_mb or j.gpus or j.features or j.blocked for j in b._queue):
        groups: dict[tuple, list] = {}
        for job in b._queue:
            key = (job.nodes, job.cores, job.queue, int(job.time_limit), not job.held and not job.blocked,
                   job.memory_mb, job.gpus, tuple(sorted(job.features)), job.blocked)
            wait = max(0.0, now - job.submit_time)
            g = groups.setdefault(key, [0, wait])
            g[0] += 1
            g[1] = max(g[1], wait)
        shapes = [JobShape(count=c, nodes=k[0], cores=k[1], partition=k[2], time_limit_s=k[3], demand=k[4],
                           reason="" if k[4] else (k[8] or "held"), max_wait_s=w, memory_mb=k[5], gpus=k[6],
                           features=list(k[7]))
                  for k, (c, w) in sorted(groups.items(), key=lambda kv: repr(kv[0]))]
    if b.group_at_source:
        if not shapes and rows:
            shapes = group_jobs(rows)
        rows = rows[:b.sample_jobs]
    nodes = [b._build_node_info(n) for n in sorted(b._nodes.values(), key=lambda n: n.name)]
    return rows, shapes, nodes


def observed(obs: Observation) -> tuple:
    return obs.jobs, obs.shapes, obs.nodes, obs.running_jobs, obs.finished_jobs


def step(rng: random.Random, clock: ManualClock, batches: list[SimulatedBatch], ids: list[str],
         plain: bool = False) -> None:
    """One random operation, the same on every batch (``plain``: only jobs a row can show, no
    arrays — the simulators' workloads)."""
    op = rng.random()
    names = sorted(batches[0]._nodes)
    if op < 0.25:
        kw = dict(cores=rng.randint(1, 4), nodes=rng.choice((1, 1, 1, 2)), duration=rng.choice((30.0, 90.0, 600.0)),
                  count=rng.choice((1, 1, 3)), hold=rng.random() < 0.15,
                  time_limit=rng.choice((0.0, 0.0, 0.0, 900.0)), memory_mb=rng.choice((0, 0, 0, 1000)),
                  gpus=rng.choice((0, 0, 0, 0, 1)), features=rng.choice(((), (), (), ("ssd",))),
                  blocked=rng.choice(("",) * 12 + ("QOSMaxJobsPerUserLimit",)), queue=rng.choice((None, None, "gpu")))
        if plain:
            kw.update(count=1, time_limit=0.0, memory_mb=0, gpus=0, features=(), blocked="")
        for b in batches:
            got = b.submit(**kw)  # type: ignore[arg-type]
        ids.extend(got)
    elif op < 0.32 and ids:
        job = rng.choice(ids)
        for b in batches:
            b.release(job.split("[")[0])
    elif op < 0.42:
        name, cores = f"n{rng.randint(0, 9)}", rng.choice((2, 4, 8))
        up = rng.random() < 0.7
        for b in batches:
            b.add_node(name, cores, instance_id=f"i-{name}", up=up)
    elif op < 0.50 and names:
        name, up = rng.choice(names), rng.random() < 0.6
        for b in batches:
            b.set_node_up(name, up)
    elif op < 0.56 and names:
        name = rng.choice(names)
        kind = dict(memory_mb=rng.choice((0, 2000)), gpus=rng.choice((0, 1)), features=rng.choice(((), ("ssd",))),
                    partitions=rng.choice(((), ("batch",), ("gpu", "batch"))))
        for b in batches:
            b.set_resources(name, **kind)  # type: ignore[arg-type]
    elif op < 0.66 and names:
        name = rng.choice(names)
        action = rng.choice(("offline", "online", "remove", "remove"))
        force = rng.random() < 0.5
        for b in batches:
            b.execute(action, name, force=force)
    elif op < 0.70 and names:
        name = rng.choice(names)
        for b in batches:
            b.requeue_jobs(name, "preempted")
    elif op < 0.73 and names:
        name = rng.choice(names)
        for b in batches:
            b.freeze_node(name)
    elif op < 0.76 and names:
        name = rng.choice(names)
        for b in batches:
            b.fail_node(name)
    else:
        clock.advance(rng.choice((0.0, 1.0, 15.0, 60.0, 60.0, 300.0)))


@pytest.mark.parametrize(("group_at_source", "plain"), [(True, True), (True, False), (False, False)])
@pytest.mark.parametrize("seed", range(6))
def test_kept_snapshot_and_skipped_passes_equal_the_full_rebuild(seed: int, group_at_source: bool, plain: bool) -> None:
    rng = random.Random(seed)
    clock = ManualClock(1000.0)
    kept, full = SimulatedBatch(clock), FullRefit(clock)
    for b in (kept, full):
        b.group_at_source = group_at_source
        b.sample_jobs = 0 if seed % 2 else SAMPLE_JOBS  # the simulators keep none
    ids: list[str] = []
    reads = 0
    for _ in range(400):
        step(rng, clock, [kept, full], ids, plain)
        if rng.random() < 0.5:
            obs = kept.snapshot()
            reads += 1
            assert observed(obs) == observed(full.snapshot())
            assert (obs.jobs, obs.shapes, obs.nodes) == rebuilt(kept)
            idle = {n.name for n in obs.nodes if not n.jobs}
            assert all(not kept._nodes[name].jobs for name in idle)  # an idle node in the snapshot runs nothing
        assert {j: job.placed_on for j, job in kept._running.items()} == \
               {j: job.placed_on for j, job in full._running.items()}
        assert [j.job_id for j in kept._queue] == [j.job_id for j in full._queue]
    assert reads > 100 and kept.submitted > 50 and kept.completed > 0


def test_a_shape_waits_as_long_as_its_earliest_job_wherever_it_is_queued() -> None:
    """Requeued jobs go back to the head of the queue: the earliest submitted job of a shape may
    come after them; the shape's longest wait is still its own (the kept part and the rebuild)."""
    clock = ManualClock(1000.0)
    b = SimulatedBatch(clock)
    b.group_at_source = True
    (early,) = b.submit(cores=1, duration=600, hold=True)            # t=1000, held
    clock.advance(100)
    b.add_node("n", 4)
    later = [b.submit(cores=1, duration=600)[0] for _ in range(4)]  # t=1100: all four run on n
    b.release(early)                                                 # queued now, n is full
    clock.advance(50)
    assert b.requeue_jobs("n", "preempted").ok                        # the four go back to the head
    clock.advance(10)
    snap = b.snapshot()
    assert [j.job_id for j in snap.jobs] == [*reversed(later), early]
    (shape,) = snap.shapes
    assert (shape.count, shape.max_wait_s, shape.sample_job_ids) == (5, 160.0, list(reversed(later))[:3])
    assert (snap.jobs, snap.shapes, snap.nodes) == rebuilt(b)
