"""``epu simulate``'s CPU in two trees at once, one tree per core, repeated: the ratio per round
and its median.

    .venv/bin/python bench/simulate_pairs.py --base DIR [--head DIR] [--days 10] [--rounds 6] [--json]

Why: the month's guard rail (docs/performance.md, "Workload simulation") is a ratio of two
trees' CPU, and on the project machine one run's CPU moves by up to ±8 % with the host's other
work. Running both trees at the same moment puts that drift on both; pinning each to its own core
(``taskset``) keeps them from sharing one, and swapping the cores every round cancels a slower
core. Each side runs the NASA scenario windowed to ``--days`` (``run_plan(nasa(days)(1))``, the
cyclic collector off as ``epu simulate`` runs it) with its own ``.venv/bin/python`` in its own
tree, and reports its process CPU and the run's digest; a round whose digests differ is flagged
(the trees do not simulate the same thing: compare with care).

Exit status: 0, or 2 on bad input or a failed run (the message names the tree and the end of its
stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

HEAD = Path(__file__).resolve().parents[1]

_ONE_RUN = """
import gc, sys, time
from epu.simulate.plan import run_plan
from epu.simulate.scenarios import nasa
plan = nasa(float(sys.argv[1]))(1)
gc.disable()
t = time.process_time()
s = run_plan(plan)
print(time.process_time() - t, s["digest"])
"""
"""One side of a round, run by the tree's own interpreter in the tree (its ``epu``)."""


def _start(tree: Path, cpu: int | None, days: float) -> subprocess.Popen[str]:
    python = tree / ".venv" / "bin" / "python"
    cmd = [str(python), "-c", _ONE_RUN, str(days)]
    if cpu is not None:
        cmd = ["taskset", "-c", str(cpu), *cmd]
    return subprocess.Popen(cmd, cwd=tree, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(tree: Path, proc: subprocess.Popen[str]) -> tuple[float, str]:
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{tree}: exit {proc.returncode}: {err[-1500:]}")
    cpu, digest = out.split()[-2:]
    return float(cpu), digest


def rounds(base: Path, head: Path, days: float, n: int, pin: bool) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for i in range(n):
        cpus = (i % 2, 1 - i % 2) if pin else (None, None)
        procs = [_start(base, cpus[0], days), _start(head, cpus[1], days)]
        (b, bd), (h, hd) = (_finish(t, p) for t, p in zip((base, head), procs, strict=True))
        out.append({"round": i + 1, "base_cpu_s": round(b, 2), "head_cpu_s": round(h, 2),
                    "ratio": round(h / b, 3), "same_digest": bd == hd})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", type=Path, required=True, help="the tree to compare with (its own .venv)")
    ap.add_argument("--head", type=Path, default=HEAD, help="the tree measured (default: this one)")
    ap.add_argument("--days", type=float, default=10.0, help="NASA days simulated per run (30: the month)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    for tree in (args.base, args.head):
        if not (tree / ".venv" / "bin" / "python").exists():
            print(f"simulate_pairs: {tree} has no .venv/bin/python (run make venv there)", file=sys.stderr)
            return 2
    if args.days <= 0 or args.rounds < 1:
        print("simulate_pairs: --days must be > 0 and --rounds >= 1", file=sys.stderr)
        return 2
    pin = shutil.which("taskset") is not None and (os.cpu_count() or 1) >= 2
    try:
        rows = rounds(args.base.resolve(), args.head.resolve(), args.days, args.rounds, pin)
    except RuntimeError as exc:
        print(f"simulate_pairs: {exc}", file=sys.stderr)
        return 2
    median = statistics.median(r["ratio"] for r in rows)  # type: ignore[misc]
    if args.json:
        print(json.dumps({"days": args.days, "pinned": pin, "rounds": rows, "median_ratio": median}, indent=1))
        return 0
    for r in rows:
        flag = "" if r["same_digest"] else "  (digests differ)"
        print(f"round {r['round']}: base {r['base_cpu_s']:.2f} s  head {r['head_cpu_s']:.2f} s  "
              f"head/base {r['ratio']:.3f}{flag}")
    print(f"median head/base over {len(rows)} rounds ({args.days:g} days each, "
          f"{'pinned, cores swapped each round' if pin else 'not pinned'}): {median:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
