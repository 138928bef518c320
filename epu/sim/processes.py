"""The simulated processes: the production cores, wired to the world instead of a runtime.

Each ``Proc`` plays one OS process of a deployment — a decision engine, a provisioner, a
sensor — and drives its core only through the entry points the real service uses:

* decision: ``Engine.handle_input`` / ``handle_control`` per delivered message, ``iterate``
  every ``iteration_seconds`` (``services.decision.app``);
* provisioner: ``handle_launch`` / ``handle_terminate``, ``start`` (reconcile on start),
  ``poll_all``, ``reconcile_all``, ``flush_outbox`` on their periods
  (``services.provisioner.app``), its cloud work on ``InlineRunner``s whose tasks are world
  events (a task runs after the site's API latency);
* sensor: ``SensorCore.handle`` per node command, ``poll`` when due
  (``services.sensor.app``).

What survives a crash is what survives in production: the stores (SQLite files), the
sensor's command log, the cloud and the batch system. Everything else — the core objects,
their caches, their queued cloud tasks, their timers — is dropped, and ``start`` builds them
again from the stores. A process's broker link is modelled in three parts: ``link_up`` (the
network), ``registered`` (the broker still believes the consumer is there; it stops
believing after a heartbeat timeout) and ``aware`` (the process still believes it is
connected; its runtime stops its timers and reconnects when it notices).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine as SqlEngine
from sqlalchemy.exc import OperationalError

from epu.common.config import EpuConfig
from epu.common.messages import (
    InstanceEvent,
    LaunchRequest,
    Message,
    NodeCommand,
    PolicyChange,
    TerminateRequest,
)
from epu.common.runtime import infrastructure
from epu.services.decision.engine import Engine
from epu.services.decision.snaporder import stale_on_arrival
from epu.services.decision.store import Store as DecisionStore
from epu.services.provisioner.app import build_provisioner
from epu.services.provisioner.provisioner import Provisioner
from epu.services.provisioner.runner import InlineRunner
from epu.services.provisioner.store import Store as ProvisionerStore
from epu.services.sensor.core import PollSchedule, SensorCore
from epu.services.sensor.dedupe import MemoryCommandLog
from epu.sim.batch import SimBatchSystem
from epu.sim.bus import Bus, Crash, snapshot_queue
from epu.sim.cloud import SimCloud, SimNodeDriver
from epu.sim.decision_memstore import MemoryDecisionDatabase, MemoryLeases
from epu.sim.decision_memstore import MemoryStore as MemoryDecisionStore
from epu.sim.node_memo import NodeMemo
from epu.sim.provisioner_memstore import MemoryDatabase, MemoryStore
from epu.sim.quiet_poll import QuietPolls
from epu.sim.report_memo import ReportEvents
from epu.sim.world import World, WorldClock

log = logging.getLogger("epu.sim")


@dataclass
class ProcStats:
    starts: int = 0
    crashes: int = 0
    handler_errors: int = 0
    dead_letters: int = 0
    timer_errors: int = 0


class StoreFaults:
    """A database that refuses writes for a while ("database is locked", a PostgreSQL failover)."""

    def __init__(self) -> None:
        self.failing_until = -1.0
        self.crash_next_write = False
        self.failed_writes = 0
        self.failover_until = -1.0
        self.failover_error: Callable[[str], Exception] | None = None
        """While ``failover_until`` lies ahead, each write raises what this makes of its statement
        (``faults.store_failover``: PostgreSQL's read-only and aborted-transaction answers)."""

    def attach(self, engine: SqlEngine, world: World, owner: Proc) -> None:
        @event.listens_for(engine, "before_cursor_execute")
        def _check(conn: Any, cursor: Any, statement: str, params: Any, context: Any, executemany: bool) -> None:
            head = statement.lstrip()[:6].upper()
            if head in ("INSERT", "UPDATE", "DELETE"):
                self.check_write(world, owner, statement[:60])

    def attach_memory(self, store: MemoryStore | MemoryDecisionDatabase, world: World, owner: Proc) -> None:
        """The same faults for an in-memory store (provisioner: the store; decision engines: their
        shared database): checked before each write transaction."""
        store.before_write = lambda: self.check_write(world, owner, "write")

    def check_write(self, world: World, owner: Proc, statement: str) -> None:
        """A write is about to run: the owner dies here, or the database refuses it, or it runs."""
        if self.crash_next_write and owner.alive:
            self.crash_next_write = False
            raise Crash(f"{owner.name} killed before a store write")
        if world.t < self.failing_until:
            self.failed_writes += 1
            raise OperationalError(statement, None, Exception("simulated: database is locked"))
        if world.t < self.failover_until and self.failover_error is not None:
            self.failed_writes += 1
            raise self.failover_error(statement)


class Proc:
    """One simulated OS process (see the module docstring)."""

    kind = "proc"
    identity: str | None = None
    """The broker user it publishes as (deploy/rabbitmq's least-privilege users): the bus refuses
    what that user may not publish and stamps the rest with it (None: no user, anything goes)."""

    def __init__(self, world: World, bus: Bus, name: str) -> None:
        self.world = world
        self.bus = bus
        self.name = name
        self.alive = False
        self.gen = 0
        self.link_up = True
        self.registered = False
        self.aware = True
        self.stats = ProcStats()
        self.crash_at_publish = 0
        """Armed by a fault: crash on the N-th publish from now (0 = off)."""
        self.on_crash: list[Callable[[Proc], None]] = []

    # ------------------------------------------------------------------ connection
    @property
    def connected(self) -> bool:
        """Can publish now."""
        return self.alive and self.link_up and self.bus.broker_up

    @property
    def receiving(self) -> bool:
        """Can be delivered to now."""
        return self.alive and self.link_up

    @property
    def running_timers(self) -> bool:
        """Its runtime loop runs timers (connected as far as it knows)."""
        return self.alive and self.aware

    def publish(self, msg: Message) -> None:
        if self.crash_at_publish:
            self.crash_at_publish -= 1
            if self.crash_at_publish == 0:
                raise Crash(f"{self.name} killed while publishing {msg.TYPE}")
        self.bus.publish(self, msg)

    def publish_many(self, msgs: list[Message]) -> None:
        for m in msgs:
            self.publish(m)

    # ------------------------------------------------------------------ life
    def start(self) -> None:
        if self.alive:
            return
        self.alive = True
        self.gen += 1
        self.registered = self.link_up
        self.aware = self.link_up and self.bus.broker_up
        self.stats.starts += 1
        self.world.note(f"start {self.name}")
        try:
            self.boot()
        except Exception as exc:
            if infrastructure(exc) != "transient":
                raise
            # the service exits at start (its database refused the start's write: a failover) and
            # its supervisor starts it again, as systemd's Restart= does: a crash, restarted by
            # whoever restarts this process's crashes
            self.crash(f"start failed: {type(exc).__name__}")
            return
        self.bus.flush()

    def boot(self) -> None:
        """Build the core from durable state and schedule its timers (subclasses)."""

    def crash(self, why: str = "") -> None:
        if not self.alive:
            return
        self.alive = False
        self.registered = False
        self.stats.crashes += 1
        self.world.note(f"crash {self.name} {why}")
        self.teardown()
        for fn in self.on_crash:
            fn(self)

    def teardown(self) -> None:
        """Drop what dies with the process (subclasses)."""

    def dead_letter(self, msg: Message, exc: BaseException) -> None:
        self.stats.dead_letters += 1

    def every(self, period: float, fn: Callable[[], None], label: str, phase: float = 0.0) -> None:
        """A runtime timer: fires every ``period`` while the process lives and its runtime loop
        runs (it stops while the process reconnects). ``running_timers`` is written out in
        the tick: a run ticks its timers hundreds of thousands of times."""
        gen = self.gen
        call_after = self.world.call_after

        def tick() -> None:
            if not self.alive or self.gen != gen:
                return
            if self.aware:  # ``running_timers`` (alive, as just checked, and aware)
                self.guard(fn)
            call_after(period, tick, label)

        call_after(phase, tick, label)

    def guard(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` as this process: a Crash kills it, an error is logged (as the runtime does)."""
        try:
            fn()
        except Crash as c:
            self.crash(str(c))
        except Exception:
            self.stats.timer_errors += 1
            log.debug("timer failed in %s", self.name, exc_info=True)

    def later(self, delay: float, fn: Callable[[], None], label: str) -> None:
        """A one-off piece of this process's work (dropped if the process dies meanwhile)."""
        gen = self.gen

        def run() -> None:
            if self.alive and self.gen == gen:
                self.guard(fn)

        self.world.call_after(delay, run, label)

    # ------------------------------------------------------------------ network faults
    def drop_link(self, broker_notices: float, process_notices: float) -> None:
        self.link_up = False
        self.world.note(f"link down {self.name}")
        gen = self.gen

        def broker_side() -> None:
            if self.gen == gen and not self.link_up:
                self.registered = False
                self.bus.flush()

        def process_side() -> None:
            if self.gen == gen and not self.link_up:
                self.aware = False
                self.on_connection_lost()

        self.world.after(broker_notices, broker_side, f"broker notices {self.name} gone")
        self.world.after(process_notices, process_side, f"{self.name} notices its link is gone")

    def restore_link(self, reconnect_after: float) -> None:
        self.link_up = True
        self.world.note(f"link up {self.name}")

        def reconnect() -> None:
            if self.alive and self.link_up and self.bus.broker_up:
                self.registered = True
                self.aware = True
                self.world.note(f"reconnected {self.name}")
                self.bus.flush()

        self.world.after(reconnect_after, reconnect, f"{self.name} reconnects")

    def broker_changed(self, up: bool, notice_after: float) -> None:
        """The broker went down or came back: the runtime notices and stops/resumes."""
        gen = self.gen

        def notice() -> None:
            if not self.alive or self.gen != gen:
                return
            if not up and self.aware:
                self.aware = False
                self.on_connection_lost()
                if self.bus.broker_up:
                    # the broker came back before this runtime noticed it had gone (its "up"
                    # noticed first, a no-op then): the connection is lost all the same, and the
                    # runtime reconnects as after any loss — it never stays down with the broker
                    # up (``epu sim --seed 960026 --scenario native-lost-resume``: a provisioner
                    # left unaware for ever stopped polling, 7 records terminating for ever)
                    self.world.after(notice_after, reconnect, f"{self.name} reconnects after a late notice")
            elif up:
                reconnect()

        def reconnect() -> None:
            if self.alive and self.gen == gen and self.link_up and not self.aware and self.bus.broker_up:
                self.aware = True
                self.registered = True

        self.world.after(notice_after, notice, f"{self.name} notices broker {'up' if up else 'down'}")

    def on_connection_lost(self) -> None:
        """The runtime noticed its connection is gone (subclasses)."""


# ---------------------------------------------------------------------- decision engine


class _Observed:
    """The engine's real store, telling the world about every plan it commits (one-brain and
    max_nodes checks) — after the commit succeeded, as the intent log would show it."""

    def __init__(self, db: Any, owner: EngineProc) -> None:
        super().__init__(db)  # type: ignore[call-arg]
        self.owner = owner

    def commit_plan(self, domain: str, plan: Any, now: float, memory: Any, iteration: int,
                    refreshed: Any = (), **kw: Any) -> None:
        if plan.sites:
            plan._health_before = self.site_health()  # type: ignore[attr-defined] # for the blame check (invariant 6)
        if self.owner.crash_at_commit == "before":
            self.owner.crash_at_commit = ""
            raise Crash(f"{self.owner.name} killed before committing a plan")
        super().commit_plan(domain, plan, now, memory, iteration, refreshed, **kw)  # type: ignore[misc]
        for fn in self.owner.on_commit:
            fn(self.owner, domain, plan)
        if self.owner.crash_at_commit == "after":
            self.owner.crash_at_commit = ""
            raise Crash(f"{self.owner.name} killed after committing a plan, before sending it")

    def commit_plans(self, writes: list[Any]) -> dict[str, Exception]:
        """``commit_plan``'s observation and crashes for an iteration's plans stored together:
        each plan's site health before it is the store's overlaid with the earlier plans' (as if
        committed one by one); the world hears of the plans that were stored, in order."""
        health: dict[str, Any] | None = None
        for w in writes:
            if w.plan.sites:
                health = self.site_health() if health is None else health
                w.plan._health_before = dict(health)  # for the blame check (invariant 6)
            if health is not None:
                health.update(w.plan.sites)
        if self.owner.crash_at_commit == "before":
            self.owner.crash_at_commit = ""
            raise Crash(f"{self.owner.name} killed before committing a plan")
        failed: dict[str, Exception] = super().commit_plans(writes)  # type: ignore[misc]
        for w in writes:
            if w.domain not in failed:
                for fn in self.owner.on_commit:
                    fn(self.owner, w.domain, w.plan)
        if self.owner.crash_at_commit == "after" and len(failed) < len(writes):
            self.owner.crash_at_commit = ""
            raise Crash(f"{self.owner.name} killed after committing a plan, before sending it")
        return failed

    def store_actions(self, domain: str, plan: Any, now: float, **kw: Any) -> None:
        super().store_actions(domain, plan, now, **kw)  # type: ignore[misc]
        for fn in self.owner.on_commit:
            fn(self.owner, domain, plan)


class ObservedDecisionStore(_Observed, DecisionStore):
    """The SQL store, observed (``_Observed``)."""


class ObservedMemoryDecisionStore(_Observed, MemoryDecisionStore):
    """The in-memory store (``epu.sim.decision_memstore``), observed (``_Observed``)."""


def open_decision_store(db: SqlEngine | MemoryDecisionDatabase) -> DecisionStore | MemoryDecisionStore:
    """A plain handle on the engines' shared store, wherever it lives (for the checks)."""
    return MemoryDecisionStore(db) if isinstance(db, MemoryDecisionDatabase) else DecisionStore(db)


class EngineProc(Proc):
    """A decision engine process, wired as ``services.decision.app`` wires it: the input queue
    (events, reports, command results), one latest-value snapshot queue per domain (snapshots
    older than ``active_window_seconds`` on arrival are not acted on), the control queue, fencing
    leases in the shared store (``services.decision.lease``), and ``forget_snapshots`` when its
    runtime notices the broker connection is gone."""

    kind = "decision"
    identity = "epu-decision"

    def __init__(self, world: World, bus: Bus, name: str, config: EpuConfig,
                 db: SqlEngine | MemoryDecisionDatabase, store_faults: StoreFaults) -> None:
        super().__init__(world, bus, name)
        self.config = config
        self.db = db
        self.clock = WorldClock(world)
        self.engine: Engine | None = None
        self.leases: Any = None
        self.store_faults = store_faults
        self.crash_at_commit = ""
        """Armed by a fault: ``before`` or ``after`` the next plan commit, the engine dies."""
        self.on_commit: list[Callable[[EngineProc, str, Any], None]] = []
        self.on_send: list[Callable[[EngineProc, Message], None]] = []
        self.stale_snapshots = 0
        bus.subscribe("decision.input", "sac", self, self._input)
        for domain in config.domains:
            bus.subscribe(snapshot_queue(domain), "sac", self, self._snapshot, latest_value=True)
            bus.queue(snapshot_queue(domain)).ttl = config.decision.active_window_seconds  # the sensor's TTL
        bus.subscribe("decision.control", "sac", self, self._control)

    def boot(self) -> None:
        kw: dict[str, Any] = {}
        if isinstance(self.db, MemoryDecisionDatabase):
            self.leases = MemoryLeases(self.db, f"{self.name}:{self.gen}", self.config.decision.lease_ttl())
            self.engine = Engine(self.config, ObservedMemoryDecisionStore(self.db, self), self.publish,
                                 self.clock, publish_many=self.publish_many, leases=self.leases)
            self._start_iterating()
            return
        store = ObservedDecisionStore(self.db, self)
        try:
            from epu.services.decision.lease import Leases
        except ImportError:  # an engine from before fencing (the simulator replays old code too)
            self.leases = None
        else:
            self.leases = Leases(self.db, f"{self.name}:{self.gen}", self.config.decision.lease_ttl()).create()
            kw["leases"] = self.leases
        self.engine = Engine(self.config, store, self.publish, self.clock, publish_many=self.publish_many, **kw)
        self._start_iterating()

    def _start_iterating(self) -> None:
        period = self.config.decision.iteration_seconds
        self.every(period, self._iterate, f"iterate {self.name}", phase=period * 0.5)

    def publish(self, msg: Message) -> None:
        super().publish(msg)
        for fn in self.on_send:  # only what actually went out (a publish into a dead link did nothing)
            fn(self, msg)

    def teardown(self) -> None:
        self.engine = None  # its leases run out by themselves (a killed process releases nothing)

    def _iterate(self) -> None:
        assert self.engine is not None
        self.engine.iterate()

    def _input(self, msg: Message) -> None:
        assert self.engine is not None
        if msg.TYPE == "sensor.snapshot":
            return  # as the service does: snapshots come on their latest-value queue
        self.engine.handle_input(msg)

    def _snapshot(self, msg: Message) -> None:
        assert self.engine is not None
        if stale_on_arrival(msg, self.clock.now(), self.config.decision.active_window_seconds) is not None:  # type: ignore[arg-type]
            self.stale_snapshots += 1  # as services.decision.app: not acted on
            return
        self.engine.handle_input(msg)

    def _control(self, msg: Message) -> None:
        assert self.engine is not None
        self.engine.handle_control(msg)

    def on_connection_lost(self) -> None:
        forget = getattr(self.engine, "forget_snapshots", None) or getattr(self.engine, "on_connection_lost", None)
        if forget is not None:
            forget()


# ---------------------------------------------------------------------- provisioner


def release_store(store: ProvisionerStore | MemoryStore | None) -> None:
    """Let a provisioner's store go as a killed process does: its connections close, nothing is
    flushed (unflushed outbox marks are lost; the outbox sends those events again)."""
    if isinstance(store, ProvisionerStore):
        store.engine.dispose()


class ProvisionerProc(Proc):
    kind = "provisioner"
    identity = "epu-provisioner"

    def __init__(self, world: World, bus: Bus, name: str, config: EpuConfig, store_url: str,
                 clouds: dict[str, SimCloud], store_faults: StoreFaults,
                 api_latency: Callable[[], float], queue: str = "provisioner",
                 databases: dict[str, MemoryDatabase] | None = None, skip_quiet_polls: bool = True) -> None:
        super().__init__(world, bus, name)
        self.config = config
        self.skip_quiet_polls = skip_quiet_polls
        """Skip a site's poll when it is exactly a no-op (``epu.sim.quiet_poll``)."""
        self.quiet = QuietPolls(enabled=False)
        """This boot's poll skipping (new at each boot: it keeps what the last polls saw)."""
        self.drivers: dict[str, SimNodeDriver] = {}
        self.store_url = store_url
        self.databases = databases
        """In-memory store databases by URL (they outlive a crash, as files do), or ``None``: the
        store is the SQL one on ``store_url``."""
        self.clouds = clouds
        self.clock = WorldClock(world)
        self.prov: Provisioner | None = None
        self.store: ProvisionerStore | None = None
        self.store_faults = store_faults
        self.api_latency = api_latency
        self.crash_after_create = False
        """Armed by a fault: die right after a create call returned, before the store knows."""
        self.unconfirmed_share = 0.0
        """Set by a fault (``faults.outbox_delays``): this share of its instance-event publishes get
        no confirm (a timeout, as ``Publisher`` reports it): the transition stays in the store's
        outbox and the next outbox sweep publishes it — while the anti-entropy report goes out on
        time, and may overtake it."""
        self.queue = queue
        self.alerts: list[tuple[float, Message]] = []
        self._report_events = ReportEvents()
        """The report's events by record object (``epu.sim.report_memo``; new at each boot)."""
        bus.subscribe(queue, "competing", self, self._handle)

    def boot(self) -> None:
        self._report_events = ReportEvents()
        if self.databases is not None:
            mem = MemoryStore(self.databases.setdefault(self.store_url, MemoryDatabase()), self.store_url)
            self.store_faults.attach_memory(mem, self.world, self)
            self.store = mem  # type: ignore[assignment]
        else:
            self.store = ProvisionerStore(self.store_url)
            self.store_faults.attach(self.store.engine, self.world, self)
        drivers: dict[str, SimNodeDriver] = {}
        for name, cloud in self.clouds.items():
            d = cloud.driver(self.name)
            drivers[name] = d
            d.on_created = self._created  # type: ignore[attr-defined]
        ids = self.world.rng(f"ids/{self.name}")
        extra: dict[str, Any] = {"alert": self._alert, "new_id": lambda: f"{ids.getrandbits(128):032x}",
                                 "convert": {name: NodeMemo() for name in drivers}}
        accepted = inspect.signature(build_provisioner).parameters
        self.prov = build_provisioner(self.config, self.publish, clock=self.clock, drivers=drivers,
                                      store=self.store, **{k: v for k, v in extra.items() if k in accepted})
        self.drivers = drivers
        self.quiet = QuietPolls(enabled=self.skip_quiet_polls)
        retry = self.prov.settings.retry
        self.prov.runners = {name: InlineRunner(name, self._scheduler(name), retry)  # type: ignore[assignment]
                             for name in self.prov.sites}
        pc = self.config.provisioner
        self.later(0.0, self.prov.start, f"start-reconcile {self.name}")
        self.every(pc.poll_seconds, self._poll, f"poll {self.name}", phase=pc.poll_seconds)
        self.every(pc.reconcile_seconds, self._reconcile, f"reconcile {self.name}", phase=pc.reconcile_seconds)
        self.every(pc.outbox_seconds, self._outbox, f"outbox {self.name}", phase=pc.outbox_seconds)
        report_seconds = getattr(pc, "report_seconds", None)
        if report_seconds:
            self.every(report_seconds, self._report, f"report {self.name}", phase=report_seconds)
        if any(site.discover for site in self.config.sites.values()):  # as the service: at start, then every so often
            self.later(0.0, self._discover, f"discover {self.name}")
            self.every(pc.discover_seconds, self._discover, f"discover {self.name}", phase=pc.discover_seconds)

    def publish(self, msg: Message) -> None:
        """``Proc.publish``, and an instance event whose confirm does not come (``unconfirmed_share``)
        fails as the runtime's publisher fails it: the caller sees the error (the provisioner leaves
        the transition to its outbox)."""
        if (self.unconfirmed_share and isinstance(msg, InstanceEvent)
                and self.world.rng(f"outbox/{self.name}").random() < self.unconfirmed_share):
            self.world.note(f"{self.name}: no confirm for instance.state {msg.state}")
            raise ConnectionError("simulated: publish confirm timed out")
        super().publish(msg)

    def _alert(self, message: Message) -> None:
        self.alerts.append((self.world.t, message))
        try:
            self.publish(message)
        except ConnectionError:
            pass  # logged by a real service; the alert stays in the provisioner's memory

    def switch_store(self, url: str, faults: StoreFaults) -> None:
        """Start next time on another database (a new or restored store)."""
        self.store_url = url
        self.store_faults = faults

    def _created(self) -> None:
        if self.crash_after_create:
            self.crash_after_create = False
            raise Crash(f"{self.name} killed after a create call returned")

    def _scheduler(self, site: str) -> Callable[[Callable[[], None], str], None]:
        def schedule(task: Callable[[], None], what: str) -> None:
            delay = self.api_latency() if what == "task" else 0.0
            self.later(delay, task, f"{self.name} {site} {what}")

        return schedule

    def teardown(self) -> None:
        release_store(self.store)
        self.prov = None
        self.store = None

    def _poll(self) -> None:
        """As the service's ``poll_all``: one poll per site through its runner, each skipped by
        ``QuietPolls`` when it is exactly a no-op."""
        prov, quiet, drivers, store = self.prov, self.quiet, self.drivers, self.store
        assert prov is not None
        for name in prov.sites:
            prov.runners[name].observe("poll", lambda name=name: quiet.poll(prov, name, drivers[name], store))

    def _reconcile(self) -> None:
        assert self.prov is not None
        self.prov.reconcile_all()

    def _outbox(self) -> None:
        assert self.prov is not None
        self.prov.flush_outbox()

    def _discover(self) -> None:
        assert self.prov is not None
        self.prov.discover_all()

    def _report(self) -> None:
        """Anti-entropy, as the service's ``report`` timer: every domain's instances, one report
        each, with the types the sites that discover sizes offer (the service's ``offered``)."""
        from epu.services.provisioner.app import publish_reports
        from epu.services.provisioner.discovery import domain_sites

        assert self.store is not None and self.prov is not None
        publish_reports(self, self.store, self.config.provisioner.report_horizon_seconds,  # type: ignore[arg-type]
                        self.prov.catalogues, domain_sites(self.config.domains, self.config.sites),
                        events=self._report_events)

    def _handle(self, msg: Message) -> None:
        assert self.prov is not None
        if isinstance(msg, LaunchRequest):
            self.prov.handle_launch(msg)
        elif isinstance(msg, TerminateRequest):
            sent = self.bus.delivering  # the broker's validated user, as the runtime's ``Service.sender``
            self.prov.handle_terminate(msg, sender=sent.user if sent is not None else None)


# ---------------------------------------------------------------------- sensor


class SensorProc(Proc):
    kind = "sensor"

    def __init__(self, world: World, bus: Bus, name: str, domain: str, batch: SimBatchSystem,
                 poll_seconds: float) -> None:
        super().__init__(world, bus, name)
        self.domain = domain
        self.identity = f"epu-sensor-{domain}"
        self.batch = batch
        self.clock = WorldClock(world)
        self.poll_seconds = poll_seconds
        self.command_log = MemoryCommandLog()
        """Durable in production (a SQLite file): kept across crashes here."""
        self.core: SensorCore | None = None
        bus.subscribe(f"sensor.{domain}", "single", self, self._command)

    def boot(self) -> None:
        self.core = SensorCore(self.domain, self.batch, self.clock, self.command_log,
                               lambda msg, _corr: self.publish(msg),
                               PollSchedule(poll_seconds=self.poll_seconds, retry_initial_seconds=2.0),
                               incarnation=f"{self.world.rng(f'incarnation/{self.name}').getrandbits(64):016x}")
        self._arm(0.0)

    def _arm(self, delay: float) -> None:
        gen = self.gen

        def due() -> None:
            if not self.alive or self.gen != gen or self.core is None:
                return
            if self.running_timers:
                self.guard(self.core.tick)
            if self.core is not None and self.alive and self.gen == gen:
                wait = max(0.5, self.core.next_poll_at - self.clock.monotonic())
                self.world.call_after(wait, due, label)

        label = f"sensor poll {self.domain}"
        self.world.call_after(delay, due, label)

    def teardown(self) -> None:
        self.core = None

    def _command(self, msg: Message) -> None:
        assert self.core is not None and isinstance(msg, NodeCommand)
        self.batch.command_context = msg.instance_id
        try:
            self.core.handle(msg)
        finally:
            self.batch.command_context = None


# ---------------------------------------------------------------------- operators


@dataclass
class OperatorLog:
    forced: set[str] = field(default_factory=set)
    """Instances an operator terminated with force (invariant 1 lets those kill jobs)."""
    actions: list[tuple[float, str]] = field(default_factory=list)


class OperatorProc(Proc):
    """An operator at a terminal: ``epu policy ...`` and ``epu instances terminate``."""

    kind = "operator"
    identity = "epu-operator"

    def __init__(self, world: World, bus: Bus) -> None:
        super().__init__(world, bus, "operator")
        self.alive = True  # a terminal, always there; its commands fail only while the broker is down
        self.log = OperatorLog()
        self.changes: set[str] = set()
        """Ids of the PolicyChanges this operator sent."""

    def send(self, msg: Message) -> bool:
        self.log.actions.append((self.world.t, f"{msg.TYPE}"))
        self.world.note(f"operator sends {msg.TYPE}")
        try:
            self.publish(msg)
        except ConnectionError:
            return False  # the CLI prints the error; the operator may retry
        if isinstance(msg, TerminateRequest) and msg.force:
            self.log.forced.add(msg.instance_id)
        if isinstance(msg, PolicyChange):
            self.changes.add(msg.change_id)
        return True


class SlurmProgramsProc(Proc):
    """slurmctld's ResumeProgram/SuspendProgram/ResumeFailProgram: ``epu slurm ACTION HOSTLIST``
    on the head node, run per call with the sensor's broker user (its config) — not the sensor
    process: it runs while the sensor is down, and fails while the broker is unreachable."""

    kind = "slurm-programs"

    def __init__(self, world: World, bus: Bus, domain: str) -> None:
        super().__init__(world, bus, f"slurm-programs-{domain}")
        self.identity = f"epu-sensor-{domain}"
        self.alive = True

    def send(self, msg: Message) -> bool:
        try:
            self.publish(msg)
        except ConnectionError:
            return False  # the program exits 1; slurmctld logs it
        return True


__all__ = ["EngineProc", "OperatorProc", "PolicyChange", "Proc", "ProvisionerProc", "SensorProc", "SlurmProgramsProc",
           "StoreFaults"]
