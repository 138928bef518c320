"""Speed of ``epu simulate``: CPU per simulated job, per engine iteration, per simulated hour.

    .venv/bin/python bench/bench_simulate.py [DAYS] [REPEATS] [--json]   (default 0.5 day of NASA, 1 repeat)

Runs a window of the NASA iPSC/860 trace (128 1-core nodes, queue-demand) through the real
cores twice in this process — with the engine's idle iterations skipped (the default) and with
every iteration run (the baseline) — and the static baseline, and prints min/median/max of CPU
seconds. The machine is shared: CPU time is the figure to compare, wall time is shown too.
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchjson import Results, json_mode  # noqa: E402

from epu.simulate.plan import run_plan  # noqa: E402
from epu.simulate.scenarios import nasa  # noqa: E402
from epu.simulate.static import static_summary  # noqa: E402
from epu.workloads.transform import window  # noqa: E402


def main() -> None:
    as_json = "--json" in sys.argv
    argv = [a for a in sys.argv[1:] if a != "--json"]
    days = float(argv[0]) if argv else 0.5
    repeats = int(argv[1]) if len(argv) > 1 else 1
    results = Results("simulate")
    with json_mode(as_json):
        run(days, repeats, results)
    if as_json:
        results.emit()


def run(days: float, repeats: int, results: Results) -> None:
    plan = nasa(None)(1)
    plan.workload = window(plan.workload, 0.0, days)
    jobs = len(plan.workload.jobs)
    print(f"NASA iPSC/860, first {days:g} day(s): {jobs} jobs, 128 1-core nodes, queue-demand (idle_seconds 0)")
    for label, skip in (("skip idle iterations (default)", True), ("every iteration (baseline)", False)):
        cpu, wall, last = [], [], {}
        for _ in range(repeats):
            s = run_plan(plan, options=replace(plan.options, skip_idle=skip))
            cpu.append(s["cpu_seconds"])
            wall.append(s["wall_seconds"])
            last = s
        med = statistics.median(cpu)
        results.add(label, unit="s", wall=wall, cpu=cpu, jobs=jobs, launches=last["launches"],
                    simulated_hours=round(last["simulated_hours"], 1),
                    engine_ms_per_iteration=last.get("engine_ms_per_iteration"),
                    baseline="every iteration (baseline)" if skip else None)
        print(f"{label}: CPU s min/median/max {min(cpu):.1f}/{med:.1f}/{max(cpu):.1f}, wall median "
              f"{statistics.median(wall):.1f}; {last['simulated_hours']:.1f} h simulated, "
              f"{last['launches']} launches, {last['engine_iterations']} engine iterations run, "
              f"{last['engine_iterations_skipped']} skipped")
        per_iter = last.get("engine_ms_per_iteration")
        print(f"   per simulated job {1000 * med / jobs:.1f} ms CPU; per launch {1000 * med / max(1, last['launches']):.1f} ms;"
              + (f" per engine iteration {per_iter:.2f} ms (inside Engine.iterate);" if per_iter else "")
              + f" {last['simulated_hours'] / med * 60:.0f} simulated hours per CPU minute")
    t = time.process_time()
    static_summary(plan.workload, 128, 1, 0.1)
    static = time.process_time() - t
    results.add("static baseline", unit="s", cpu=[static])
    print(f"static baseline of the same window: {static:.2f} s CPU")


if __name__ == "__main__":
    main()
