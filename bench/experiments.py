"""Run the named experiments of ``epu simulate`` and the policy comparisons of docs/experiments.md.

    .venv/bin/python bench/experiments.py [OUT]            (default results/experiments)
    .venv/bin/python bench/experiments.py OUT fig3 fig6    only some parts

Writes, per part, the results folder of each run (report.html, plots) and ``OUT/figures.json``
with every summary; docs/experiments.md quotes those figures and shows the plots it copies to
docs/figures/. Timings vary with the machine (the simulated figures do not: same seed, same
figures).
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from epu.simulate.plan import Plan, run_compare, run_plan  # noqa: E402
from epu.simulate.scenarios import SCENARIOS, epu_fig3  # noqa: E402

FIGS = ROOT / "docs" / "figures"


def scenario(name: str, out: Path, seed: int = 1) -> dict[str, Any]:
    t = time.perf_counter()
    s = run_plan(SCENARIOS[name].build(seed), out / name)
    print(f"{name}: {time.perf_counter() - t:.0f} s wall; {json.dumps(s.get('scenario', {}))}", flush=True)
    return s


def fig3(out: Path) -> dict[str, Any]:
    """The MPI reactivity sweep, with the default stall limit and with one above the boot tail."""
    from dataclasses import replace

    rows: dict[str, dict[int, Any]] = {"stall_600": {}, "stall_1200": {}}
    for key, stall in (("stall_600", 600.0), ("stall_1200", 1200.0)):
        for n in (2, 4, 8, 16, 32, 64, 128, 256):
            plan = epu_fig3(1, n)
            plan.options = replace(plan.options, params={"stall_seconds": stall})
            s = run_plan(plan, out / f"fig3-{n}-{int(stall)}")
            rows[key][n] = {"seconds_until_running": s["scenario"]["seconds_until_mpi_job_runs"],
                            "launches": s["launches"], "replacements": s["replacements"]}
            print(f"fig3 stall {stall:.0f} n={n}: {rows[key][n]}", flush=True)
    from epu.simulate.output import _agg

    plt = _agg()
    fig, ax = plt.subplots(figsize=(7, 4))
    for key, label in (("stall_600", "stall_seconds = 600 (default)"), ("stall_1200", "stall_seconds = 1200")):
        ns = sorted(rows[key])
        ax.plot(ns, [rows[key][n]["seconds_until_running"] / 60 for n in ns], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("nodes of the MPI job")
    ax.set_ylabel("minutes from submit to running")
    ax.set_title("epu-fig3: reactivity (EC2-like boots, lognormal median 5 min)", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "fig3.png", dpi=100)
    plt.close(fig)
    return rows


def compare(name: str, plan: Plan, variants: list[tuple[str, dict[str, Any]]], out: Path) -> dict[str, Any]:
    t = time.perf_counter()
    r = run_compare(plan, variants, out=out / f"compare-{name}", progress=False)
    print(f"compare {name}: {time.perf_counter() - t:.0f} s wall", flush=True)
    for row in [r["baseline"], *r["runs"]]:
        print(f"  {row['policy']:<40} p95 {row['wait_p95_s']:>8.0f}  cost {row['cost']:>9.2f}  "
              f"node-h {row['node_hours']:>9.1f}  launches {row['launches']}", flush=True)
    return r


POLICIES = [("queue-demand", {"idle_seconds": 60}), ("threshold", {"jobs_per_vm": 1, "idle_for_time_s": 300}),
            ("spare", {"spare_nodes": 2, "idle_seconds": 300, "billing_period_seconds": 0}),
            ("start-time", {})]
HOURLY = [("queue-demand", {"idle_seconds": 60}), ("threshold", {"jobs_per_vm": 1, "idle_for_time_s": 300}),
          ("spare", {"spare_nodes": 2, "idle_seconds": 300, "billing_period_seconds": 3600}),
          ("start-time", {"billing_period_seconds": 3600})]


def policy_plans() -> dict[str, tuple[Plan, list[tuple[str, dict[str, Any]]]]]:
    from epu.simulate.cloudmodel import load_cloud_model
    from epu.simulate.run import Options, default_config
    from epu.simulate.scenarios import nasa_path
    from epu.workloads.generators import generate
    from epu.workloads.swf import read_swf
    from epu.workloads.transform import window

    def plan(w: Any, cores: int, most: int, billing: str, estimate: str) -> Plan:
        cloud = load_cloud_model(None, {"default": {"billing": billing,
                                                    "boot": {"dist": "lognormal", "median": 100, "sigma": 0.3}}})
        return Plan(w.name, w, default_config(w, cores_per_node=cores, max_nodes=most), cloud,
                    Options(seed=1, estimate=estimate))

    nasa = read_swf(nasa_path())
    return {
        "nasa-1d-exact": (plan(window(nasa, 3, 1), 1, 128, "second", "exact"), POLICIES),
        "nasa-1d-noestimate": (plan(window(nasa, 3, 1), 1, 128, "second", "none"), POLICIES),
        "pattern-wave": (plan(generate("pattern:shape=wave,hours=12,low=20,high=240,duration=300"), 1, 64,
                              "second", "exact"), POLICIES),
        "waves-hourly": (plan(generate("waves:waves=4,jobs=48,period=10800,run_min=300,run_max=2400"), 1, 48,
                              "hour", "exact"), HOURLY),
    }


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "results" / "experiments"
    parts = set(sys.argv[2:]) or {"fig3", "fig5", "fig6", "ec3", "autoelastic", "policies"}
    out.mkdir(parents=True, exist_ok=True)
    figures_path = out / "figures.json"
    figures: dict[str, Any] = json.loads(figures_path.read_text()) if figures_path.exists() else {}
    if "fig3" in parts:
        figures["epu-fig3"] = fig3(out)
    for part, names in (("fig5", ["epu-fig5"]), ("fig6", ["epu-fig6"]), ("ec3", ["ec3-waves"]),
                        ("autoelastic", ["autoelastic-ascending", "autoelastic-descending", "autoelastic-wave",
                                         "autoelastic-constant"])):
        if part in parts:
            for n in names:
                figures[n] = scenario(n, out)
    if "policies" in parts:
        for name, (plan, variants) in policy_plans().items():
            figures[f"compare-{name}"] = compare(name, plan, variants, out)
    figures_path.write_text(json.dumps(figures, indent=2, sort_keys=True, default=str) + "\n")
    FIGS.mkdir(parents=True, exist_ok=True)
    for src, dst in [("epu-fig6/timeline.png", "epu-fig6.png"), ("epu-fig5/timeline.png", "epu-fig5.png"),
                     ("fig3.png", "epu-fig3.png"), ("ec3-waves/timeline.png", "ec3-waves.png"),
                     ("autoelastic-wave/timeline.png", "autoelastic-wave.png"),
                     ("compare-nasa-1d-exact/compare.png", "compare-nasa-1d.png"),
                     ("compare-waves-hourly/compare.png", "compare-waves-hourly.png")]:
        if (out / src).exists():
            shutil.copy(out / src, FIGS / dst)


if __name__ == "__main__":
    main()
