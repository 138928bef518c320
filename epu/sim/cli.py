"""``epu sim``: run the deterministic fault simulator (see docs/simulation.md)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

RAW = argparse.RawDescriptionHelpFormatter

DESCRIPTION = """\
Run EPU's real cores — the decision engine (policies, planner, placement, store), the
provisioner (state machine, store, poll, reconcile, orphan sweep) and the sensor core —
against a simulated batch system and simulated clouds, in virtual time, with faults
injected, and check the invariants at every step:

  1 no running job is killed          5 convergence once the faults stop
  2 no healthy instance is destroyed  6 no site blamed for our own outage
  3 never twice, never over quota     7 operators are obeyed (a pause holds)
  4 one brain (one engine acts per domain)  8 spend within the cap (budget_per_hour)
                                      9 context views are true (the context broker)
                                     10 no process acts on another's authority (a message
                                        its sender may not send)
                                     11 observe mode never acts
                                     12 bounded work (commands per instance, clean-up)

One integer seed fixes a whole run: the same seed replays the same run bit for bit, and
every violation prints the command that replays it.
"""

EPILOG = """\
examples:
  epu sim --list                                   the scenarios and what each stresses
  epu sim --scenario partial-listing --seeds 100   100 seeds of one scenario
  epu sim --seeds 20 --json                        every scenario, one JSON object
  epu sim --seed 81723 --scenario partial-listing  replay one run (prints its violations)
  epu sim --seed 81723 --scenario partial-listing --trace | less   ... and its event log
  epu sim -c /etc/epu/epu.toml --domain alpha --seeds 50    every scenario, with your domain's
                                                   policy, parameters and bounds

output (--json): {"runs", "simulated_hours", "violations", "by_invariant", "invariants": {N: {"name",
  "violations"}} (every invariant, 0 included), "wall_seconds",
  "cpu_seconds", "simulated_hours_per_cpu_minute", "scenarios": {NAME: {the same per
  scenario, "failing_seeds", "replay"}}}

exit status: 0 no violation, 1 at least one violation, 2 bad usage.
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sim", help="run the deterministic fault simulator (invariants, seeds, replay)",
                       description=DESCRIPTION, epilog=EPILOG, formatter_class=RAW)
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    p.add_argument("--scenario", action="append", metavar="NAME",
                   help="scenario to run (repeatable; default: all of them)")
    p.add_argument("--seeds", type=int, default=1, metavar="N", help="seeds per scenario (default 1)")
    p.add_argument("--seed-start", type=int, default=1, metavar="K", help="first seed (default 1)")
    p.add_argument("--seed", type=int, metavar="S", help="run exactly this seed (replay)")
    p.add_argument("--jobs", type=int, default=1, metavar="J", help="run seeds in J processes (default 1)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--trace", action="store_true", help="with --seed: print the run's event log")
    p.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    p.add_argument("-c", "--config", metavar="FILE",
                   help="simulate your own domain: its policy, parameters, min/max nodes and cores per node "
                        "(from [domains.NAME] of FILE) replace each scenario's; only an explicit -c is read "
                        "(not $EPU_CONFIG), so a replay command names it")
    p.add_argument("--domain", metavar="NAME", help="with -c: which domain of FILE (default: the first)")
    p.set_defaults(func=cmd_sim)


def cmd_sim(args: argparse.Namespace) -> int:
    from epu.sim.runner import run_many
    from epu.sim.scenarios import get_scenario, names

    known = names()
    if args.list:
        rows = [(n, get_scenario(n)) for n in known]
        if args.json:
            print(json.dumps({n: {"summary": s.summary, "stresses": s.stresses, "hours": s.hours,
                                  "quiet_seconds": s.quiet_seconds()} for n, s in rows}, indent=2))
        else:
            width = max(len(n) for n in known)
            for n, s in rows:
                print(f"{n.ljust(width)}  {s.summary}\n{' ' * width}  stresses: {s.stresses}")
        return 0
    chosen = args.scenario or known
    unknown = [s for s in chosen if s not in known]
    if unknown:
        print(f"epu sim: unknown scenario(s) {', '.join(unknown)} (epu sim --list)", file=sys.stderr)
        return 2
    if args.seeds < 1 or args.jobs < 1:
        print("epu sim: --seeds and --jobs must be at least 1", file=sys.stderr)
        return 2
    if args.seed is not None:
        if len(chosen) != 1 and args.scenario is None:
            print("epu sim: --seed needs --scenario NAME", file=sys.stderr)
            return 2
        seeds = [args.seed]
    else:
        seeds = list(range(args.seed_start, args.seed_start + args.seeds))
    if args.trace:
        if args.seed is None or len(chosen) != 1:
            print("epu sim: --trace needs --seed S and one --scenario", file=sys.stderr)
            return 2
        return _trace(chosen[0], args.seed, args.json)

    domain, suffix = None, ""
    if args.config:
        domain = _domain_from(args.config, args.domain)
        if domain is None:
            return 2
        suffix = f" -c {args.config}" + (f" --domain {args.domain}" if args.domain else "")
    total = len(chosen) * len(seeds)
    done = [0]
    started = time.perf_counter()
    show = not args.no_progress and sys.stderr.isatty()

    def progress(r: Any) -> None:
        done[0] += 1
        for v in r.violations[:3]:
            print(f"VIOLATION {v} — scenario {r.scenario} seed {r.seed}\n  replay: {r.replay()}{suffix}",
                  file=sys.stderr if args.json else sys.stdout)
        if show:
            rate = done[0] / max(1e-9, time.perf_counter() - started)
            print(f"\r[{done[0]}/{total}] {r.scenario} seed {r.seed}: "
                  f"{'ok' if r.ok else f'{len(r.violations)} violation(s)'} "
                  f"({r.simulated_seconds / 3600:.1f} h simulated in {r.wall_seconds:.1f} s; "
                  f"{rate:.1f} runs/s)\033[K", end="", file=sys.stderr, flush=True)

    results = run_many(chosen, seeds, jobs=args.jobs, progress=progress, domain=domain, replay_suffix=suffix)
    if show:
        print(file=sys.stderr)
    wall = time.perf_counter() - started
    summary = _summary(results, wall)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        _print_text(summary)
    return 1 if summary["violations"] else 0


