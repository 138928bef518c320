"""Fault schedules: each function returns a ``Fault`` that, given a simulation, schedules one
kind of trouble over the fault phase at random times drawn from the world's streams.

Knobs that are rates on every call (cloud API errors, message delays...) live in
``CloudFaults`` and ``MessageFaults`` on the scenario; the ones here are *episodes* — a
crash, an outage, a window of partial snapshots — with a start and an end.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING

from epu.common.messages import PolicyChange, new_id
from epu.sim.bus import snapshot_queue
from epu.sim.scenario import Fault

if TYPE_CHECKING:
    from epu.sim.processes import Proc
    from epu.sim.simulation import Simulation


def _episodes(sim: Simulation, stream: str, per_hour: float, length: tuple[float, float],
              start: Callable[[], None], stop: Callable[[], None], *, first_after: float = 600.0) -> None:
    """Poisson episodes over the fault phase; each runs ``start`` then ``stop`` after a length
    drawn from ``length``. Episodes do not overlap."""
    rng = sim.world.rng(stream)
    t = sim.world.start + first_after
    while per_hour > 0:
        t += rng.expovariate(per_hour / 3600.0)
        if t >= sim.fault_end:
            break
        dur = rng.uniform(*length)
        sim.world.at(t, start, f"fault {stream} start")
        sim.world.at(min(t + dur, sim.fault_end), stop, f"fault {stream} stop")
        t += dur


def _restart_later(sim: Simulation, proc: Proc, down: tuple[float, float], stream: str) -> None:
    delay = sim.world.rng(stream).uniform(*down)

    def up() -> None:
        if not proc.alive:
            proc.start()
            sim.pipeline_changed()

    sim.world.after(delay, up, f"restart {proc.name}")


# ---------------------------------------------------------------------- processes


def crashes(kind: str, per_hour: float, down: tuple[float, float] = (5.0, 120.0),
            mid_step: float = 0.5) -> Fault:
    """Crash a process of ``kind`` (decision, provisioner, sensor) at random times, restarting it
    from its store after ``down`` seconds. With probability ``mid_step`` the crash hits inside
    a step — at its next publish, between storing a plan and sending it, before a store write,
    or right after a cloud create returned — instead of between two steps."""

    def fault(sim: Simulation) -> None:
        procs = [p for p in sim.procs if p.kind == kind]
        if not procs:
            return
        rng = sim.world.rng(f"crash/{kind}")
        t = sim.world.start + 300.0
        while per_hour > 0:
            t += rng.expovariate(per_hour / 3600.0)
            if t >= sim.fault_end:
                break
            proc = rng.choice(procs)
            how = rng.random()
            where = rng.choice(("publish", "commit-after", "commit-before", "write", "create"))

            def hit(proc: Proc = proc, how: float = how, where: str = where) -> None:
                if not proc.alive:
                    return
                if how < mid_step:
                    if where == "publish":
                        proc.crash_at_publish = 1 + int(sim.world.rng("crash/n").random() * 3)
                    elif where.startswith("commit") and proc.kind == "decision":
                        proc.crash_at_commit = where.split("-")[1]  # type: ignore[attr-defined]
                    elif where == "write" and proc.kind == "provisioner":
                        proc.store_faults.crash_next_write = True  # type: ignore[attr-defined]
                    elif where == "create" and proc.kind == "provisioner":
                        proc.crash_after_create = True  # type: ignore[attr-defined]
                    else:
                        proc.crash_at_publish = 1

                    def disarm() -> None:  # never armed past the fault phase
                        proc.crash_at_publish = 0

                    sim.world.at(sim.fault_end - 1.0, disarm, "disarm")
                else:
                    proc.crash("fault: killed")  # ``watch`` below restarts it

            sim.world.at(t, hit, f"fault crash {kind}")

        def watch(proc: Proc) -> None:
            sim.pipeline_changed()
            if sim.world.t < sim.fault_end:
                _restart_later(sim, proc, down, f"crash/{kind}/down")

        for p in procs:
            p.on_crash.append(watch)

    return fault


def outbox_delays(per_hour: float, share: tuple[float, float] = (0.3, 1.0),
                  length: tuple[float, float] = (120.0, 1200.0)) -> Fault:
    """The provisioners' transitions are published late: for a while, a share of their
    instance-event publishes get no confirm (a timeout under load, a publish refused by one full
    queue), so each waits in the store's outbox for a sweep (``outbox_seconds`` later, and again
    while confirms keep failing) — while the periodic ``instance.report`` goes out on time and
    reaches the engine first: a report overtakes the event it summarizes (issue 33)."""

    def fault(sim: Simulation) -> None:
        rng = sim.world.rng("outbox/share")

        def start() -> None:
            value = rng.uniform(*share)
            for p in sim.provisioners:
                p.unconfirmed_share = value

        def stop() -> None:
            for p in sim.provisioners:
                p.unconfirmed_share = 0.0

        _episodes(sim, "outbox", per_hour, length, start, stop, first_after=300.0)

    return fault


def broker_outages(per_hour: float, length: tuple[float, float] = (10.0, 300.0)) -> Fault:
    """RabbitMQ down: every publish fails, nothing is delivered; the runtimes notice within
    seconds and reconnect when it is back."""

    def fault(sim: Simulation) -> None:
        rng = sim.world.rng("broker/notice")

        def flip(up: bool) -> None:
            if sim.bus.broker_up == up:
                return
            sim.bus.set_broker(up)
            for p in sim.procs:
                p.broker_changed(up, rng.uniform(0.5, 10.0))
            sim.pipeline_changed()

        _episodes(sim, "broker", per_hour, length, lambda: flip(False), lambda: flip(True))

    return fault


def engine_partition(per_hour: float, length: tuple[float, float] = (30.0, 600.0),
                     broker_notices: tuple[float, float] = (10.0, 60.0),
                     engine_notices: tuple[float, float] = (0.0, 90.0)) -> Fault:
    """The active engine's broker connection drops (its host is cut off) while a standby runs:
    the broker hands the input queue to the standby after a heartbeat timeout, and the cut-off
    engine notices on its own schedule, then reconnects when the network is back."""

    def fault(sim: Simulation) -> None:
        rng = sim.world.rng("partition")
        victim: list[Proc] = []

        def start() -> None:
            holder = sim.bus.sac_holder(snapshot_queue(sim.domain))
            if holder is None or not holder.link_up:
                return
            victim.append(holder)
            holder.drop_link(rng.uniform(*broker_notices), rng.uniform(*engine_notices))
            sim.pipeline_changed()

        def stop() -> None:
            while victim:
                p = victim.pop()
                p.restore_link(rng.uniform(1.0, 30.0))
            sim.pipeline_changed()

        _episodes(sim, "partition", per_hour, length, start, stop)

    return fault


def consumer_cancellations(per_hour: float, length: tuple[float, float] = (60.0, 1800.0)) -> Fault:
    """The broker cancels one engine's consumer on *one* of its single-active-consumer queues (a
    queue's leader moved, a node of the cluster was lost) and hands that queue to the other
    engine, while the first keeps the others: for a stretch the input queue (results, instance
    events, reports), a domain's snapshot queue and the control queue are consumed by different
    engines, which then both write the same instance rows. At the end of the stretch the queue
    goes back (the other engine's consumer is cancelled in turn)."""

    def fault(sim: Simulation) -> None:
        rng = sim.world.rng("cancel")
        names = ["decision.input", snapshot_queue(sim.domain), "decision.control"]
        moved: list[tuple[str, object]] = []

        def start() -> None:
            q = sim.bus.queues.get(rng.choice(names))
            if q is None or len(q.consumers) < 2:
                return
            current = q.pick()
            others = [c for c in q.consumers if c is not current and c.owner.registered]
            if current is None or not others:
                return
            moved.append((q.name, current))
            q.active = rng.choice(others)
            sim.bus.flush(q)
            sim.pipeline_changed()

        def stop() -> None:
            while moved:
                name, before = moved.pop()
                q = sim.bus.queues[name]
                if before in q.consumers and before.owner.registered:  # type: ignore[attr-defined]
                    q.active = before  # type: ignore[assignment]
                    sim.bus.flush(q)
            sim.pipeline_changed()

        _episodes(sim, "cancel", per_hour, length, start, stop)

    return fault


def store_write_failures(per_hour: float, length: tuple[float, float] = (1.0, 10.0),
                         which: str = "both") -> Fault:
    """The database refuses writes for a few seconds ("database is locked", a failover)."""

    def fault(sim: Simulation) -> None:
        targets = []
        if which in ("both", "decision"):
            targets.append(sim.decision_faults)
        if which in ("both", "provisioner"):
            targets += list(sim.provisioner_faults.values())
        rng = sim.world.rng("store/which")

        def start() -> None:
            f = rng.choice(targets)
            f.failing_until = sim.world.t + rng.uniform(*length)

        _episodes(sim, "store", per_hour, (0.0, 0.0), start, lambda: None)

    return fault


class FailoverError(Exception):
    """What the PostgreSQL driver raises during a failover (psycopg's ``ReadOnlySqlTransaction``,
    ``InFailedSqlTransaction``, ``AdminShutdown``): ``common.failures`` judges it by its SQLSTATE
    alone, as it judges the real one."""

    def __init__(self, sqlstate: str, text: str) -> None:
        super().__init__(text)
        self.sqlstate = sqlstate


#: (SQLSTATE, message, SQLAlchemy wrapper, weight): what a writer meets while the primary fails
#: over — its session cut (57P01), the demoted primary or a standby answering read-only (25006),
#: a transaction an earlier failure aborted (25P02).
_FAILOVER_ANSWERS = (
    ("57P01", "terminating connection due to administrator command", "OperationalError", 0.1),
    ("25006", "cannot execute INSERT in a read-only transaction", "InternalError", 0.7),
    ("25P02", "current transaction is aborted, commands ignored until end of transaction block",
     "InternalError", 0.2),
)


def store_failover(per_hour: float, length: tuple[float, float] = (20.0, 120.0), which: str = "decision",
                   pause_during: bool = True) -> Fault:
    """A PostgreSQL failover (issue 33, defect 7): for ``length`` seconds every write to the
    engines' (``which="decision"``), the provisioners' or both stores is answered as a client
    meets a failover — its session cut, then read-only (SQLSTATE 25006) or aborted-transaction
    (25P02) answers — while reads go on. With ``pause_during`` an operator pauses the domain a
    few seconds into each window (the change in flight while nothing can be stored) and resumes
    it a while after: each must be applied once the database takes writes again (invariant 7),
    never dead-lettered as the message's fault."""

    def fault(sim: Simulation) -> None:
        from sqlalchemy import exc as sa

        targets = []
        if which in ("both", "decision"):
            targets.append(sim.decision_faults)
        if which in ("both", "provisioner"):
            targets += list(sim.provisioner_faults.values())
        rng = sim.world.rng("store/failover")
        weights = [w for *_, w in _FAILOVER_ANSWERS]

        def answer(statement: str) -> Exception:
            state, text, wrapper, _ = rng.choices(_FAILOVER_ANSWERS, weights)[0]
            return getattr(sa, wrapper)(statement, None, FailoverError(state, f"simulated: {text}"))

        def start() -> None:
            for f in targets:
                f.failover_until = float("inf")
                f.failover_error = answer
            sim.world.note("store failover: writes answered read-only")
            if pause_during and sim.world.t < sim.fault_end - 120.0:
                sim.world.after(rng.uniform(1.0, 15.0), lambda: _change(sim, paused=True), "operator pause (failover)")

        def stop() -> None:
            for f in targets:
                f.failover_until = -1.0
            sim.world.note("store failover over: writes taken")
            if pause_during:
                back = min(sim.world.t + rng.uniform(30.0, 600.0), sim.fault_end - 30.0)
                sim.world.at(max(back, sim.world.t), lambda: _change(sim, paused=False), "operator resume (failover)")

        _episodes(sim, "store/failover", per_hour, length, start, stop)

    return fault


# ---------------------------------------------------------------------- batch system


def batch_outages(per_hour: float, length: tuple[float, float] = (30.0, 900.0)) -> Fault:
    """The batch controller is down: snapshots ``available=False``, commands fail transiently."""

    def fault(sim: Simulation) -> None:
        def flip(down: bool) -> None:
            sim.batch.faults.down = down
            sim.pipeline_changed()

        _episodes(sim, "batch/down", per_hour, length, lambda: flip(True), lambda: flip(False))

    return fault


def site_outages(site: str, per_hour: float, length: tuple[float, float] = (600.0, 2400.0)) -> Fault:
    """A whole site's API fails (every call errors) for a while: native mode must fail over, and
    give back what no site can serve, rather than leave Slurm's nodes to time out."""

    def fault(sim: Simulation) -> None:
        cloud = sim.clouds[site]
        normal = cloud.faults.transient_error_rate

        def flip(down: bool) -> None:
            cloud.faults.transient_error_rate = 1.0 if down else normal
            sim.world.note(f"site {site} {'down' if down else 'back'}")

        _episodes(sim, f"site/{site}/down", per_hour, length, lambda: flip(True), lambda: flip(False))

    return fault


def slurm_program_faults(lost: float = 0.0, duplicated: float = 0.0) -> Fault:
    """Slurm's power-saving programs: a share of calls lost (the program killed, the broker out of
    reach from the head node), a share of resume calls made twice (native mode, ``epu.sim.power``)."""

    def fault(sim: Simulation) -> None:
        assert sim.batch.power is not None, "slurm_program_faults needs a native-mode scenario"
        sim.batch.power.faults.lost_calls = lost
        sim.batch.power.faults.duplicate_calls = duplicated

        def off() -> None:
            sim.batch.power.faults.lost_calls = 0.0
            sim.batch.power.faults.duplicate_calls = 0.0

        sim.world.at(sim.fault_end, off, "slurm program faults stop")

    return fault


def slurmctld_restarts(per_hour: float, down: tuple[float, float] = (20.0, 300.0)) -> Fault:
    """slurmctld restarts while nodes power up (native mode): down for a while (snapshots
    unavailable, commands fail), then it resumes again every node still powering up."""

    def fault(sim: Simulation) -> None:
        assert sim.batch.power is not None, "slurmctld_restarts needs a native-mode scenario"
        rng = sim.world.rng("slurmctld/restart")
        t = sim.world.start + 600.0
        while per_hour > 0:
            t += rng.expovariate(per_hour / 3600.0)
            if t >= sim.fault_end:
                break
            length = rng.uniform(*down)

            def restart(length: float = length) -> None:
                sim.batch.power.restart(length)
                sim.pipeline_changed()
                sim.world.call_after(length, sim.pipeline_changed, "slurmctld back: pipeline")

            sim.world.at(t, restart, "fault slurmctld restart")
            t += length

    return fault


def nodes_missing(per_hour: float, share: tuple[float, float] = (0.2, 1.0),
                  length: tuple[float, float] = (30.0, 400.0)) -> Fault:
    """Nodes vanish from snapshots while they keep running jobs (an HTCondor collector
    restart, a slurmctld restart): ``share`` of them, for a while."""

    def fault(sim: Simulation) -> None:
        rng = sim.world.rng("batch/missing/share")

        def start() -> None:
            sim.batch.faults.missing_share = rng.uniform(*share)

        def stop() -> None:
            sim.batch.faults.missing_share = 0.0

        _episodes(sim, "batch/missing", per_hour, length, start, stop)

    return fault


def collector_losses(per_hour: float, nodes: tuple[int, int] = (1, 3),
                     length: tuple[float, float] = (900.0, 3600.0)) -> Fault:
    """HTCondor as two views: the collector loses the ads of a few live workers (a restart or HA
    switch that they re-advertise to late, lost UDP updates, an expired ad) for long stretches —
    past the stall limit — while the schedd still shows their jobs. Few at a time, so the
    engine's circuit breaker does not open."""

    def fault(sim: Simulation) -> None:
        rng = sim.world.rng("batch/collector")
        t = sim.world.start + 600.0
        while per_hour > 0:
            t += rng.expovariate(per_hour / 3600.0)
            if t >= sim.fault_end:
                break
            count, dur = rng.randint(*nodes), rng.uniform(*length)
            sim.world.at(t, lambda count=count, dur=dur: _lose(sim, rng, count, dur), "fault collector loses ads")

    return fault


def _lose(sim: Simulation, rng: random.Random, count: int, dur: float) -> None:
    batch = sim.batch
    live = sorted(name for name in batch.serving if batch.inner.node(name) is not None and not batch.lost(name))
    for name in rng.sample(live, min(count, len(live))):
        batch.collector_lost[name] = sim.world.t + dur
        sim.world.note(f"collector lost the ads of {name} for {dur:.0f}s")


def stale_snapshots(per_hour: float, age: tuple[float, float] = (60.0, 600.0),
                    length: tuple[float, float] = (60.0, 600.0)) -> Fault:
    """Snapshots show the cluster as it was ``age`` seconds ago, for a while."""

    def fault(sim: Simulation) -> None:
        rng = sim.world.rng("batch/stale/age")

        def start() -> None:
            sim.batch.faults.stale_seconds = rng.uniform(*age)

        def stop() -> None:
            sim.batch.faults.stale_seconds = 0.0

        _episodes(sim, "batch/stale", per_hour, length, start, stop)

    return fault


def process_clocks(skew: tuple[float, float] = (-600.0, 600.0), drift_ppm: tuple[float, float] = (-300.0, 300.0),
                   steps_per_hour: float = 1.5, step: tuple[float, float] = (30.0, 3600.0),
                   length: tuple[float, float] = (120.0, 1800.0)) -> Fault:
    """Every sensor, engine and provisioner has its own wall clock: a steady skew and a drift
    drawn per process at the start, and now and then one process's clock is stepped by ``step``
    seconds, forward or back, until NTP steps it back the other way (``length`` later). What
    each process's core sees is its own clock; the world (and the broker's TTLs) keep true time."""

    def fault(sim: Simulation) -> None:
        rng = sim.world.rng("clocks/process")
        procs = [p for p in sim.procs if hasattr(p, "clock")]
        for p in procs:
            p.clock.offset += rng.uniform(*skew)  # type: ignore[attr-defined]
            p.clock.set_drift(rng.uniform(*drift_ppm) * 1e-6)  # type: ignore[attr-defined]
        stepped: list[tuple[Proc, float]] = []

        def start() -> None:
            p = procs[rng.randrange(len(procs))]
            delta = rng.uniform(*step) * rng.choice((-1.0, 1.0))
            p.clock.step(delta)  # type: ignore[attr-defined]
            stepped.append((p, delta))
            sim.world.note(f"clock of {p.name} stepped {delta:+.0f}s")

        def stop() -> None:
            while stepped:
                p, delta = stepped.pop()
                p.clock.step(-delta)  # type: ignore[attr-defined]
                sim.world.note(f"clock of {p.name} stepped {-delta:+.0f}s (NTP)")

        _episodes(sim, "clocks/step", steps_per_hour, length, start, stop, first_after=300.0)

    return fault


def adversary(per_hour: float = 2.0, length: tuple[float, float] = (300.0, 1800.0),
              domain: str = "intruder") -> Fault:
    """A stolen credential: the sensor of another domain (``domain``) forges, in episodes, well-
    formed messages within its own permissions against the simulated domain (``adversary.py``):
    a ``remove ok`` for every node command at once, idle snapshots, terminated events. The bus
    gives every process its own broker user from the generated definitions."""

    def fault(sim: Simulation) -> None:
        from epu.sim.adversary import AdversaryProc
        from epu.sim.bus import Identities

        sim.bus.identities = Identities([sim.domain, domain])
        adv = AdversaryProc(sim.world, sim.bus, domain, sim.domain)
        sim.adversary = adv  # type: ignore[attr-defined]

        def forge() -> None:
            if not adv.active:
                return
            core = sim.sensor.core
            last = core.last_snapshot if core is not None else None
            live = [(vm.launch_id, cloud.name) for cloud in sim.clouds.values() for vm in cloud.live_vms()
                    if vm.domain == sim.domain and vm.launch_id]
            adv.forge_state(list(last.nodes) if last is not None else [], live)  # type: ignore[arg-type]
            sim.world.after(60.0, forge, "adversary forges state")

        def start() -> None:
            adv.active = True
            forge()

        def stop() -> None:
            adv.active = False

        _episodes(sim, "adversary", per_hour, length, start, stop, first_after=300.0)

    return fault


def sensor_clock_steps(per_hour: float, step: tuple[float, float] = (30.0, 3600.0),
                       length: tuple[float, float] = (60.0, 1800.0)) -> Fault:
    """The sensor host's clock steps back by ``step`` seconds (NTP correction), then forward."""

    def fault(sim: Simulation) -> None:
        rng = sim.world.rng("sensor/clock/step")

        def start() -> None:
            sim.sensor.clock.offset = -rng.uniform(*step)

        def stop() -> None:
            sim.sensor.clock.offset = 0.0

        _episodes(sim, "sensor/clock", per_hour, length, start, stop)

    return fault


def _next_commands(name: str, field: str, per_hour: float, count: tuple[int, int]) -> Fault:
    """Episodes at ``per_hour`` that set ``BatchFaults.<field>``: the next 1..N node commands go wrong."""

    def fault(sim: Simulation) -> None:
        rng = sim.world.rng(f"{name}/n")

        def start() -> None:
            setattr(sim.batch.faults, field, rng.randint(*count))

        _episodes(sim, name, per_hour, (0.0, 0.0), start, lambda: None)

    return fault


def command_failures(per_hour: float, count: tuple[int, int] = (1, 4)) -> Fault:
    """The next few node commands fail transiently (a timeout), then succeed."""
    return _next_commands("batch/cmdfail", "failing_commands", per_hour, count)


def lost_command_answers(per_hour: float, count: tuple[int, int] = (1, 3)) -> Fault:
    """The next few node commands take effect but answer with a timeout (``BatchFaults.answers_lost``)."""
    return _next_commands("batch/lostanswer", "answers_lost", per_hour, count)


def condor_preemptions(per_hour: float, named_share: float = 0.5) -> Fault:
    """HTCondor preemption without a drain (issue 33): at random times the cloud reclaims a running
    worker at once — no interruption notice, no drain, no shutdown of EPU's in flight — and its
    daemons withdraw their ads as the machine goes down, so the collector has none at once and the
    sensor remembers no shutdown to ask about. ``named_share`` of the reclaims are listed as a spot
    preemption (EC2's state reason: the instance ends ``preempted``); the rest just drop out of the
    listings (a cloud that does not say why: the record is presumed gone, and the engine retires it
    the safe way). Either way the node's ``remove`` must be answered within a bound — it was
    answered "unknown" for ever, and the instance never left the engine's cleanup."""

    def fault(sim: Simulation) -> None:
        rng = sim.world.rng("condor/preempt")

        def reclaim() -> None:
            live = sorted((vm for vm in sim.batch.serving.values() if vm.terminated_at is None
                           and vm.domain == sim.domain), key=lambda v: v.cloud_id)
            if not live:
                return
            vm = rng.choice(live)
            cloud = sim.clouds[vm.site]
            cloud._accident(vm, "preempt" if rng.random() < named_share else "vanish")
            sim.batch.withdraw_ads(vm)
            sim.world.note(f"cloud reclaimed {vm.cloud_id} ({vm.cause}) without a drain; its ads withdrawn")

        t = sim.world.start + 600.0
        while per_hour > 0:
            t += rng.expovariate(per_hour / 3600.0)
            if t >= sim.fault_end:
                break
            sim.world.at(t, reclaim, "fault condor preemption")

    return fault


# ---------------------------------------------------------------------- operators


def operator_actions(per_hour: float, *, terminate_share: float = 0.3, force_share: float = 0.3,
                     pause_share: float = 0.2) -> Fault:
    """An operator at random times: bounds changes, a pause (resumed later), an unforced or a
    forced ``epu instances terminate`` of a random live instance."""

    def fault(sim: Simulation) -> None:
        rng = sim.world.rng("operator")
        d = sim.scenario.domain
        t = sim.world.start + 600.0
        while per_hour > 0:
            t += rng.expovariate(per_hour / 3600.0)
            if t >= sim.fault_end - 60:
                break
            r = rng.random()
            if r < terminate_share:
                sim.world.at(t, lambda force=rng.random() < force_share: _terminate_one(sim, force),
                             "operator terminate")
            elif r < terminate_share + pause_share:
                sim.world.at(t, lambda: _change(sim, paused=True), "operator pause")
                back = min(t + rng.uniform(60.0, 1800.0), sim.fault_end - 30)
                sim.world.at(back, lambda: _change(sim, paused=False), "operator resume")
            else:
                hi = rng.randint(max(d.min_nodes, 2), d.max_nodes)
                lo = rng.randint(0, min(hi, 3))
                sim.world.at(t, lambda lo=lo, hi=hi: _change(sim, min_nodes=lo, max_nodes=hi), "operator bounds")
        # give the domain its file bounds back for the quiet phase
        sim.world.at(sim.fault_end - 20, lambda: _change(sim, min_nodes=d.min_nodes, max_nodes=d.max_nodes,
                                                         paused=False), "operator restores bounds")

    return fault


def observe_switches(per_hour: float, *, hold: tuple[float, float] = (120.0, 1800.0)) -> Fault:
    """An operator switches the domain to observe mode (``epu policy set mode=observe``) at random
    times and back to act after ``hold`` seconds — while launches, terminates and node commands are
    open (lost answers, unanswered launches, terminates not yet finished). Nothing may leave the
    engine while in observe mode (invariant 11); back in act, the open intents go on."""

    def fault(sim: Simulation) -> None:
        rng = sim.world.rng("operator/observe")
        t = sim.world.start + 300.0
        while per_hour > 0:
            t += rng.expovariate(per_hour / 3600.0)
            if t >= sim.fault_end - 60:
                break
            back = min(t + rng.uniform(*hold), sim.fault_end - 30)
            sim.world.at(t, lambda: _change(sim, mode="observe"), "operator observe")
            sim.world.at(back, lambda: _change(sim, mode="act"), "operator act")
            t = back
        sim.world.at(sim.fault_end - 20, lambda: _change(sim, mode="act"), "operator act (quiet phase)")

    return fault


def operator_terminates_booting(per_hour: float, *, around_boot: tuple[float, float] = (-5.0, 15.0)) -> Fault:
    """An operator's unforced ``epu instances terminate`` of an instance that is booting: at random
    times, a live VM of the domain whose boot is due within ``-around_boot[0]`` seconds or done at
    most ``around_boot[1]`` seconds ago (the operator's list still shows it ``pending``: the
    provisioner polls every 30 s). On HTCondor its startd may register and take a job before the
    engine hears that the VM runs; a moment with no such VM passes without a terminate."""

    def fault(sim: Simulation) -> None:
        rng = sim.world.rng("operator/booting")
        t = sim.world.start + 600.0
        while per_hour > 0:
            t += rng.expovariate(per_hour / 3600.0)
            if t >= sim.fault_end - 60:
                break
            sim.world.at(t, lambda: _terminate_booting(sim, around_boot), "operator terminate (booting)")

    return fault


def _terminate_booting(sim: Simulation, around_boot: tuple[float, float]) -> None:
    now = sim.world.t
    booting = sorted((vm for c in sim.clouds.values() for vm in c.live_vms()
                      if vm.domain == sim.domain and vm.launch_id is not None and not vm.boot_fails
                      and around_boot[0] <= now - vm.boot_at <= around_boot[1]), key=lambda v: v.cloud_id)
    if booting:
        vm = sim.world.rng("operator/booting/pick").choice(booting)
        sim.operator_terminate(vm.launch_id, False)  # type: ignore[arg-type]


def engine_restarts_with_file_edits(per_hour: float) -> Fault:
    """An administrator edits the domain's section of the config file (``max_nodes`` one lower, or
    back) and restarts the engine(s), at random times."""

    def fault(sim: Simulation) -> None:
        rng = sim.world.rng("file-edit")
        d = sim.scenario.domain
        t = sim.world.start + 900.0
        edits = [0]

        def restart() -> None:
            edits[0] += 1
            delta = edits[0] % 2
            for e in sim.engines:
                e.config = sim.edit_domain(max_nodes=d.max_nodes - delta)
                e.crash("administrator restarts the engine after editing the file")
                sim.world.after(rng.uniform(5.0, 60.0), e.start, f"restart {e.name}")
            sim.pipeline_changed()

        while per_hour > 0:
            t += rng.expovariate(per_hour / 3600.0)
            if t >= sim.fault_end - 120:
                break
            sim.world.at(t, restart, "file edit and engine restart")

    return fault


def _change(sim: Simulation, **fields: object) -> None:
    sim.operator.send(PolicyChange(change_id=new_id(), domain=sim.domain, operator="sim", **fields))  # type: ignore[arg-type]


def _terminate_one(sim: Simulation, force: bool) -> None:
    rng = sim.world.rng("operator/pick")
    live = sorted((vm for c in sim.clouds.values() for vm in c.live_vms() if vm.domain == sim.domain),
                  key=lambda v: v.cloud_id)
    if not live:
        return
    vm = rng.choice(live)
    if vm.launch_id is None:
        return
    sim.operator_terminate(vm.launch_id, force)


