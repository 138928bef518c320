"""One simulation: an operator's config, a workload and a cloud model, in virtual time.

What runs is the production code: the decision engine (policies, planner, placement, store),
the provisioner (state machine, store, poll, reconcile) and the sensor core, wired by
``epu.sim`` to a simulated batch system and simulated clouds on one virtual clock (the
deterministic world of the fault simulator, with every fault off). This module only composes
those parts for the config it is given, feeds the workload into the batch system at each job's
submit time, and watches: every job's start and end (waits), every instance's life (node-hours
and cost under the site's billing), and a sampled timeline for the plots.

When the run ends: once every job has completed and the domain is back to ``min_nodes`` live
instances — or ``tail_seconds`` (1 hour) after the last job completed, whichever comes first (a
policy that keeps spare nodes pays for them until then). Costs count every instance's life up to
its termination or the end of the run.

Why the engine may skip iterations (``skip_idle``, on by default): a month of a trace is half a
million 5-second iterations, nearly all of which see the same snapshot and decide nothing.
``fastpath.LazyEngineProc`` runs an iteration only when an input arrived since the last one,
the last one acted, or a time threshold of the policy may have been crossed — and the tests
check that a run with skipping makes the same decisions at the same times as one without.
"""

from __future__ import annotations

import gc
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from epu.common.config import EpuConfig, parse_config
from epu.services.decision.policies import POLICIES, PolicyError, validate_params
from epu.services.sensor.simulated import SimulatedBatch
from epu.sim.batch import SimBatchSystem
from epu.sim.bus import Bus
from epu.sim.cloud import VM, CloudFaults, SimCloud
from epu.sim.decision_memstore import MemoryDecisionDatabase
from epu.sim.processes import EngineProc, ProvisionerProc, SensorProc, StoreFaults, release_store
from epu.sim.simulation import quiet_loggers
from epu.sim.world import World, WorldClock
from epu.simulate.assumptions import effective_model, run_warnings
from epu.simulate.cloudmodel import CloudModel, SiteModel
from epu.workloads.model import TraceJob, Workload


class SimulateError(ValueError):
    """A config, workload or option combination that cannot be simulated; says why."""


@dataclass
class Options:
    seed: int = 1
    domain: str | None = None
    """Which domain of the config to drive (default: the only or first one)."""
    policy: str | None = None
    """Run this policy instead of the domain's."""
    params: dict[str, Any] | None = None
    """Policy parameters (merged over the domain's when the policy is the same)."""
    estimate: str = "trace"
    """Time limits jobs carry: ``trace`` (the workload's requested time, else none), ``exact``
    (each job's run time: a perfect user), ``none``."""
    sample_seconds: float | None = None
    """Timeline step (default: about 3,000 samples over the run, at least 30 s)."""
    tail_seconds: float = 3600.0
    """After the last job completes, the run ends once the domain is back to min_nodes, or after this."""
    skip_idle: bool = True
    progress: Callable[[float, float, int, int], None] | None = None
    """Called every simulated hour with (simulated seconds, expected total, jobs done, jobs)."""


@dataclass
class JobRecord:
    job_id: str
    submit: float
    run: float
    nodes: int
    cores: int
    start: float | None = None
    end: float | None = None
    starts: int = 0


@dataclass
class Sample:
    t: float
    queued_jobs: int
    running_jobs: int
    cores_used: int
    nodes: dict[str, int]
    instances: dict[str, tuple[int, int]]
    """site → (live, booting)."""


@dataclass
class RunData:
    """Everything measured in one run (``report.summarize`` turns it into figures)."""

    config: EpuConfig
    domain: str
    policy: str
    workload: Workload
    cloud: CloudModel
    seed: int
    jobs: list[JobRecord]
    vms: dict[str, list[VM]]
    """site → every VM the run created."""
    samples: list[Sample]
    start: float
    end: float
    skipped: dict[str, int]
    digest: str
    events: int
    iterations: int
    iterations_skipped: int
    wall_seconds: float
    cpu_seconds: float
    cloud_errors: int
    engine_cpu_seconds: float = 0.0
    jobs_killed: int = 0
    """Running jobs that lost their node (requeued by the batch system): 0 is the safety claim."""
    sizes: dict[str, str] = field(default_factory=dict)
    cores: dict[str, int] = field(default_factory=dict)
    cloud_sources: dict[str, str] = field(default_factory=dict)
    """site → where its cloud model came from (``assumptions.SOURCES``)."""
    warnings: list[str] = field(default_factory=list)
    """What the operator should know before trusting the figures (``assumptions.run_warnings``)."""
    occupancy: list[tuple[str, float, float | None, str]] = field(default_factory=list)
    """(VM cloud id, start, end or None, job id): each job on each VM it ran on (cost accounting)."""
    owners: dict[str, tuple[str, str, str]] = field(default_factory=dict)
    """Job id → (account, user, partition) from the trace."""


