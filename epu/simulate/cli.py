"""``epu simulate``: what a policy would do to my workload, in virtual time (docs/experiments.md)."""

from __future__ import annotations

import argparse
import gc
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

RAW = argparse.RawDescriptionHelpFormatter

DESCRIPTION = """\
Replay a workload — a real trace or a generator — against EPU's real decision engine and
provisioner cores in virtual time, with simulated clouds, and tell how long jobs wait and what
it costs: jobs, mean/p50/p95/max wait, bounded slowdown, node-hours, cost, utilization of paid
cores, launches, failures, replacements, peak nodes.

The config is the same TOML the services read (-c FILE): its domain's policy, bounds and
sites are what runs (every site becomes a simulated cloud with the same quota, price and
cores). Without one, a config is made for the workload: one domain on one site, nodes of
--cores-per-node cores, at most the trace's machine size. The cloud model (--cloud FILE)
says per site how instances boot, fail, answer and are billed (docs/experiments.md).

Workloads: --trace FILE (SWF of the Parallel Workloads Archive, gzip or plain; Slurm
`sacct --parsable2` or `sacct --json`; HTCondor `condor_history -json`; the format is
detected) or --generator NAME:key=value,... (burst, mpi, waves, pattern), reshaped with
--window-days, --start-day, --time-scale, --size-scale, --max-jobs.
"""

