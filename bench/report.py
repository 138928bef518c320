"""Writes the measured tables of docs/performance.md from the benchmarks' ``--json`` output.

    .venv/bin/python bench/report.py [--results bench/results] [--doc docs/performance.md] [--check]

Why: a figure in the docs must be one a command printed (issue 15, item 6). ``make bench`` runs
every ``bench/bench_*.py --json`` into ``bench/results/<name>.json`` and then this script, which
replaces, for each result file, the block between ``<!-- bench:<name> -->`` and
``<!-- /bench:<name> -->`` in the document with a table rendered from the file (the command, the
machine and its load, then min / median / max of wall and CPU time per figure beside the
baseline it is compared with). A result without markers in the document is appended under
"Measured by make bench". Prose around the blocks (what a figure means, what made the
difference) stays hand-written. ``--check`` exits 1 when the document is not what the results
render (for CI), without writing.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
APPENDIX = "## Measured by `make bench`"


def _num(v: float) -> str:
    """Three significant digits, never in exponent form."""
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def _mmm(d: dict[str, float] | None, fmt: str | None = None) -> str:
    if not d:
        return "—"
    return " / ".join(fmt.format(d[k]) if fmt else _num(d[k]) for k in ("min", "median", "max"))


def _ms(d: dict[str, float]) -> str:
    return " / ".join(f"{d[k] * 1e3:.1f}" for k in ("min", "median", "max"))


def _header(doc: dict[str, Any], command: str) -> list[str]:
    m = doc.get("machine")
    if not isinstance(m, dict):  # older files: the machine as text, or its keys at the top
        m = {k: doc.get(k) for k in ("python", "cpus", "load_average")}
    load = m.get("load_average") or []
    when = f" at {m['utc']} UTC" if m.get("utc") else ""
    return [f"Command: `.venv/bin/python {command}`{when}; Python {m.get('python')}, {m.get('cpus')} cores shared "
            f"with other work, load average {' '.join(str(x) for x in load)} at the start. "
            "Min / median / max over the repeats.", ""]


def generic(doc: dict[str, Any]) -> str:
    """The ``benchjson.Results`` schema: one row per figure."""
    lines = _header(doc, doc["command"])
    lines += ["| figure | wall | CPU | unit | compared with | other |", "|---|---|---|---|---|---|"]
    for name, fig in doc["figures"].items():
        other = ", ".join(f"{k} {_other(v)}" for k, v in fig.items()
                          if k not in ("unit", "wall", "cpu", "baseline") and v is not None)
        lines.append(f"| {name} | {_mmm(fig.get('wall'))} | {_mmm(fig.get('cpu'))} | {fig['unit']} | "
                     f"{fig.get('baseline', '—')} | {other or '—'} |")
    extra = {k: v for k, v in doc.items() if k not in ("bench", "command", "machine", "figures")}
    if extra:
        lines += ["", "Also: " + ", ".join(f"{k} {_other(v)}" for k, v in extra.items()) + "."]
    return "\n".join(lines)


def _other(v: Any) -> str:
    if isinstance(v, dict) and set(v) == {"min", "median", "max"}:
        return _mmm(v)
    return json.dumps(v) if isinstance(v, dict | list) else str(v)


def sensor(doc: dict[str, Any]) -> str:
    lines = _header(doc, "bench/bench_sensor.py --json")
    lines += ["| backend (input) | read, wall s | read, CPU s | floor, wall s | floor, CPU s | read ÷ floor "
              "(wall / CPU medians) | shapes | goal ≤ 1 s and ≤ 5× floor: wall / CPU medians |",
              "|---|---|---|---|---|---|---|---|"]
    for name in ("slurm", "slurm_json", "torque", "htcondor", "htcondor_af"):
        e = doc.get(name)
        if not e:
            continue
        if name == "slurm_json":
            goal = "fallback only"
        else:
            wall = e["seconds"] <= 1.0 and e["seconds"] <= 5 * e["floor_seconds"]
            cpu = e["cpu"]["median"] <= 1.0 and e["cpu"]["median"] <= 5 * e["floor_cpu"]["median"]
            goal = " / ".join("met" if ok else "**not met**" for ok in (wall, cpu))
        lines.append(f"| {name} ({e['input']}, {e['input_mb']} MB) | {_mmm(e['wall'])} | {_mmm(e['cpu'])} | "
                     f"{_mmm(e['floor_wall'])} | {_mmm(e['floor_cpu'])} | {e['ratio_to_floor']} / "
                     f"{e['ratio_to_floor_cpu']} | {e['shapes']} | {goal} |")
    s = doc.get("snapshot")
    if s:
        both = s["encode_decode_validate_seconds"]
        lines += ["", f"Snapshot of that site ({s['nodes']:,} nodes, {s['jobs_represented']:,} pending jobs in "
                      f"{s['shapes']} shapes): **{s['mib']} MiB** ({s['bytes']:,} bytes; goal ≤ 1 MiB); wall "
                      f"min / median / max: encode {_ms(s['encode_seconds'])} ms, decode + validate "
                      f"{_ms(s['decode_validate_seconds'])} ms, both {_ms(both)} ms (goal ≤ 50 ms)"
                      + (f"; CPU medians: encode {s['encode_cpu']['median'] * 1e3:.1f}, decode + validate "
                         f"{s['decode_validate_cpu']['median'] * 1e3:.1f}, both "
                         f"{s['encode_decode_validate_cpu']['median'] * 1e3:.1f} ms" if "encode_cpu" in s else "")
                      + "."]
    return "\n".join(lines)


def packing(doc: dict[str, Any]) -> str:
    lines = _header(doc, "bench/bench_packing.py --json")
    lines += ["| figure | wall ms | CPU ms |", "|---|---|---|"]
    for key, r in doc["scale"].items():
        if isinstance(r, dict) and "wall_median_ms" in r:
            lines.append(f"| {key} | {_num(r['wall_min_ms'])} / {_num(r['wall_median_ms'])} / "
                         f"{_num(r['wall_max_ms'])} | {_num(r['cpu_min_ms'])} / {_num(r['cpu_median_ms'])} / "
                         f"{_num(r['cpu_max_ms'])} |")
    o = doc.get("optimality")
    if o:
        lines += ["", f"Optimality over {o['cases']} random small cases against the exhaustive optimum: price ratio "
                      f"mean {o['mean_ratio']:.4f}, max {o['max_ratio']:.3f}, optimal in {o['optimal_share']:.1%}."]
    return "\n".join(lines)


def ctxbroker(doc: dict[str, Any]) -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_ctxbroker import markdown  # noqa: PLC0415 — its own renderer

    return markdown([doc])


RENDERERS: dict[str, Callable[[dict[str, Any]], str]] = {"sensor": sensor, "packing": packing,
                                                         "ctxbroker": ctxbroker}


def render(name: str, doc: dict[str, Any]) -> str:
    return RENDERERS.get(name, generic)(doc)


def update(text: str, name: str, table: str) -> str:
    """``text`` with the block of ``name`` replaced (or appended under the appendix heading)."""
    begin, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    block = f"{begin}\n{table}\n{end}"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    if pattern.search(text):
        return pattern.sub(lambda _m: block, text, count=1)
    if APPENDIX not in text:
        text = text.rstrip("\n") + f"\n\n{APPENDIX}\n"
    return text.rstrip("\n") + f"\n\n### {name}\n\n{block}\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--doc", type=Path, default=ROOT / "docs" / "performance.md")
    ap.add_argument("--check", action="store_true", help="exit 1 if the document differs from the results")
    args = ap.parse_args(argv)
    files = sorted(args.results.glob("*.json"))
    if not files:
        print(f"no results in {args.results}: run `make bench` first", file=sys.stderr)
        return 2
    original = args.doc.read_text()
    text = original
    for f in files:
        try:
            doc = json.loads(f.read_text())
        except json.JSONDecodeError as exc:
            print(f"{f}: not JSON ({exc}); skipped", file=sys.stderr)
            continue
        text = update(text, f.stem, render(f.stem, doc))
    if args.check:
        return 0 if text == original else 1
    if text != original:
        args.doc.write_text(text)
    print(f"{args.doc}: {len(files)} result file(s) rendered", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
