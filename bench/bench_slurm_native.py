"""Native mode (issue 35): how fast a Slurm resume becomes a launch request, and how many nodes a
minute one engine resumes.

1. **Latency** — from the engine receiving one ``slurm.power`` resume (what ``epu slurm resume``
   publishes) to the launch request leaving the engine's gate: ``Engine.handle_input`` then the
   iteration the service wakes at once (``services/decision/app.py``: a resume wakes the
   iteration with no minimum gap), on the SQLite store, in a domain already running
   ``--live`` instances. Goal: p99 ≤ 100 ms. Not included: the program's own start and the
   broker hop (``epu slurm resume --json`` reports its publish time, ``seconds``).
2. **Throughput** — ``--nodes`` nodes resumed in calls of ``--batch`` (as slurmctld batches per
   ResumeRate tick), each call followed by the woken iteration: wall time until every launch
   request has left, as nodes per minute. Goal: ≥ 300 nodes/min (Slurm's default ResumeRate).
3. **Simulated cloud** — the native simulator (``epu/sim/power.py``): a burst of ``--sim-jobs``
   one-node, whole-node jobs on as many CLOUD nodes with ResumeRate 300/min, the real engine, provisioner and
   sensor core in virtual time; the virtual minutes from the first resume call to the last node
   registered, as nodes per virtual minute (bounded by ResumeRate and the boot time).

Run: ``.venv/bin/python bench/bench_slurm_native.py [--repeat 200] [--live 200] [--nodes 3000]
[--batch 50] [--sim-jobs 600] [--json]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchjson import Results, json_mode  # noqa: E402
from epu.common.clock import ManualClock  # noqa: E402
from epu.common.config import parse_config  # noqa: E402
from epu.common.db import make_engine  # noqa: E402
from epu.common.messages import InstanceEvent, LaunchRequest, Message, SensorSnapshot, SlurmPower  # noqa: E402
from epu.services.decision.engine import Engine  # noqa: E402
from epu.services.decision.store import Store  # noqa: E402
from sqlalchemy.pool import StaticPool  # noqa: E402

T0 = 1_700_000_000.0


def engine(max_nodes: int) -> tuple[Engine, list[Message], ManualClock]:
    cfg = parse_config({
        "decision": {"store_url": "sqlite://"},
        "domains": {"d": {"native": "slurm", "max_nodes": max_nodes, "sites": ["a", "b"]}},
        "sites": {"a": {"driver": "epu-sim", "quota": max_nodes, "price_per_hour": 0.1, "cores": 4},
                  "b": {"driver": "epu-sim", "quota": max_nodes, "price_per_hour": 0.2, "cores": 4}},
    }, environ={})
    sent: list[Message] = []
    clock = ManualClock(T0)
    store = Store(make_engine("sqlite://", poolclass=StaticPool)).create()
    e = Engine(cfg, store, sent.append, clock)
    e.on_snapshot(SensorSnapshot(domain="d", backend="bench", taken_at=T0))
    return e, sent, clock


def fill(e: Engine, sent: list[Message], clock: ManualClock, live: int) -> None:
    """``live`` instances already running (launched by resumes, started)."""
    for k in range(0, live, 100):
        e.handle_input(SlurmPower(batch_id=f"fill{k}", domain="d", action="resume",
                                  nodes=[f"n{i:05d}" for i in range(k, min(live, k + 100))]))
        e.iterate()
    for m in [m for m in sent if isinstance(m, LaunchRequest)]:
        e.on_instance_event(InstanceEvent(instance_id=m.launch_id, domain="d", site=m.site, state="pending", seq=1,
                                          node_name=m.node_name, cores=m.cores, at=clock.now()))
    sent.clear()


def latency(repeat: int, live: int) -> list[float]:
    e, sent, clock = engine(max_nodes=live + repeat + 10)
    fill(e, sent, clock, live)
    out = []
    for i in range(repeat):
        clock.advance(0.5)
        msg = SlurmPower(batch_id=f"lat{i}", domain="d", action="resume", nodes=[f"r{i:05d}"])
        t0 = time.perf_counter()
        e.handle_input(msg)
        e.iterate()
        dt = time.perf_counter() - t0
        assert any(isinstance(m, LaunchRequest) and m.node_name == f"r{i:05d}" for m in sent), "no launch left"
        sent.clear()
        out.append(dt)
    return out


def throughput(nodes: int, batch: int) -> tuple[float, float]:
    e, sent, clock = engine(max_nodes=nodes + 10)
    names = [f"t{i:05d}" for i in range(nodes)]
    c0, t0 = time.process_time(), time.perf_counter()
    launched = 0
    for k in range(0, nodes, batch):
        clock.advance(0.2)
        e.handle_input(SlurmPower(batch_id=f"tp{k}", domain="d", action="resume", nodes=names[k:k + batch]))
        e.iterate()
        launched += sum(1 for m in sent if isinstance(m, LaunchRequest))
        sent.clear()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert launched == nodes, f"{launched} of {nodes} launched"
    return wall, cpu


def simulated(jobs: int) -> tuple[float, int, float]:
    """Virtual minutes from the first resume call to the last node registered, nodes registered,
    and virtual seconds from the last resume call to the last registration (the boot time, when
    the engine keeps up with Slurm's ResumeRate)."""
    from epu.sim.cloud import CloudFaults
    from epu.sim.power import PowerSpec
    from epu.sim.scenario import DomainSpec, Scenario, SiteSpec, Timing, Workload
    from epu.sim.simulation import Simulation

    slots = [f"cloud{i:04d}" for i in range(jobs)]
    sc = Scenario("bench-native", "a burst of one-node jobs", hours=0.5,
                  domain=DomainSpec(max_nodes=jobs, power=PowerSpec(slots=slots, resume_rate=300, suspend_time=600.0)),
                  sites=[SiteSpec("cloud-a", quota=jobs, boot_seconds=(60.0, 120.0), faults=CloudFaults())],
                  workload=Workload(arrivals_per_hour=0.0, burst_per_hour=0.0),
                  timing=Timing(iteration_seconds=2.0, sensor_poll_seconds=30.0))
    sim = Simulation(sc, 1)
    registered: list[float] = []
    power = sim.batch.power
    original = power.registered

    def on_registered(name: str, vm: object) -> None:
        before = power.state.get(name)
        original(name, vm)  # type: ignore[arg-type]
        if before == "up_pending" and power.state.get(name) == "up":
            registered.append(sim.world.t)

    power.registered = on_registered  # type: ignore[method-assign]
    first: list[float] = []
    calls: list[float] = []
    program = power._program

    def on_program(action: str, names: list[str], jobs: object = None) -> None:
        if action == "resume":
            calls.append(sim.world.t)
            if not first:
                first.append(sim.world.t)
        program(action, names, jobs)  # type: ignore[arg-type]

    power._program = on_program  # type: ignore[method-assign]
    sim.world.at(sim.world.start + 60.0, lambda: sim.batch.inner.submit(cores=4, nodes=1, duration=1200.0, count=jobs),
                 "burst")
    sim.run()
    sim.close()
    if not registered or not first:
        return float("nan"), 0, float("nan")
    return (max(registered) - first[0]) / 60.0, len(registered), max(registered) - max(calls)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--live", type=int, default=200)
    ap.add_argument("--nodes", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--sim-jobs", type=int, default=600)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    res = Results("slurm_native")
    with json_mode(args.json):
        lat = latency(args.repeat, args.live)
        lat_sorted = sorted(lat)
        p99 = lat_sorted[max(0, int(len(lat) * 0.99) - 1)]
        print(f"resume -> launch request left the engine ({args.live} live instances, {args.repeat} calls): "
              f"median {statistics.median(lat) * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, max {max(lat) * 1000:.1f} ms "
              "(goal p99 <= 100 ms)")
        res.add(f"resume to launch request, p99 ({args.live} live)", unit="ms", wall=[p99], scale=1000,
                goal="<= 100 ms", median_ms=round(statistics.median(lat) * 1000, 2))
        wall, cpu = throughput(args.nodes, args.batch)
        rate = args.nodes / wall * 60
        print(f"throughput: {args.nodes} nodes in calls of {args.batch}: {wall:.2f} s wall ({cpu:.2f} s CPU) = "
              f"{rate:,.0f} nodes/min (goal >= 300)")
        res.add(f"resume throughput ({args.nodes} nodes, calls of {args.batch})", unit="nodes/min",
                wall=[rate], goal=">= 300", seconds=round(wall, 2), cpu_seconds=round(cpu, 2))
        if args.sim_jobs:
            minutes, n, lag = simulated(args.sim_jobs)
            print(f"simulated cloud: {n} of {args.sim_jobs} nodes registered {minutes:.1f} virtual min after the "
                  f"first resume call = {n / minutes if minutes else 0:,.0f} nodes/virtual min; the last "
                  f"{lag:.0f} s after Slurm's last resume call (ResumeRate 300/min, boot 60-120 s)")
            res.add(f"simulated cloud: nodes registered per virtual minute ({args.sim_jobs} one-node jobs)",
                    unit="nodes/min", wall=[n / minutes if minutes else 0.0], registered=n, minutes=round(minutes, 2),
                    last_registration_after_last_call_s=round(lag, 1))
    if args.json:
        res.emit()


if __name__ == "__main__":
    main()