EPILOG = """\
examples:
  epu simulate --trace NASA-iPSC-1993-3.1-cln.swf.gz --window-days 30 --json
  epu simulate --trace nasa.swf.gz --window-days 7 --policy threshold --out results/nasa-threshold
  epu simulate --generator burst:jobs=512,duration=1800 --cloud ec2.toml -c epu.toml
  epu simulate --trace nasa.swf.gz --window-days 7 --compare queue-demand \\
        --compare threshold:jobs_per_vm=1 --compare spare:spare_nodes=4 --out results/cmp
  epu simulate --list                      the named experiments (the seed papers' figures)
  epu simulate --scenario epu-fig6 --json  one of them

output (--json): one object with at least jobs, jobs_completed, wait_mean_s, wait_p50_s,
  wait_p95_s, wait_max_s, bounded_slowdown, node_hours, cost, utilization, launches,
  failures, replacements, peak_nodes, simulated_hours, wall_seconds, cpu_seconds; with
  --compare: {"baseline": {...static cluster...}, "runs": [{...}, ...]}.

--out DIR writes summary.json, timeline.csv, timeline.png, waits.png and report.html
(with --compare: compare.csv, compare.png, compare.html and one folder per run).

exit status: 0 ran, 1 the run failed, 2 bad usage, config, workload or cloud model.
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="replay a workload against the real policies in virtual time: waits and cost",
                       description=DESCRIPTION, epilog=EPILOG, formatter_class=RAW)
    src = p.add_argument_group("workload")
    src.add_argument("--trace", metavar="FILE", help="a trace file (SWF[.gz], sacct, sacct --json, condor_history -json)")
    src.add_argument("--format", default="auto", help="trace format: auto, swf, sacct, sacct-json, condor-json")
    src.add_argument("--generator", metavar="SPEC", help="NAME:key=value,... (burst, mpi, waves, pattern)")
    src.add_argument("--scenario", metavar="NAME", help="a named experiment (see --list)")
    src.add_argument("--list", action="store_true", help="list the named experiments and exit")
    src.add_argument("--window-days", type=float, metavar="N", help="take N days of the trace")
    src.add_argument("--start-day", type=float, default=0.0, metavar="D", help="... starting D days in (default 0)")
    src.add_argument("--time-scale", type=float, metavar="F", help="multiply submit times by F (F < 1: more load)")
    src.add_argument("--size-scale", type=float, metavar="F", help="multiply every job's processors by F")
    src.add_argument("--max-jobs", type=int, metavar="N", help="only the first N jobs")
    src.add_argument("--estimate", choices=("trace", "exact", "none"), default="trace",
                     help="jobs' time limits: the trace's requested time (default), the exact run time, none")
    dep = p.add_argument_group("deployment")
    dep.add_argument("-c", "--config", metavar="FILE", help="the services' TOML config (default: made for the workload)")
    dep.add_argument("--cloud", metavar="FILE", help="cloud model TOML (boot times, failures, capacity, billing)")
    dep.add_argument("--domain", metavar="NAME", help="domain of the config to drive (default: the sensor's or first)")
    dep.add_argument("--policy", metavar="NAME", help="run this policy instead of the domain's")
    dep.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                     help="a policy parameter (repeatable; values are TOML literals)")
    dep.add_argument("--cores-per-node", type=int, default=1, metavar="C", help="without -c: cores per node (default 1)")
    dep.add_argument("--max-nodes", type=int, metavar="N", help="without -c: max_nodes (default: the trace's machine)")
    dep.add_argument("--price", type=float, default=0.1, metavar="P", help="without -c: price per node-hour (default 0.1)")
    run = p.add_argument_group("run")
    run.add_argument("--seed", type=int, default=1, help="the seed of every random draw (default 1)")
    run.add_argument("--compare", action="append", metavar="POLICY[:k=v,...]",
                     help="run each of these (repeatable) and a static cluster of the trace's size; one table")
    run.add_argument("--jobs", type=_positive_int, metavar="N",
                     help="with --compare: runs at once, one process each (default: one per core)")
    run.add_argument("--out", metavar="DIR", help="write the results folder here")
    run.add_argument("--json", action="store_true", help="print one JSON object")
    run.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    run.add_argument("--no-skip", action="store_true",
                     help="run every engine iteration (slower; same results — for checking the fast path)")
    p.set_defaults(func=cmd_simulate)


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected 1 or more, got {n}")
    return n


def _literal(text: str) -> Any:
    import tomllib

    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def parse_params(items: list[str]) -> dict[str, Any]:
    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"--param expects KEY=VALUE, got {item!r}")
        out[key.strip()] = _literal(value.strip())
    return out


def parse_variant(spec: str) -> tuple[str, dict[str, Any]]:
    """``threshold:jobs_per_vm=1,idle_for_time_s=300`` → ("threshold", {...})."""
    name, _, rest = spec.partition(":")
    params = parse_params([x for x in rest.split(",") if x.strip()]) if rest else {}
    return name.strip(), params


class Progress:
    """A one-line progress bar on stderr (only on a terminal)."""

    def __init__(self, label: str, enabled: bool) -> None:
        self.label = label
        self.enabled = enabled and sys.stderr.isatty()
        self.t0 = time.perf_counter()

    def __call__(self, sim_s: float, total_s: float, done: int, jobs: int) -> None:
        if not self.enabled:
            return
        share = min(1.0, done / jobs) if jobs else 1.0
        bar = "#" * int(share * 30)
        rate = sim_s / 3600 / max(1e-9, time.perf_counter() - self.t0)
        print(f"\r{self.label} [{bar:<30}] {done}/{jobs} jobs, {sim_s / 3600:.0f} h simulated "
              f"({rate:.0f} h/s)\033[K", end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.enabled:
            print(file=sys.stderr)


def cmd_simulate(args: argparse.Namespace) -> int:
    from epu.common.config import ConfigError
    from epu.simulate.cloudmodel import ModelError
    from epu.simulate.run import SimulateError
    from epu.simulate.scenarios import SCENARIOS
    from epu.workloads.model import WorkloadError

    if args.list:
        if args.json:
            print(json.dumps({n: s.summary for n, s in SCENARIOS.items()}, indent=2))
        else:
            width = max(len(n) for n in SCENARIOS)
            for n, s in SCENARIOS.items():
                print(f"{n.ljust(width)}  {s.summary}")
        return 0
    if args.out and not plots_installed():
        print("epu simulate: --out draws timeline.png and waits.png with matplotlib, which is not installed: "
              "pip install 'epu[plots]' (or leave out --out: --json prints the figures)", file=sys.stderr)
        return 2
    try:
        plan = build_plan(args)
    except (ConfigError, ModelError, SimulateError, WorkloadError, ValueError) as exc:
        print(f"epu simulate: {exc}", file=sys.stderr)
        return 2
    try:
        return execute(plan, args)
    except (SimulateError, WorkloadError) as exc:
        print(f"epu simulate: {exc}", file=sys.stderr)
        return 2


def plots_installed() -> bool:
    """Whether ``--out`` can draw its plots: checked before the run, which can take minutes."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def build_plan(args: argparse.Namespace) -> Any:
    from epu.simulate.plan import Plan, from_args

    chosen = [x for x in (args.trace, args.generator, args.scenario) if x]
    if len(chosen) != 1:
        raise ValueError("give exactly one of --trace FILE, --generator SPEC or --scenario NAME (or --list)")
    plan: Plan = from_args(args)
    return plan


