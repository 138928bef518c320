"""Feed a workload into the simulated batch backend of a running sensor (``epu run sensor``).

Why: a multi-process deployment on RabbitMQ with the simulated batch backend had an empty
queue — nothing outside the demo could put a job into it. With ``[sensor.options] workload``
the sensor's simulated cluster replays a trace or a generator (the same inputs as
``epu simulate``), in real time or sped up::

    [sensor]
    backend = "simulated"
    [sensor.options]
    workload = "/data/NASA-iPSC-1993-3.1-cln.swf.gz"   # a trace file, or a generator spec:
    # workload = "burst:jobs=64,duration=600"
    workload_speed = 60          # 60x faster than recorded: submits, run times and limits / 60
    workload_window_days = 1     # optional: only this many days (from workload_start_day)
    workload_start_day = 0
    workload_cores_per_node = 4  # how SWF processors become nodes x cores (default node_cores)

Each job is submitted at its own (scaled) submit time, not at the next poll: before every read
or command of the batch system, the jobs due by now are submitted one by one with the batch
system's clock pinned to each job's submit time, so their waits are exact.
"""

from __future__ import annotations

import logging
from typing import Any

from epu.common.clock import Clock, RealClock
from epu.common.config import EpuConfig
from epu.services.sensor.backend import CommandOutcome, Observation
from epu.services.sensor.simulated import SimulatedBatch
from epu.workloads import transform
from epu.workloads.generators import GENERATORS, generate
from epu.workloads.load import load_trace
from epu.workloads.model import Workload, WorkloadError

log = logging.getLogger("epu.sensor.feed")


class PinnableClock:
    """The real clock, except while a job is being submitted at its own time."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.pinned: float | None = None

    def now(self) -> float:
        return self.pinned if self.pinned is not None else self.clock.now()

    def monotonic(self) -> float:
        return self.clock.monotonic()

    def sleep(self, seconds: float) -> None:
        self.clock.sleep(seconds)


class WorkloadFeed:
    """Submits a workload's jobs into a ``SimulatedBatch`` as (scaled) time passes."""

    def __init__(self, batch: SimulatedBatch, clock: PinnableClock, workload: Workload, *, speed: float = 1.0,
                 cores_per_node: int = 1, start: float | None = None) -> None:
        if speed <= 0:
            raise WorkloadError(f"workload_speed must be > 0 (got {speed})")
        self.batch = batch
        self.clock = clock
        self.speed = speed
        self.start = clock.clock.now() if start is None else start
        first = workload.jobs[0].submit if workload.jobs else 0.0
        self.jobs = [(self.start + (j.submit - first) / speed, j) for j in workload.jobs]
        self.cores_per_node = cores_per_node
        self.next = 0

    @property
    def done(self) -> bool:
        return self.next >= len(self.jobs)

    def tick(self) -> int:
        """Submit every job due by now; returns how many."""
        now = self.clock.clock.now()
        n = 0
        try:
            while self.next < len(self.jobs) and self.jobs[self.next][0] <= now:
                at, job = self.jobs[self.next]
                nodes, cores = job.shape(self.cores_per_node)
                self.clock.pinned = at
                self.batch.submit(cores=cores, nodes=nodes, duration=job.run / self.speed,
                                  time_limit=job.time_limit / self.speed, job_id=f"w{job.job_id}")
                self.next += 1
                n += 1
        finally:
            self.clock.pinned = None
        return n


class FedBatch:
    """A ``BatchBackend``: the simulated batch system, fed by a workload before every use."""

    name = "simulated"

    def __init__(self, batch: SimulatedBatch, feed: WorkloadFeed) -> None:
        self.batch = batch
        self.feed = feed

    def snapshot(self) -> Observation:
        self.feed.tick()
        return self.batch.snapshot()

    def execute(self, action: str, node: str, **kwargs: Any) -> CommandOutcome:
        self.feed.tick()
        return self.batch.execute(action, node, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.batch, name)


def workload_from_options(opts: dict[str, Any]) -> Workload:
    spec = str(opts["workload"])
    name = spec.partition(":")[0]
    if name in GENERATORS:
        w = generate(spec, seed=int(opts.get("workload_seed", 1)))
    else:
        w = load_trace(spec, str(opts.get("workload_format", "auto")))
    days = opts.get("workload_window_days")
    start = float(opts.get("workload_start_day", 0.0))
    if days is not None or start:
        w = transform.window(w, start, float(days) if days is not None else None)
    return w


def fed_backend(config: EpuConfig, clock: Clock) -> FedBatch:
    """The simulated backend of ``[sensor.options]`` with its workload feed."""
    from epu.services.sensor.factory import make_backend

    opts = config.sensor.options
    pin = PinnableClock(clock)
    batch = make_backend(config.sensor, pin)  # type: ignore[arg-type]
    assert isinstance(batch, SimulatedBatch)
    w = workload_from_options(opts)
    cpn = int(opts.get("workload_cores_per_node", opts.get("node_cores", 1)))
    feed = WorkloadFeed(batch, pin, w, speed=float(opts.get("workload_speed", 1.0)), cores_per_node=cpn)
    log.info("feeding a workload", extra={"workload": w.name, "jobs": len(w.jobs), "speed": feed.speed})
    return FedBatch(batch, feed)


def build_sensor(config: EpuConfig, *, clock: Clock | None = None, **kwargs: Any) -> Any:
    """``epu run sensor``: the sensor service, fed by ``[sensor.options] workload`` when the
    backend is the simulated one and a workload is configured."""
    from epu.services.sensor.app import build_service

    clock = clock or RealClock()
    sc = config.sensor
    if sc.backend == "simulated" and sc.options.get("workload") and "backend" not in kwargs:
        try:
            kwargs["backend"] = fed_backend(config, clock)
        except (WorkloadError, OSError) as exc:
            raise SystemExit(f"epu run sensor: [sensor.options] workload: {exc}") from None
    return build_service(config, clock=clock, **kwargs)
