"""Benchmark: simulated hours per CPU minute of the fault simulator (``epu sim``).

What is measured: the CPU time (``time.process_time``, so other load on a shared machine
matters less than for wall time) of whole runs — the real engine, provisioner and sensor core,
the engine's and the provisioner's stores in memory (their ``memstore``), the simulated cloud,
batch system and bus, and every invariant check —
and the virtual time they cover. Two workloads on a domain of up to 50 nodes:

* ``baseline`` — the bursty fault-free scenario (the cluster grows to tens of nodes in bursts and
  shrinks back; long quiet stretches);
* ``domain-50`` — a domain kept near 50 busy nodes for hours (the steady heavy case).

Each over ``--seeds`` seeds; min / median / max of the per-run rate and the total. The target
of issue 11 is 1,000 simulated hours per CPU minute; see docs/performance.md for where the time
goes (now shared by the sensor's snapshots, the provisioner's polls and the engine).

    .venv/bin/python bench/bench_sim.py [--seeds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchjson import Results, json_mode, stats  # noqa: E402

from epu.sim.scenario import Scenario, Workload  # noqa: E402
from epu.sim.scenarios import get_scenario  # noqa: E402
from epu.sim.simulation import Simulation  # noqa: E402

RESULTS = Results("sim")


def domain_50() -> Scenario:
    return Scenario("domain-50", "a domain near 50 busy nodes for hours", hours=6.0,
                    workload=Workload(arrivals_per_hour=140.0, burst_per_hour=0.0, cores=(4,), nodes=(1,),
                                      duration=(1200.0, 1800.0)))


def measure(make: object, seeds: list[int]) -> None:
    rates, hours, cpu = [], 0.0, 0.0
    name = ""
    for seed in seeds:
        sc = make() if callable(make) else get_scenario(str(make))
        name = sc.name
        r = Simulation(sc, seed).run()
        assert r.ok, f"{sc.name} seed {seed}: {r.violations[0]}"
        h = r.simulated_seconds / 3600.0
        rates.append(h / r.cpu_seconds * 60.0)
        hours += h
        cpu += r.cpu_seconds
    RESULTS.add(name, unit="simulated h per CPU minute", rate=stats(rates, digits=1), runs=len(seeds),
                simulated_hours=round(hours, 1), cpu_s=round(cpu, 1))
    print(f"{name:10s}: {len(seeds)} runs, {hours:7.1f} simulated h in {cpu:6.1f} s CPU = "
          f"{hours / cpu * 60:6.0f} h per CPU minute (per run min {min(rates):.0f} / median "
          f"{statistics.median(rates):.0f} / max {max(rates):.0f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout (bench/benchjson.py)")
    args = ap.parse_args()
    with json_mode(args.json):
        print(f"# python {sys.version.split()[0]}, {os.cpu_count()} cpu, load average "
              f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        seeds = list(range(1, args.seeds + 1))
        measure("baseline", seeds)
        measure(domain_50, seeds)
    if args.json:
        RESULTS.emit()


if __name__ == "__main__":
    main()