def execute(plan: Any, args: argparse.Namespace) -> int:
    from epu.simulate.plan import run_compare, run_plan

    command = "epu simulate " + " ".join(shlex.quote(a) for a in sys.argv[2:]) if len(sys.argv) > 2 else ""
    out = Path(args.out) if args.out else None
    if args.compare:
        variants = [parse_variant(v) for v in args.compare]
        result = run_compare(plan, variants, out=out, progress=not args.no_progress, command=command,
                             jobs=args.jobs)
        if args.json:
            print(json.dumps(result, indent=2))
        else:
            print_compare(result)
        return 0
    progress = Progress(plan.label, not args.no_progress)
    # One run, then the process exits: the cyclic collector stays off after the world stops (it
    # is off while it runs, see run._no_automatic_gc) and what is live is frozen before exit, so
    # neither the report nor the interpreter's teardown walks the whole run's heap (~800 MB for a
    # month; ~3 % of the command's CPU) to find nothing: the memory goes back with the process.
    gc.disable()
    summary = run_plan(plan, out=out, progress=progress, command=command)
    gc.freeze()
    progress.close()
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_summary(summary)
        if out:
            print(f"results: {out}/report.html")
    return 0


def print_summary(s: dict[str, Any]) -> None:
    print(f"{s['workload']} under {s['policy']} (seed {s['seed']}), {s['simulated_hours']:.1f} h simulated "
          f"in {s['wall_seconds']:.1f} s")
    print(f"  jobs {s['jobs']} (completed {s['jobs_completed']}, skipped {s['jobs_skipped']})")
    print(f"  wait mean {s['wait_mean_s']:.0f} s, p50 {s['wait_p50_s']:.0f} s, p95 {s['wait_p95_s']:.0f} s, "
          f"max {s['wait_max_s']:.0f} s; bounded slowdown {s['bounded_slowdown']:.2f}")
    print(f"  node-hours {s['node_hours']:.1f}, cost {s['cost']:.2f}, utilization of paid cores "
          f"{100 * s['utilization']:.1f}%")
    print(f"  launches {s['launches']} ({s.get('launches_per_job', 0):.2f} per job), failures {s['failures']}, "
          f"replacements {s['replacements']}, peak nodes {s['peak_nodes']}")
    b = s.get("baseline")
    if b:
        print(f"  static cluster of {b['peak_nodes']} nodes (always on): cost {b['cost']:.2f}, wait p50 "
              f"{b['wait_p50_s']:.0f} s, p95 {b['wait_p95_s']:.0f} s; node-hours {b['node_hours']:.1f}")
    for site, m in s.get("cloud_model", {}).items():
        print(f"  cloud model of {site} ({m['source']}): {describe_boot(m['boot'])}, boot failures "
              f"{m['boot_failure_rate']:g}, never boot {m['never_boot_rate']:g}, API errors {m['api_error_rate']:g}, "
              f"price {m['price_per_hour']:g}/h billed per {m['billing']}")
    by = s.get("attribution", {}).get("by_account", {})
    if by:
        print("  cost by account: " + ", ".join(f"{k or '(none)'} {v:.2f}" for k, v in list(by.items())[:8]))
    for k, v in s.get("scenario", {}).items():
        print(f"  {k}: {v}")
    for w in s.get("warnings", []):
        print(f"  warning: {w}")


def describe_boot(d: dict[str, Any]) -> str:
    kind = d["dist"]
    if kind == "constant":
        return f"boots in {d['seconds']:g} s"
    if kind == "uniform":
        return f"boots in {d['min']:g}–{d['max']:g} s (uniform)"
    if kind == "normal":
        return f"boots in {d['mean']:g} ± {d['std']:g} s (normal)"
    if kind == "lognormal":
        return f"boots in a median {d['median']:g} s (lognormal, σ {d['sigma']:g})"
    return f"boots drawn from {d['values']} measured times"


COLUMNS = [("policy", "policy", "{}"), ("wait_p50_s", "p50 wait s", "{:.0f}"), ("wait_p95_s", "p95 wait s", "{:.0f}"),
           ("bounded_slowdown", "BSLD", "{:.2f}"), ("node_hours", "node-h", "{:.1f}"), ("cost", "cost", "{:.2f}"),
           ("utilization", "util", "{:.2f}"), ("launches", "launches", "{}"), ("peak_nodes", "peak", "{}")]


def compare_rows(result: dict[str, Any]) -> list[list[str]]:
    rows = []
    for r in [result["baseline"], *result["runs"]]:
        rows.append([fmt.format(r.get(k, "")) if r.get(k) is not None else "" for k, _, fmt in COLUMNS])
    return rows


def print_compare(result: dict[str, Any]) -> None:
    common = result.get("common_params") or {}
    if common:
        print("every run: " + ", ".join(f"{k}={v}" for k, v in common.items()))
    head = [h for _, h, _ in COLUMNS]
    rows = compare_rows(result)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    print("  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(zip(head, widths, strict=True))))
    for r in rows:
        print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))))