def _domain_from(path: str, name: str | None) -> dict[str, Any] | None:
    from epu.common.cliargs import load_or_exit

    config = load_or_exit(path)
    if not config.domains:
        print(f"epu sim: {path} has no [domains.NAME] section", file=sys.stderr)
        return None
    name = name or next(iter(config.domains))
    d = config.domains.get(name)
    if d is None:
        print(f"epu sim: {path} has no domain {name!r} (has: {', '.join(config.domains)})", file=sys.stderr)
        return None
    return {"policy": d.policy, "params": dict(d.params), "min_nodes": d.min_nodes, "max_nodes": d.max_nodes,
            "cores_per_node": d.cores_per_node}


def _summary(results: dict[str, Any], wall: float) -> dict[str, Any]:
    per = {name: s.as_json() for name, s in results.items()}
    by_inv: dict[str, int] = {}
    for s in per.values():
        for k, v in s["by_invariant"].items():
            by_inv[k] = by_inv.get(k, 0) + v
    cpu = sum(s.cpu_seconds for s in results.values())
    hours = sum(s.simulated_hours for s in results.values())
    from epu.sim.invariants import NAMES

    return {"runs": sum(s.runs for s in results.values()), "simulated_hours": round(hours, 2),
            "violations": sum(s.violations for s in results.values()), "by_invariant": by_inv,
            "invariants": {str(k): {"name": name, "violations": by_inv.get(str(k), 0)} for k, name in NAMES.items()},
            "wall_seconds": round(wall, 2), "cpu_seconds": round(cpu, 2),
            "simulated_hours_per_cpu_minute": round(hours / cpu * 60, 1) if cpu else None,
            "scenarios": per}


def _print_text(summary: dict[str, Any]) -> None:
    from epu.sim.invariants import NAMES

    width = max([len(n) for n in summary["scenarios"]] + [8])
    print(f"{'scenario'.ljust(width)}  {'runs':>5}  {'sim h':>8}  {'violations':>10}  by invariant")
    for name, s in summary["scenarios"].items():
        inv = ", ".join(f"{k}:{v}" for k, v in s["by_invariant"].items()) or "-"
        print(f"{name.ljust(width)}  {s['runs']:>5}  {s['simulated_hours']:>8.1f}  {s['violations']:>10}  {inv}")
    print(f"{'total'.ljust(width)}  {summary['runs']:>5}  {summary['simulated_hours']:>8.1f}  "
          f"{summary['violations']:>10}  " + (", ".join(f"{k} ({NAMES[int(k)]}): {v}"
                                                       for k, v in sorted(summary['by_invariant'].items())) or "-"))
    print(f"{summary['simulated_hours']:.0f} simulated hours in {summary['cpu_seconds']:.0f} s of CPU "
          f"({summary['simulated_hours_per_cpu_minute']} h per CPU minute), {summary['wall_seconds']:.0f} s wall")


def _trace(name: str, seed: int, as_json: bool) -> int:
    from epu.sim.scenarios import get_scenario
    from epu.sim.simulation import Simulation

    sim = Simulation(get_scenario(name), seed)
    sim.world.trace = []
    r = sim.run()
    for line in sim.world.trace:
        print(line)
    for v in r.violations:
        print(f"VIOLATION {v}")
    print(f"digest {r.digest}; replay: {r.replay()}")
    return 1 if r.violations else 0