# ---------------------------------------------------------------------- config


def simulation_config(config: EpuConfig, domain: str, workdir: str, options: Options) -> EpuConfig:
    """The operator's config with what cannot run here replaced: stores in ``workdir``, every
    site of the domain a simulated cloud (same quota, price, cores, size), no userdata file."""
    data = config.model_dump(mode="python", by_alias=True)
    data.pop("workers", None)  # what workers are told at boot: files of the real hosts, unused here
    data["decision"]["store_url"] = "sqlite://"  # in memory: one process, no restart
    data["provisioner"]["store_url"] = "sqlite://"
    for _name, site in data["sites"].items():
        # what only a real cloud's driver takes goes; what decides placement and cost stays
        site.update(driver="epu-sim", driver_args={}, credentials_file=None, userdata_template=None,
                    location=None, keypair=None, security_groups=[], create_args={})
        site["image"] = site.get("image") or "sim-image"
        site["size"] = site.get("size") or f"sim.{site.get('cores', 1)}core"
    dom = data["domains"][domain]
    if options.policy:
        if options.policy != dom["policy"]:
            dom["params"] = {}
        dom["policy"] = options.policy
    if options.params:
        dom["params"] = {**dom["params"], **options.params}
    if dom["policy"] in POLICIES and "experimental" in POLICIES[dom["policy"]].params.model_fields:
        dom["params"] = {**dom["params"], "experimental": True}  # evaluating it is what simulate is for
    dom["paused"] = False
    for key in ("metrics_port",):
        for section in ("decision", "provisioner", "sensor"):
            data[section].pop(key, None)
    return parse_config(data, "simulation config", environ={})


def pick_domain(config: EpuConfig, wanted: str | None) -> str:
    if not config.domains:
        raise SimulateError("the config has no [domains.NAME] section: nothing to simulate")
    if wanted is None:
        if config.sensor.domain in config.domains:
            return config.sensor.domain
        return next(iter(config.domains))
    if wanted not in config.domains:
        raise SimulateError(f"no domain {wanted!r} in the config (domains: {', '.join(config.domains)})")
    return wanted


def domain_sites(config: EpuConfig, domain: str) -> list[str]:
    sites = config.domains[domain].sites or list(config.sites)
    missing = [s for s in sites if s not in config.sites]
    if missing:
        raise SimulateError(f"domains.{domain}.sites names unknown site(s): {', '.join(missing)}")
    if not sites:
        raise SimulateError(f"domain {domain} has no site to launch on (add a [sites.NAME] section)")
    return sites


# ---------------------------------------------------------------------- the run


@contextmanager
def _no_automatic_gc() -> Iterator[None]:
    """Python's cyclic collector off while the world runs; the caller collects the young
    generations once per simulated hour. Why: a run's heap grows with its history (every
    instance record, transition and action row a month makes stays), and the automatic full
    collections walk all of it again and again — ~10 % of a 5-day run's CPU, more the longer
    the run — to find almost nothing: the cores free what they drop by reference counting (a
    5-day run's collections found ~1,500 objects in cycles). Results cannot change: nothing in
    a run depends on when memory is reclaimed (the replay tests run in separate processes)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class LatencyProvisioner(ProvisionerProc):
    """A provisioner whose cloud tasks wait each site's own API latency."""

    site_latency: dict[str, Callable[[], float]] = {}

    def _scheduler(self, site: str) -> Callable[[Callable[[], None], str], None]:
        latency = self.site_latency[site]

        def schedule(task: Callable[[], None], what: str) -> None:
            self.later(latency() if what == "task" else 0.0, task, f"{self.name} {site} {what}")

        return schedule


