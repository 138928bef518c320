"""A benchmark run alternately in two trees, its figures side by side with a verdict.

    .venv/bin/python bench/side_by_side.py --base DIR --head DIR [--pairs 3] [--threshold 0.10]
        [--figures REGEX] [--script-from own|head] [--json] BENCH [BENCH ARGS...]

Why: a claim "within +10 % of before" must be measured on the same machine at the same time
(docs/performance.md, "How the figures are made"); the project machine has 2 cores shared with
other work, so one run of each tree an hour apart says little. This runs ``bench/bench_BENCH.py
BENCH ARGS --json`` with each tree's own ``.venv/bin/python`` in that tree (the tree's venv
imports the tree's ``epu``: ``make venv`` installs it editable), ``--pairs`` times each,
alternating base-head, head-base, … so a drift of the machine's load falls on both, and prints
per figure (bench/compare_figures.py: CPU time preferred over wall) base min / median, head min
/ median, head ÷ base and the verdict against ``--threshold``.

``--script-from head`` runs the head tree's bench script against the base tree's code too (for
a bench the base tree lacks or whose arguments changed): the head's ``bench/`` is copied into a
temporary directory beside links to every other top-level entry of the base tree, so the
script's own ``sys.path`` entry (its parent's parent) is the base tree's code. By default each
tree runs its own script, and a script that differs between the trees is named on stderr.

Exit status: 0 when every figure is within the threshold (or only "over (min ok)", or a decode
floor: a control, no EPU code in it), 1 when a figure of EPU's code is OVER, 2 on bad input or a failed run (the message names the tree, the command and the
end of its stderr).

``make bench-compare BASE=DIR BENCH=decision BENCH_ARGS="--scale-only --no-rss"`` runs it with
this tree as head.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare_figures import Sample, as_json, compare, extract, failed, markdown  # noqa: E402


class BenchError(Exception):
    """Bad input or a failed run: the message says which and why."""


def script_name(bench: str) -> str:
    """``decision``, ``bench_decision`` or ``bench/bench_decision.py`` → ``bench_decision.py``."""
    m = re.fullmatch(r"(?:bench/)?(?:bench_)?(\w+?)(?:\.py)?", bench)
    if m is None:
        raise BenchError(f"not a benchmark name: {bench!r} (expected e.g. 'decision' or 'bench/bench_sensor.py')")
    name = "bench_" + m.group(1)
    return name + ".py"


def check_tree(tree: Path, label: str, script: str) -> Path:
    """The tree's interpreter, after checking the tree, its venv and the bench script exist."""
    if not tree.is_dir():
        raise BenchError(f"{label} tree {tree}: no such directory")
    python = tree / ".venv" / "bin" / "python"
    if not python.exists():
        raise BenchError(f"{label} tree {tree}: no .venv/bin/python (run `make venv` in it)")
    if not (tree / "bench" / script).is_file():
        hint = " (--script-from head runs the head's script against this tree's code)" if label == "base" else ""
        raise BenchError(f"{label} tree {tree}: no bench/{script}{hint}")
    return python


def borrowed_tree(base: Path, head: Path, tmp: Path) -> Path:
    """A directory whose ``bench/`` is the head's and everything else links to the base tree's."""
    root = tmp / "base-with-head-bench"
    root.mkdir()
    for entry in base.iterdir():
        if entry.name not in ("bench", ".git"):
            (root / entry.name).symlink_to(entry)
    shutil.copytree(head / "bench", root / "bench", ignore=shutil.ignore_patterns("results", "__pycache__"))
    return root


def run_once(python: Path, tree: Path, script: str, args: Sequence[str], label: str,
             timeout: float) -> dict[str, Any]:
    """One run of the bench in ``tree``; its JSON. PYTHONPATH is cleared so the tree's own code
    is imported (the script puts its tree first on sys.path; the venv has the tree installed)."""
    cmd = [str(python), str(tree / "bench" / script), *args]
    if "--json" not in args:
        cmd.append("--json")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    shown = " ".join(cmd)
    try:
        proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise BenchError(f"{label}: `{shown}` ran longer than {timeout:.0f} s (--timeout)") from exc
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise BenchError(f"{label}: `{shown}` exited {proc.returncode}:\n{tail}")
    try:
        doc = json.loads(proc.stdout)
    except json.JSONDecodeError as exc:
        raise BenchError(f"{label}: `{shown}` did not print one JSON object on stdout ({exc}); "
                         f"stdout starts {proc.stdout[:200]!r}") from exc
    if not isinstance(doc, dict):
        raise BenchError(f"{label}: `{shown}` printed JSON that is not an object")
    return doc


def note_differences(base: Path, head: Path, script: str) -> None:
    """Say on stderr when the two trees' bench scripts (or the shared benchjson.py) differ."""
    for name in (script, "benchjson.py"):
        b, h = base / "bench" / name, head / "bench" / name
        if b.is_file() and h.is_file() and b.read_bytes() != h.read_bytes():
            print(f"note: bench/{name} differs between the trees; each tree runs its own "
                  "(--script-from head to run the head's in both)", file=sys.stderr)


