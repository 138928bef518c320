"""One run: a scenario and a seed made into a world, run, and judged.

Timeline of a run: the deployment starts at T0; the workload and the faults act during the
*fault phase* (``scenario.hours``); then every fault knob is turned off, no job is submitted
any more, and the *quiet phase* (``scenario.quiet_seconds()``) gives the system its stated
bound to converge. The invariant checker (``invariants.Checker``) watches every step of both
phases and judges convergence at the end.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import Engine as SqlEngine

from epu.common.config import EpuConfig, parse_config
from epu.common.db import make_engine
from epu.services.decision.store import Store as DecisionStore
from epu.sim.batch import SimBatchSystem
from epu.sim.bus import Bus, Identities
from epu.sim.cloud import SimCloud
from epu.sim.decision_memstore import MemoryDecisionDatabase
from epu.sim.invariants import Checker, Violation, max_cores
from epu.sim.lazy import SimLazyEngineProc
from epu.sim.power import SlurmPowerSaving
from epu.sim.processes import (
    EngineProc,
    OperatorProc,
    Proc,
    ProvisionerProc,
    SensorProc,
    SlurmProgramsProc,
    StoreFaults,
    release_store,
)
from epu.sim.provisioner_memstore import MemoryDatabase
from epu.sim.scenario import ProvisionerSpec, Scenario
from epu.sim.world import World, WorldClock

MAX_EXTRA_SECONDS = 12 * 3600.0


@dataclass
class Outages:
    """When our own pipeline was down (broker, every provisioner, the sensor or the batch
    controller): invariant 6 must not blame a site for time spent in these."""

    intervals: list[tuple[float, float, str]] = field(default_factory=list)
    open: dict[str, float] = field(default_factory=dict)

    def begin(self, what: str, t: float) -> None:
        self.open.setdefault(what, t)

    def end(self, what: str, t: float) -> None:
        start = self.open.pop(what, None)
        if start is not None and t > start:
            self.intervals.append((start, t, what))

    def down_time(self, t0: float, t1: float, at_least: float = 0.0) -> float:
        """Seconds of [t0, t1] during which any part was down (overlaps counted once), counting
        only outages that lasted ``at_least`` seconds (those the engine can notice)."""
        spans = [(max(a, t0), min(b, t1)) for a, b, _ in self.intervals if b > t0 and a < t1 and b - a >= at_least]
        spans += [(max(a, t0), t1) for a in self.open.values() if a < t1 and t1 - a >= at_least]
        spans.sort()
        total, cur_a, cur_b = 0.0, None, None
        for a, b in spans:
            if cur_b is None or a > cur_b:
                if cur_b is not None:
                    total += cur_b - cur_a  # type: ignore[operator]
                cur_a, cur_b = a, b
            else:
                cur_b = max(cur_b, b)
        if cur_b is not None:
            total += cur_b - cur_a  # type: ignore[operator]
        return total


@dataclass
class RunResult:
    scenario: str
    seed: int
    simulated_seconds: float
    violations: list[Violation]
    digest: str
    events: int
    wall_seconds: float
    cpu_seconds: float
    stats: dict[str, Any]

    @property
    def ok(self) -> bool:
        return not self.violations

    def replay(self) -> str:
        return f"epu sim --seed {self.seed} --scenario {self.scenario}"


class Simulation:
    def __init__(self, scenario: Scenario, seed: int, workdir: str | None = None, *,
                 sqlite_provisioner_stores: bool = False, sqlite_decision_store: bool = False,
                 skip_idle: bool = True, skip_quiet_polls: bool = True) -> None:
        self.scenario = scenario
        self.skip_quiet_polls = skip_quiet_polls
        """Provisioners skip a site's poll when it is exactly a no-op (``epu.sim.quiet_poll``)."""
        self.seed = seed
        self.world = World(seed, id_prefix_bits=scenario.id_prefix_bits)
        self._own_dir = workdir is None
        base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        self.workdir = workdir or tempfile.mkdtemp(prefix=f"epu-sim-{seed}-", dir=base)
        self.bus = Bus(self.world, scenario.messages)
        self.bus.identities = Identities([scenario.domain.name])  # each process its own broker user
        self.outages = Outages()
        self.fault_end = self.world.start + scenario.hours * 3600.0
        self.end = self.fault_end + scenario.quiet_seconds()
        self.latest_end = self.fault_end + MAX_EXTRA_SECONDS
        """The quiet phase waits for the work to be done (see ``_settle``), but not forever."""
        d = scenario.domain
        self.domain = d.name
        # the clouds and the batch system
        self.clouds = {s.name: SimCloud(self.world, s.name, quota=s.account_quota, boot_seconds=s.boot_seconds,
                                        faults=s.faults, sizes=s.sizes) for s in scenario.sites}
        self.batch = SimBatchSystem(self.world, WorldClock(self.world), flavor=d.flavor,
                                    report_identity=d.report_identity, condor_drain=d.condor_drain,
                                    retirement_seconds=d.retirement_seconds)
        self.batch.default_cores = d.cores_per_node
        self.batch.node_types = node_types(scenario)
        for cloud in self.clouds.values():
            cloud.on_running.append(self._vm_running)
            cloud.on_gone.append(self._vm_gone)
        # the deployment
        self.decision_faults = StoreFaults()
        self.config = self.make_config(scenario.provisioners[0])
        self.decision_db: SqlEngine | MemoryDecisionDatabase
        """The engines' shared store: in memory (``epu.sim.decision_memstore``, the SQL store's
        semantics without SQLAlchemy's cost; no scenario reaches into its file), or an SQLite file
        on request (tests/sim/test_replay.py compares the two)."""
        if sqlite_decision_store:
            self.decision_db = make_engine(f"sqlite:///{self.workdir}/decision.db")
            DecisionStore(self.decision_db).create()
            self.decision_faults.attach(self.decision_db, self.world, _Nobody)
        else:
            self.decision_db = MemoryDecisionDatabase()
            self.decision_faults.attach_memory(self.decision_db, self.world, _Nobody)
        engine_cls = EngineProc
        if skip_idle and scenario.engines == 1 and not sqlite_decision_store:
            engine_cls = SimLazyEngineProc  # idle iterations skipped, exactly (``epu.sim.lazy``)
        self.engines = [engine_cls(self.world, self.bus, f"engine-{i + 1}", self.config, self.decision_db,
                                   self.decision_faults) for i in range(scenario.engines)]
        self.provisioner_faults: dict[str, StoreFaults] = {}
        in_memory = scenario.setup is None and not sqlite_provisioner_stores
        self.databases: dict[str, MemoryDatabase] | None = {} if in_memory else None
        """The provisioners' stores in memory (``epu.sim.provisioner_memstore``, the SQL store's
        semantics without SQLAlchemy's cost; the same run, bit for bit — tests/sim/test_replay.py),
        or SQLite files: on request, and for a scenario whose setup may reach into the store files
        (backups, restores)."""
        self.provisioners = [self.make_provisioner(p) for p in scenario.provisioners]
        self.sensor = SensorProc(self.world, self.bus, "sensor", d.name, self.batch, scenario.timing.sensor_poll_seconds)
        self.slurm_programs: SlurmProgramsProc | None = None
        if d.power is not None:  # Slurm-native mode: slurmctld's power saving and its programs
            self.slurm_programs = SlurmProgramsProc(self.world, self.bus, d.name)
            self.batch.power = SlurmPowerSaving(self.batch, d.power, d.name, self.slurm_programs.send,
                                                lambda _name: d.cores_per_node)
        self.operator = OperatorProc(self.world, self.bus)
        self.checker = Checker(self)
        self.closers: list[Any] = []
        """What an optional part of the world (the context broker) releases at the end."""
        self._rng_jobs = self.world.rng("workload")

    # ------------------------------------------------------------------ building
    def make_config(self, prov: ProvisionerSpec) -> EpuConfig:
        s, t, d = self.scenario, self.scenario.timing, self.scenario.domain
        params = dict(d.params)
        params.setdefault("stall_seconds", t.stall_seconds)
        return parse_config({
            "decision": {"store_url": "sqlite://", "iteration_seconds": t.iteration_seconds,
                         "resend_seconds": t.resend_seconds, "active_window_seconds": t.active_window_seconds},
            "provisioner": {**({"deployment": prov.deployment} if prov.deployment else {}),
                            "store_url": self.store_url(prov.store),
                            "poll_seconds": t.provisioner_poll_seconds, "reconcile_seconds": t.reconcile_seconds,
                            "orphan_grace_seconds": t.orphan_grace_seconds, "outbox_seconds": t.outbox_seconds},
            "domains": {d.name: {"policy": d.policy, "params": params, "min_nodes": d.min_nodes,
                                 "max_nodes": d.max_nodes, "cores_per_node": d.cores_per_node,
                                 "node_names": list(d.node_names),
                                 "sites": [x.name for x in s.sites],
                                 **({"partitions": d.partitions} if d.partitions else {}),
                                 **({"default_partition": d.default_partition} if d.default_partition else {}),
                                 **({"allow_spot": True} if d.allow_spot else {}),
                                 **({"budget_per_hour": d.budget_per_hour} if d.budget_per_hour else {}),
                                 **({"mode": d.mode} if d.mode != "act" else {}),
                                 **({"native": "slurm", "native_resume_seconds": d.power.resume_timeout}
                                    if d.power is not None else {})}},
            "sites": {x.name: {"driver": "epu-sim", "quota": x.quota, "image": "sim-image",
                               **({"budget_per_hour": x.budget_per_hour} if x.budget_per_hour else {}),
                               **({"discover": list(x.discover)} if x.discover else {}),
                               **({"types": x.types} if x.types else
                                  {"price_per_hour": x.price, "cores": x.cores, "size": f"sim.{x.cores}core"})}
                      for x in s.sites},
        }, source=f"scenario {s.name}", environ={})

    def edit_domain(self, **changes: object) -> EpuConfig:
        """The deployment's config with the domain's file section edited (for engine restarts)."""
        domain = self.config.domains[self.domain].model_copy(update=changes)
        return self.config.model_copy(update={"domains": {**self.config.domains, self.domain: domain}})

    def store_url(self, store: str) -> str:
        return f"sqlite:///{self.workdir}/{store}.db"

    def make_provisioner(self, spec: ProvisionerSpec) -> ProvisionerProc:
        config = self.make_config(spec)
        names = spec.sites or [s.name for s in self.scenario.sites]
        sites = {s.name: s for s in self.scenario.sites}
        faults = self.provisioner_faults.setdefault(spec.store, StoreFaults())

        def latency(names: list[str] = names) -> float:
            lo, hi = sites[names[0]].api_latency
            return lo + self.world.rng(f"api/{spec.name}").random() * (hi - lo)

        p = ProvisionerProc(self.world, self.bus, spec.name, config, self.store_url(spec.store),
                            {n: self.clouds[n] for n in names}, faults, latency,
                            queue="provisioner" if spec.managed else f"provisioner.{spec.name}",
                            databases=self.databases, skip_quiet_polls=self.skip_quiet_polls)
        p.spec = spec  # type: ignore[attr-defined]
        return p

    # ------------------------------------------------------------------ links
    def _vm_running(self, vm: Any) -> None:
        if vm.domain == self.domain:
            self.batch.vm_running(vm)

    def _vm_gone(self, vm: Any, cause: str) -> None:
        if vm.domain == self.domain:
            self.batch.vm_gone(vm, cause)

    @property
    def procs(self) -> list[Proc]:
        return [*self.engines, *self.provisioners, self.sensor]

    # ------------------------------------------------------------------ operators
    def operator_terminate(self, instance_id: str, force: bool) -> None:
        """``epu instances terminate ID [--force]``: the message the CLI builds, sent as the CLI does."""
        from epu.services.provisioner.cli import forced_record, terminate_message

        self.operator.send(terminate_message(instance_id, self.domain, "terminated by an operator", force))
        if force:  # then the record for the engine's history (the CLI sends it once a provisioner answered)
            self.operator.send(forced_record(instance_id, self.domain, "sim"))

    # ------------------------------------------------------------------ outage bookkeeping
    def pipeline_changed(self) -> None:
        """Recompute which parts of our own pipeline are down (called after each fault flip)."""
        t = self.world.t
        parts = {
            "broker": not self.bus.broker_up,
            "provisioner": not any(p.alive and p.link_up for p in self.provisioners
                                   if getattr(p, "spec", None) is None or p.spec.managed),  # type: ignore[attr-defined]
            "sensor": not (self.sensor.alive and self.sensor.link_up),
            "batch": self.batch.faults.down,
            "engine": not any(e.alive and e.link_up for e in self.engines),
        }
        for what, down in parts.items():
            if down:
                self.outages.begin(what, t)
            else:
                self.outages.end(what, t)

    # ------------------------------------------------------------------ workload
    def _schedule_workload(self) -> None:
        w = self.scenario.workload
        rng = self._rng_jobs
        cores_max = self.scenario.domain.cores_per_node

        def submit(n: int) -> None:
            for _ in range(n):
                cores = min(rng.choice(w.cores), cores_max)
                nodes = min(rng.choice(w.nodes), self.scenario.domain.max_nodes)
                duration = rng.uniform(*w.duration)
                self.batch.inner.submit(cores=cores, nodes=nodes, duration=duration)

        t = self.world.start + 60.0
        if w.arrivals_per_hour > 0:
            while True:
                t += rng.expovariate(w.arrivals_per_hour / 3600.0)
                if t >= self.fault_end:
                    break
                self.world.at(t, lambda: submit(1), "job")
        t = self.world.start
        if w.burst_per_hour > 0:
            while True:
                t += rng.expovariate(w.burst_per_hour / 3600.0)
                if t >= self.fault_end:
                    break
                n = rng.randint(*w.burst_jobs)
                self.world.at(t, lambda n=n: submit(n), f"burst {n}")

    def _quiet(self) -> None:
        """The fault phase is over: every knob off, down parts back up."""
        self.world.note("faults stop")
        for cloud in self.clouds.values():
            cloud.enabled = False
        self.bus.enabled = False
        if not self.bus.broker_up:
            self.bus.set_broker(True)
            for p in self.procs:
                p.broker_changed(True, 1.0)
        self.batch.faults.down = False
        self.batch.faults.missing_share = 0.0
        self.batch.faults.stale_seconds = 0.0
        self.batch.faults.failing_commands = 0
        self.sensor.clock.offset = 0.0
        self.decision_faults.failing_until = -1.0
        for f in self.provisioner_faults.values():
            f.failing_until = -1.0
        self.decision_faults.crash_next_write = False
        for f in self.provisioner_faults.values():
            f.crash_next_write = False
        for p in self.procs:
            p.crash_at_publish = 0
            for armed in ("crash_at_commit", "crash_after_create"):
                if hasattr(p, armed):
                    setattr(p, armed, type(getattr(p, armed))())
            p.on_crash.append(self._restart_in_quiet)
            if not p.link_up:
                p.restore_link(1.0)
            if not p.alive and getattr(p, "restart_in_quiet", True):
                p.start()
        self.pipeline_changed()

    def _restart_in_quiet(self, proc: Proc) -> None:
        """No fault acts after the fault phase; a process that still dies then (a crash armed
        before) is brought back, or the quiet phase would judge a deployment left half dead."""
        if self.world.t >= self.fault_end:
            self.world.after(1.0, proc.start, f"restart {proc.name} (quiet phase)")

    # ------------------------------------------------------------------ running
    def run(self) -> RunResult:
        wall0, cpu0 = time.perf_counter(), time.process_time()
        with quiet_loggers():
            try:
                with self.world.running():
                    for p in self.procs:
                        p.start()
                    self.pipeline_changed()
                    if self.scenario.setup is not None:
                        self.scenario.setup(self)
                    if self.scenario.context is not None:
                        from epu.sim.context import ContextWorld

                        self.context = ContextWorld(self, self.scenario.context)
                    self._schedule_workload()
                    for fault in self.scenario.faults:
                        fault(self)
                    self.world.at(self.fault_end, self._quiet, "quiet")
                    self.world.run_until(self.fault_end)
                    self._settle()
                    self.checker.finish()
            finally:
                self.close()
        return RunResult(self.scenario.name, self.seed, self.end - self.world.start, list(self.checker.violations),
                         self.world.digest, self.world.events, time.perf_counter() - wall0,
                         time.process_time() - cpu0, self.stats())

    def _settle(self) -> None:
        """Run the quiet phase: the stated bound (``scenario.quiet_seconds()``) counts from when the
        batch system has no work left — a backlog the domain runs at full size takes the time it
        takes — up to ``MAX_EXTRA_SECONDS`` after the faults stopped."""
        settle = self.scenario.quiet_seconds() - self.scenario.workload.duration[1]
        work_done_at: float | None = None
        while self.world.t < self.latest_end:
            self.world.run_until(min(self.world.t + 300.0, self.latest_end))
            inner = self.batch.inner
            cores = max_cores(self)  # a job no type could ever hold is not work left
            busy = inner.running > 0 or any(not j.held and not j.blocked and j.cores <= cores for j in inner._queue)
            if busy:
                work_done_at = None
            elif work_done_at is None:
                work_done_at = self.world.t
            if self.world.t >= self.end and work_done_at is not None and self.world.t >= work_done_at + settle:
                break
        self.end = self.world.t

    def stats(self) -> dict[str, Any]:
        return {
            "jobs_submitted": self.batch.inner.submitted,
            "jobs_completed": self.batch.inner._completed,
            "jobs_killed": len(self.batch.stats.kills),
            "vms_created": sum(c.stats.creates for c in self.clouds.values()),
            "messages": self.bus.stats.published,
            "crashes": sum(p.stats.crashes for p in self.procs),
            "dead_lettered": self.bus.stats.dead_lettered,
            **({"context": vars(self.context.stats)} if hasattr(self, "context") else {}),
        }

    def close(self) -> None:
        for fn in self.closers:
            fn()
        for p in self.provisioners:
            release_store(p.store)
        if isinstance(self.decision_db, SqlEngine):
            self.decision_db.dispose()
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)


