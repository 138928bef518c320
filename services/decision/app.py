"""``epu run decision``: the decision engine wired to the broker.

Consumes the single-active-consumer input queue (command results, instance events and the
provisioner's instance reports), one latest-value snapshot queue per domain, and the control
queue (policy changes), and iterates every ``iteration_seconds``. Handlers and the iteration
timer run on the runtime's one work thread, so they never race.

One brain per domain: a domain is acted on only with a fresh snapshot *and* its lease in the
shared store (``lease``), re-checked by every committed plan. When the broker connection is
lost the engine drops its cached snapshots and releases its leases (the engine the broker
now delivers to takes over at once); on a clean stop it releases them too. A snapshot older
than ``active_window_seconds`` when it arrives — the one left in the queue while no engine ran —
is not acted on: it expired there (the sensor publishes it with the active window as its TTL,
judged by the broker's clock, not the head node's); snapshots are ordered by their sensor's count
and aged by when this engine received them (snaporder.py). ``/healthz`` says per domain
``active``, ``standby`` or ``fenced``.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any

from epu.common.clock import Clock
from epu.common.config import EpuConfig
from epu.common.messages import Envelope, SensorSnapshot, SlurmPower
from epu.common.runtime import RuntimeSettings, Service
from epu.services.decision import fleet_metrics
from epu.services.decision.engine import Engine
from epu.services.decision.heap import HeapKeeper
from epu.services.decision.lease import Leases
from epu.services.decision.snaporder import stale_on_arrival
from epu.services.decision.statusfeed import StatusFeed
from epu.services.decision.store import Store
from prometheus_client import Counter, Gauge, Histogram

INPUT_TYPES = {"sensor.snapshot", "instance.state", "instance.report", "node.result", "slurm.power"}
LEADERSHIP = ("active", "standby", "fenced")
ACTION_KINDS = ("launch", "terminate", "add", "offline", "online", "remove")
"""The ``kind`` of an action an iteration sends (``ActionRecord.kind``)."""


def _malloc_trim() -> Callable[[], Any]:
    """glibc's ``malloc_trim(0)``, or a no-op elsewhere. Why: decoding a big snapshot and the
    iteration after it free tens of MB of small blocks that glibc keeps mapped; trimming after an
    iteration hands them back, so VmRSS stays near what is live (it cannot lower VmHWM, the peak)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim if hasattr(libc, "malloc_trim") else _no_trim
    except OSError:
        return _no_trim


def _no_trim(_pad: int = 0) -> int:
    return 0