def measure(base: Path, head: Path, script: str, args: Sequence[str], pairs: int, timeout: float,
            script_from: str) -> tuple[list[dict[str, Sample]], list[dict[str, Sample]], list[str]]:
    """``pairs`` runs of each tree, alternating (base, head), (head, base), …; each run's figures,
    and the machine's load average before each run (for the record)."""
    head_python = check_tree(head, "head", script)
    with tempfile.TemporaryDirectory(prefix="epu-sbs-") as tmp:
        if script_from == "head":
            if not (base / ".venv" / "bin" / "python").exists():
                raise BenchError(f"base tree {base}: no .venv/bin/python (run `make venv` in it)")
            base_run_tree = borrowed_tree(base, head, Path(tmp))
            base_python = base / ".venv" / "bin" / "python"
        else:
            base_python = check_tree(base, "base", script)
            base_run_tree = base
            note_differences(base, head, script)
        trees = {"base": (base_python, base_run_tree), "head": (head_python, head)}
        runs: dict[str, list[dict[str, Sample]]] = {"base": [], "head": []}
        loads = []
        for i in range(pairs):
            for label in (("base", "head") if i % 2 == 0 else ("head", "base")):
                python, tree = trees[label]
                loads.append(f"{label} {i + 1}: load {os.getloadavg()[0]:.2f}")
                t = time.monotonic()
                doc = run_once(python, tree, script, args, label, timeout)
                figs = extract(doc)
                if not figs:
                    raise BenchError(f"{label}: bench/{script} {' '.join(args)} printed no figures "
                                     f"(keys: {', '.join(doc)}); did it skip its measurement?")
                runs[label].append(figs)
                print(f"{label} run {i + 1}/{pairs}: {len(figs)} figures in {time.monotonic() - t:.0f} s",
                      file=sys.stderr)
    return runs["base"], runs["head"], loads


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", type=Path, required=True, help="the tree measured against (with its own .venv)")
    ap.add_argument("--head", type=Path, default=Path(__file__).resolve().parent.parent,
                    help="the tree under test (default: this one)")
    ap.add_argument("--pairs", type=int, default=3, help="interleaved base/head pairs (default 3)")
    ap.add_argument("--threshold", type=float, default=0.10, help="head may be this much slower (default 0.10)")
    ap.add_argument("--figures", help="only figures whose name matches this regular expression")
    ap.add_argument("--script-from", choices=("own", "head"), default="own",
                    help="each tree runs its own bench script (default), or both the head's")
    ap.add_argument("--timeout", type=float, default=900, help="seconds one run may take (default 900)")
    ap.add_argument("--json", action="store_true", help="the rows as JSON on stdout instead of the table")
    ap.add_argument("bench", help="the benchmark: 'decision', 'sensor', 'bench_sensor.py', …")
    ap.add_argument("bench_args", nargs=argparse.REMAINDER, help="its arguments (--json is added)")
    a = ap.parse_args(argv)
    try:
        if a.pairs < 1:
            raise BenchError(f"--pairs must be at least 1, not {a.pairs}")
        if not 0 <= a.threshold < 10:
            raise BenchError(f"--threshold is a fraction (0.10 for +10 %), not {a.threshold}")
        try:
            only = re.compile(a.figures) if a.figures else None
        except re.error as exc:
            raise BenchError(f"--figures {a.figures!r}: not a regular expression ({exc})") from exc
        script = script_name(a.bench)
        base, head = a.base.resolve(), a.head.resolve()
        if base == head:
            raise BenchError(f"--base and --head are the same tree ({base})")
        base_runs, head_runs, loads = measure(base, head, script, a.bench_args, a.pairs, a.timeout, a.script_from)
    except BenchError as exc:
        print(f"side_by_side: {exc}", file=sys.stderr)
        return 2
    rows = compare(base_runs, head_runs, a.threshold)
    if only is not None:
        rows = [r for r in rows if only.search(r.figure)]
        if not rows:
            print(f"side_by_side: no figure matches --figures {a.figures!r}", file=sys.stderr)
            return 2
    command = " ".join([f"bench/{script}", *a.bench_args])
    if a.json:
        print(json.dumps({"command": command, "base": str(base), "head": str(head), "pairs": a.pairs,
                          "threshold": a.threshold, "script_from": a.script_from, "loads": loads,
                          "rows": as_json(rows)}, indent=1))
    else:
        print(f"`{command}`, {a.pairs} pair(s) alternating; base {base}, head {head}; threshold "
              f"+{a.threshold:.0%}; min / median over the runs (CPU where measured).\n")
        print(markdown(rows))
        print(f"\nload average (1 min) before each run: {'; '.join(loads)}")
    return 1 if failed(rows) else 0


if __name__ == "__main__":
    sys.exit(main())