def node_counts(inner: SimulatedBatch) -> tuple[dict[str, int], int]:
    """Nodes per state (in the order the states first occur over the nodes) and the cores in use,
    as ``SimNode.state()`` and ``SimNode.used`` say, every sample: a usable node's free cores are
    the batch's kept ``_free`` (its used cores ``cores - free``, busy when none is free), so only
    an offline or down node's jobs are summed."""
    nodes: dict[str, int] = {}
    cores_used = 0
    free = inner._free
    for n in inner._nodes.values():
        f = free.get(n.name)
        if f is None:  # offline or down
            used = sum(n.jobs.values())
            s = "down" if n.down else "offline"
        else:
            used = n.cores - f
            s = "busy" if f <= 0 else "free"
        nodes[s] = nodes.get(s, 0) + 1
        cores_used += used
    return nodes, cores_used


class Simulate:
    def __init__(self, config: EpuConfig, workload: Workload, cloud: CloudModel | None = None,
                 options: Options | None = None) -> None:
        self.options = options or Options()
        self.cloud_model = cloud or CloudModel()
        self.domain = pick_domain(config, self.options.domain)
        self.workload = workload
        if not workload.jobs:
            raise SimulateError("the workload has no job")
        base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        self.workdir = tempfile.mkdtemp(prefix="epu-simulate-", dir=base)
        try:
            self.config = simulation_config(config, self.domain, self.workdir, self.options)
        except Exception:
            shutil.rmtree(self.workdir, ignore_errors=True)
            raise
        self.dcfg = self.config.domains[self.domain]
        try:
            validate_params(self.dcfg.policy, self.dcfg.params)
        except PolicyError as exc:
            shutil.rmtree(self.workdir, ignore_errors=True)
            raise SimulateError(f"domains.{self.domain}: {exc}") from None
        self.sites = domain_sites(self.config, self.domain)
        # each site's model: --cloud, else its own knobs in the operator's config, else the default
        self.cloud_model, self.cloud_sources = effective_model(config, self.sites, self.cloud_model)
        self.warnings = run_warnings(self.config, self.domain, self.cloud_model, self.cloud_sources)
        self.world = World(self.options.seed)
        self.bus = Bus(self.world)
        self.clouds: dict[str, SimCloud] = {}
        for name in self.sites:
            m = self.cloud_model.site(name)
            faults = CloudFaults(transient_error_rate=m.api_error_rate, boot_failure_rate=m.boot_failure_rate,
                                 never_boot_rate=m.never_boot_rate)
            cloud = SimCloud(self.world, name, quota=m.capacity_at(0.0), faults=faults, boot_time=m.boot.sampler())
            cloud.on_running.append(self._vm_running)
            cloud.on_gone.append(self._vm_gone)
            self.clouds[name] = cloud
        self.batch = SimBatchSystem(self.world, WorldClock(self.world), flavor="slurm")
        self.batch.default_cores = self.dcfg.cores_per_node
        self.batch.inner.on_start.append(self._job_started)
        self.batch.inner.on_finish.append(self._job_finished)
        db = MemoryDecisionDatabase()  # the engine's store in memory (epu.sim.decision_memstore)
        self.decision_db = db
        engine_cls = EngineProc
        if self.options.skip_idle:
            from epu.sim.fastpath import LazyEngineProc

            engine_cls = LazyEngineProc
        self.engine = engine_cls(self.world, self.bus, "engine", self.config, db, StoreFaults())
        latency = {n: self._latency(n, self.cloud_model.site(n)) for n in self.sites}
        prov = LatencyProvisioner(self.world, self.bus, "provisioner", self.config,
                                  self.config.provisioner.store_url, self.clouds, StoreFaults(), lambda: 0.0,
                                  databases={})
        prov.site_latency = latency
        self.provisioner = prov
        self.sensor = SensorProc(self.world, self.bus, "sensor", self.domain, self.batch,
                                 self.config.sensor.poll_seconds)
        self.records: dict[str, JobRecord] = {}
        self.occupancy: list[tuple[str, float, float | None, str]] = []
        self._open_jobs: dict[str, list[int]] = {}
        self.owners = {j.job_id: (j.account, j.user, j.queue) for j in workload.jobs}
        self.samples: list[Sample] = []
        self.skipped: dict[str, int] = dict(workload.skipped)
        self._todo = self._admit(workload.jobs)
        self._next = 0
        self.completed = 0
        self.last_completion = self.world.start
        self.done_at: float | None = None

    # ------------------------------------------------------------------ building
    def _latency(self, site: str, m: SiteModel) -> Callable[[], float]:
        draw = m.api_latency.sampler()
        rng = self.world.rng(f"api/{site}")
        return lambda: draw(rng)

    def _admit(self, jobs: list[TraceJob]) -> list[tuple[TraceJob, int, int, float]]:
        """(job, nodes, cores, time limit) for every job the domain can ever run; the others are
        counted in ``skipped`` (a job wider than max_nodes would wait forever)."""
        out = []
        cpn, most = self.dcfg.cores_per_node, self.dcfg.max_nodes
        seen: set[str] = set()
        for j in jobs:
            nodes, cores = j.shape(cpn)
            if nodes > most:
                why = f"needs more than max_nodes={most} nodes of {cpn} cores"
                self.skipped[why] = self.skipped.get(why, 0) + 1
                continue
            limit = {"exact": j.run, "none": 0.0}.get(self.options.estimate, j.time_limit)
            jid = j.job_id
            while jid in seen:
                jid += "+"
            seen.add(jid)
            out.append((TraceJob(jid, j.submit, j.run, j.procs, j.nodes, j.time_limit), nodes, cores, limit))
        if not out:
            raise SimulateError("no job of the workload fits the domain "
                                f"(max_nodes={most}, cores_per_node={cpn}): {self.skipped}")
        return out

    # ------------------------------------------------------------------ links
    def _vm_running(self, vm: VM) -> None:
        if vm.domain == self.domain:
            self.batch.vm_running(vm)

    def _vm_gone(self, vm: VM, cause: str) -> None:
        if vm.domain == self.domain:
            self.batch.vm_gone(vm, cause)

    def _job_started(self, job: Any) -> None:
        r = self.records[job.job_id]
        r.start = job.start_time
        r.starts += 1
        for name in job.placed_on:
            vm = self.batch.serving.get(name)
            if vm is not None:
                self._open_jobs.setdefault(job.job_id, []).append(len(self.occupancy))
                self.occupancy.append((vm.cloud_id, float(job.start_time), None, job.job_id))

    def _job_finished(self, job: Any) -> None:
        r = self.records[job.job_id]
        r.end = job.end_time
        for k in self._open_jobs.pop(job.job_id, ()):
            vm_id, start, _end, jid = self.occupancy[k]
            self.occupancy[k] = (vm_id, start, float(job.end_time), jid)
        self.completed += 1
        self.last_completion = self.world.t

    # ------------------------------------------------------------------ workload
    def _t0(self) -> float:
        return self.world.start + 1.0

    def _feed(self) -> None:
        """Submit every job due now, then schedule the next submit (one event at a time keeps
        the event queue small for 100,000-job traces)."""
        todo, world, t0 = self._todo, self.world, self._t0()
        first = todo[0][0].submit
        inner = self.batch.inner
        while self._next < len(todo):
            job, nodes, cores, limit = todo[self._next]
            at = t0 + (job.submit - first)
            if at > world.t:
                world.call_at(at, self._feed)
                return
            self.records[job.job_id] = JobRecord(job.job_id, world.t, job.run, nodes, cores)
            inner.submit(cores=cores, nodes=nodes, duration=job.run, time_limit=limit, job_id=job.job_id)
            self._next += 1

    # ------------------------------------------------------------------ watching
    def _sample(self) -> None:
        inner = self.batch.inner
        inner.advance()
        nodes, cores_used = node_counts(inner)
        now = self.world.t
        inst = {}
        for name, cloud in self.clouds.items():
            live = booting = 0
            for v in cloud.live_vms():
                live += 1
                if now < v.boot_at or v.boot_fails:
                    booting += 1
            inst[name] = (live, booting)
        self.samples.append(Sample(now - self.world.start, sum(1 for j in inner._queue if not j.held),
                                   len(inner._running), cores_used, nodes, inst))
        if self.done_at is None and self._next >= len(self._todo) and self.completed >= len(self._todo):
            live = sum(v[0] for v in inst.values())
            if live <= self.dcfg.min_nodes or now >= self.last_completion + self.options.tail_seconds:
                self.done_at = now

    def _sample_every(self, step: float) -> None:
        def tick() -> None:
            self._sample()
            if self.done_at is None:
                self.world.call_after(step, tick)

        self.world.call_after(0.0, tick)

    def expected_seconds(self) -> float:
        todo = self._todo
        return (todo[-1][0].submit - todo[0][0].submit) + max(j.run for j, *_ in todo) + 1800.0

    # ------------------------------------------------------------------ running
    def run(self) -> RunData:
        wall0, cpu0 = time.perf_counter(), time.process_time()
        with quiet_loggers():
            expected = self.expected_seconds()
            step = self.options.sample_seconds or max(30.0, round(expected / 3000.0 / 10.0) * 10.0)
            try:
                with self.world.running(), _no_automatic_gc():
                    for p in (self.engine, self.provisioner, self.sensor):
                        p.start()
                    for name in self.sites:
                        for since, n in self.cloud_model.site(name).capacity:
                            self.world.at(self.world.start + since, lambda c=self.clouds[name], n=n: setattr(c, "quota", n),
                                          f"capacity {name} {n}")
                    self.world.at(self._t0(), self._feed, "workload")
                    self._sample_every(step)
                    hard_end = self.world.start + expected + self.options.tail_seconds + 7 * 86400.0
                    chunk = 3600.0
                    while self.done_at is None and self.world.t < hard_end:
                        self.world.run_until(min(hard_end, self.world.t + chunk))
                        gc.collect(1)  # the young objects of the simulated hour (see _no_automatic_gc)
                        if self.options.progress is not None:
                            self.options.progress(self.world.elapsed, expected, self.completed, len(self._todo))
                    end = self.done_at if self.done_at is not None else self.world.t
            finally:
                self.close()
        stats = getattr(self.engine, "skip_stats", None)
        return RunData(
            config=self.config, domain=self.domain, policy=self.dcfg.policy, workload=self.workload,
            cloud=self.cloud_model, seed=self.options.seed, jobs=list(self.records.values()),
            vms={n: list(c.vms.values()) for n, c in self.clouds.items()}, samples=self.samples,
            start=self.world.start, end=end, skipped=self.skipped, digest=self.world.digest,
            events=self.world.events,
            iterations=stats.iterations if stats else (self.engine.engine.iterations if self.engine.engine else 0),
            iterations_skipped=stats.skipped if stats else 0,
            engine_cpu_seconds=stats.cpu_seconds if stats else 0.0,
            jobs_killed=len(self.batch.stats.kills),
            wall_seconds=time.perf_counter() - wall0, cpu_seconds=time.process_time() - cpu0,
            cloud_errors=sum(c.stats.errors for c in self.clouds.values()),
            occupancy=self.occupancy, owners=self.owners,
            sizes={n: self.config.sites[n].size for n in self.sites},
            cores={n: self.config.sites[n].cores for n in self.sites},
            cloud_sources=dict(self.cloud_sources), warnings=list(self.warnings))

    def close(self) -> None:
        release_store(self.provisioner.store)
        shutil.rmtree(self.workdir, ignore_errors=True)


def default_config(workload: Workload, *, cores_per_node: int = 1, max_nodes: int | None = None,
                   policy: str = "queue-demand", price: float = 0.1, sites: int = 1) -> EpuConfig:
    """A config for a workload when the operator gives none: one domain ``sim`` on one simulated
    site, nodes of ``cores_per_node`` cores, at most as many as the trace's machine (or, for a
    generator, its peak of processors in use if every job started at once), a 5 s iteration and a 60 s sensor poll (the services' defaults)."""
    procs = workload.machine_procs or workload.peak_procs()
    most = max_nodes or max(1, math.ceil(max(procs, workload.max_procs) / cores_per_node))
    names = ["cloud"] if sites == 1 else [f"cloud-{i + 1}" for i in range(sites)]
    return parse_config({
        "sensor": {"domain": "sim", "poll_seconds": 60.0},
        "decision": {"iteration_seconds": 5.0},
        "domains": {"sim": {"policy": policy, "max_nodes": most, "cores_per_node": cores_per_node,
                            "sites": names}},
        "sites": {n: {"driver": "epu-sim", "quota": most, "price_per_hour": price, "cores": cores_per_node,
                      "size": f"sim.{cores_per_node}core"} for n in names},
    }, "default simulation config", environ={})