def build_service(config: EpuConfig, *, clock: Clock | None = None) -> Service:
    broker = config.broker_obj()
    topo = broker.topology
    settings = RuntimeSettings(metrics_port=config.decision.metrics_port,
                               metrics_host=config.decision.metrics_host)
    service = Service("decision", broker, clock, settings)
    store = Store(config.decision.store_url).create()
    holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    leases = Leases(store.engine, holder, config.decision.lease_ttl()).create()
    engine = Engine(config, store, service.publish, service.clock, publish_many=service.publish_many,
                    leases=leases)
    heap = HeapKeeper()  # the working set out of the collector's walks (see heap.py)
    heap.install()
    r = service.metrics.registry
    stale = Counter("epu_decision_stale_snapshots_total", "Snapshots too old to act on when they arrived",
                    ["domain"], registry=r)
    for domain in config.domains:  # from 0: increase() sees the first one (a series born at 1 reads as none)
        stale.labels(domain)

    def on_snapshot(msg: Any, _env: Envelope) -> None:
        assert isinstance(msg, SensorSnapshot)
        age = stale_on_arrival(msg, service.clock.now(), config.decision.active_window_seconds)
        if age is not None:  # only a sender without an incarnation (snaporder.py): others expire in the queue
            stale.labels(msg.domain).inc()
            service.log.info("stale snapshot not acted on", extra={"domain": msg.domain, "age_seconds": round(age)})
            return
        accepted = engine.on_snapshot(msg)
        heap.settle(iteration=False)  # the snapshot's indexes live until the next one
        if accepted and config.decision.wake_min_seconds < config.decision.iteration_seconds:
            service.wake("iteration", config.decision.wake_min_seconds)  # new demand: answer it now

    def on_input(msg: Any, env: Envelope) -> None:
        if isinstance(msg, SensorSnapshot):
            return  # a binding from before the latest-value queues: the snapshot queue has the newest
        engine.handle_input(msg, env)
        if isinstance(msg, SlurmPower) and msg.action == "resume":
            service.wake("iteration", 0.0)  # Slurm waits for these nodes: launch now, not at the next tick

    settings.extra_health["active_domains"] = lambda: [d for d in engine.domains if engine.leadership(d) == "active"]
    settings.extra_health["domains"] = lambda: {d: engine.leadership(d) for d in engine.domains}
    service.consume(topo.decision_input_spec(), on_input, types=INPUT_TYPES)
    for domain in config.domains:
        service.consume(topo.decision_snapshot_spec(domain), on_snapshot, types={SensorSnapshot.TYPE}, prefetch=1)
    service.consume(topo.decision_control_spec(), engine.handle_control, types={"policy.change"}, prefetch=1)
    service.declare(topo.provisioner_spec())
    for domain in config.domains:
        service.declare(topo.sensor_spec(domain))
        if not broker.is_memory:  # memory:// ignores x-max-length, and no other process could read it
            service.declare(topo.status_spec(domain))
    service.on_connection_lost.append(engine.forget_snapshots)
    service.on_stop.append(leases.release)
    actions = Counter("epu_decision_actions_total", "Actions sent by policy iterations", ["domain", "kind"],
                      registry=r)
    shadow_actions = Counter("epu_decision_shadow_actions_total", "Observe mode: actions an iteration would have "
                             "sent, counted when the would-be plan changes (none was sent)", ["domain", "kind"],
                             registry=r)
    mode = Gauge("epu_decision_domain_mode", "1 for each domain's mode now: act or observe (observe: nothing "
                 "leaves the engine)", ["domain", "mode"], registry=r)
    commands = Counter("epu_decision_commands_total", "Commands that left the engine's gate, by kind and the "
                       "authority they acted on (policy, safety-net, operator)", ["domain", "kind", "authority"],
                       registry=r)
    held = Counter("epu_decision_commands_held_total", "Commands the engine's gate held back, by the rule that "
                   "held them (observe: every attempt while in observe mode)", ["domain", "kind", "rule"], registry=r)
    gate_seen: dict[str, dict] = {"sent": {}, "held": {}}

    def gate_metrics() -> None:
        """The gate's counts since the last look, added to the counters (the gate counts, the
        service exports)."""
        for source, counter, seen in ((engine.gate.counts, commands, gate_seen["sent"]),
                                      (engine.gate.held, held, gate_seen["held"])):
            for key, n in source.items():
                if n > seen.get(key, 0):
                    counter.labels(*key).inc(n - seen.get(key, 0))
                    seen[key] = n
    for domain in config.domains:
        for kind in ACTION_KINDS:
            actions.labels(domain, kind)
    seconds = Histogram("epu_decision_iteration_seconds", "Time of one iteration over all domains", registry=r)
    active = Gauge("epu_decision_active_domains", "Domains this engine currently acts for (0 on a standby)",
                   registry=r)
    leadership = Gauge("epu_decision_leadership", "1 for this engine's state of each domain: active, standby "
                       "or fenced", ["domain", "state"], registry=r)

    snapshot_age = Gauge("epu_decision_snapshot_age_seconds", "Age of the newest snapshot this engine holds "
                         "(absent: none)", ["domain"], registry=r)
    skew = Gauge("epu_decision_sensor_clock_skew_seconds", "How far the domain's sensor clock runs ahead of "
                 "the engine's (negative: behind), from its snapshots' taken_at and arrival", ["domain"], registry=r)
    available = Gauge("epu_decision_sensor_available", "1 if the newest snapshot could read the batch system",
                      ["domain"], registry=r)
    demand = Gauge("epu_decision_queued_demand_jobs", "Pending jobs a new node could start, newest snapshot",
                   ["domain"], registry=r)
    backoff = Gauge("epu_decision_site_backoff_seconds", "Seconds a failing site is still paused (0: not)",
                    ["site"], registry=r)
    breaker = Gauge("epu_decision_circuit_open", "1 while a domain's circuit breaker is open (implausible "
                    "snapshots: scale-down and lost-node handling frozen)", ["domain"], registry=r)
    settings.extra_health["circuit_open"] = engine.breakers
    budget_blocked = Gauge("epu_decision_budget_blocked", "1 while a domain's spend cap (budget_per_hour of "
                           "the domain or a site) holds launches it wants", ["domain"], registry=r)
    for domain in config.domains:
        budget_blocked.labels(domain).set(0)
    unsatisfiable = Gauge("epu_decision_unsatisfiable_jobs", "Pending jobs no instance type of the domain can "
                          "ever serve (never launched for), by what rules them out", ["domain", "constraint"],
                          registry=r)
    fleet = fleet_metrics.install(r, engine, service.clock.now)  # instances, nodes, paused, spend

    def observe() -> None:
        now = service.clock.now()
        states = {d: engine.leadership(d) for d in engine.domains}
        active.set(sum(1 for s in states.values() if s == "active"))
        for d, state in states.items():
            for s in LEADERSHIP:
                leadership.labels(d, s).set(1 if s == state else 0)
            snap = engine.latest_snapshot(d)
            if snap is None:
                with contextlib.suppress(KeyError):  # no snapshot: no age (not a stale number)
                    snapshot_age.remove(d)
                continue
            snapshot_age.labels(d).set(max(0.0, now - (engine.snapshot_taken(d) or now)))
            if (off := engine.skew.skew(d)) is not None:
                skew.labels(d).set(off)
            available.labels(d).set(1 if snap.available else 0)
            demand.labels(d).set(snap.queued_count())
        for name, h in store.site_health().items():
            backoff.labels(name).set(max(0.0, h.backoff_until - now))
        unsatisfiable.clear()  # a shape that went away leaves no stale series
        for d, shapes in engine.unsatisfiable.items():
            by: dict[str, int] = {}
            for u in shapes:
                by[u.constraint] = by.get(u.constraint, 0) + u.count
            for constraint, n in by.items():
                unsatisfiable.labels(d, constraint).set(n)
        open_ = engine.breakers()
        for d in engine.domains:
            breaker.labels(d).set(1 if d in open_ else 0)
            budget_blocked.labels(d).set(1 if d in engine.budget_held else 0)
            now_mode = engine.gate.mode(d)
            for m in ("act", "observe"):
                mode.labels(d, m).set(1 if m == now_mode else 0)
        gate_metrics()
        fleet.observe()

    feed = StatusFeed(engine, service.publish)
    trim = _malloc_trim()

    def iteration() -> None:
        started = time.monotonic()
        try:
            records = engine.iterate()
        except BaseException:
            heap.failed()
            raise
        for record in records:
            for a in record.actions:
                (shadow_actions if record.shadow else actions).labels(record.domain, a.kind).inc()
        fleet.recorded(records)
        seconds.observe(time.monotonic() - started)
        observe()
        feed.after_iteration(records, service.clock.now())  # what `epu status` shows at once
        heap.settle()
        trim(0)  # ~0.3 ms after a new snapshot's iteration, ~0.03 ms otherwise

    service.every(config.decision.iteration_seconds, iteration, name="iteration")
    service.engine = engine  # type: ignore[attr-defined]  # tests and the demo look inside
    service.fleet = fleet  # type: ignore[attr-defined]
    return service