class _NobodyType:
    """Owner of the shared decision store's fault hook (a crash there is the engine's)."""

    alive = False
    name = "decision-store"


_Nobody: Any = _NobodyType()


def node_types(scenario: Scenario) -> dict[str, dict]:
    """Provider size → a node's memory, GPUs, features and partitions, from the sites' catalogues
    and the domain's partition map (what the Slurm CLOUD slots of each type would declare)."""
    serves: dict[str, list[str]] = {}
    for part, refs in scenario.domain.partitions.items():
        for ref in refs:
            serves.setdefault(ref.rpartition("/")[2], []).append(part)
    out: dict[str, dict] = {}
    for site in scenario.sites:
        for size, z in site.sizes.items():  # listed by the driver; a [types] entry of the size wins
            out[size] = {"memory_mb": int(z.get("memory_mb", 0)), "gpus": int(z.get("gpus", 0)),
                         "features": tuple(z.get("features", ())), "partitions": tuple(serves.get(size, ()))}
        for name, t in site.types.items():
            out[str(t.get("size", name))] = {
                "memory_mb": int(t.get("memory_mb", 0)), "gpus": int(t.get("gpus", 0)),
                "features": tuple(t.get("features", ())), "partitions": tuple(serves.get(name, ()))}
    return out


@contextmanager
def quiet_loggers() -> Iterator[None]:
    """The cores log a lot at INFO; a run of thousands of simulated hours must not format it.
    The level is put back after the run: a caller's own warnings (a sensor's in the same
    process, a test's caplog) must not be silenced by a simulation having run before."""
    logger = logging.getLogger("epu")
    before = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(before)
