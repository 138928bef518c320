"""The pure half of bench/side_by_side.py: which numbers of a benchmark's ``--json`` output are
figures, how runs of two trees are set side by side, and the verdict against a threshold.

Why a module of its own: the verdict decides whether a change keeps a guard rail ("within +10 %
of today's, side by side"), so it is tested on its own (tests/bench/test_compare_figures.py)
without running a benchmark, and the runner only runs processes.

What counts as a figure in one run's JSON (bench/benchjson.py and the older per-bench shapes):

* a stats dict (``{"min", "median", "max"}``): CPU preferred over wall — a wall stats dict is
  dropped when its sibling of the same name with ``cpu`` for ``wall``/``seconds`` exists (the
  machine is 2 cores shared with other work; CPU time is what the code costs);
* a number whose key names memory (``Vm*``, ``*mib*``) or a mean in ms (``*_ms*``), and the
  numbers of a list under such a key (by index);
* everything else (counts, goals, ratios, the machine) is context, not a figure.

A figure named for a **floor** (bench_sensor.py's decode floor: the same bytes through the
fastest stdlib parser, no EPU code) is a *control*: the same code in both trees, so its ratio
shows how much the machine moved between runs; its verdict is shown but never fails the
comparison.

Lower is better for every figure. Across the runs of one tree a figure's **min** is the least
of the runs' minimums and its **median** the median of the runs' medians (a scalar is its own
min and median).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

STAT_KEYS = frozenset(("min", "median", "max"))
SKIP_TOP = frozenset(("bench", "command", "machine"))
SEP = " › "


@dataclass(frozen=True)
class Sample:
    """One figure of one run: the run's min and median (equal for a scalar), its unit and
    whether it is CPU time, wall time or another quantity (memory)."""

    min: float
    median: float
    unit: str
    kind: str  # "cpu" | "wall" | "mem" | "value"


@dataclass(frozen=True)
class Row:
    """One figure of the side-by-side table."""

    figure: str
    unit: str
    kind: str
    base_min: float | None
    base_median: float | None
    head_min: float | None
    head_median: float | None
    ratio_median: float | None  # head median / base median
    ratio_min: float | None     # head min / base min
    verdict: str
    control: bool = False  # no EPU code in it: its ratio is the machine's noise


def is_control(name: str) -> bool:
    """A decode floor: stdlib parsing only, the same in both trees."""
    return "floor" in name


def _is_stats(v: Any) -> bool:
    return isinstance(v, Mapping) and set(v) >= STAT_KEYS and all(_is_num(v[k]) for k in STAT_KEYS)


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _scalar_kind(key: str, inherited: tuple[str, str] | None = None) -> tuple[str, str] | None:
    """(kind, unit) of a number under ``key`` (or under a parent whose key names memory, as
    ``scale_rss_mib``'s per-scale lists), or None when the number is context (a goal, a count)."""
    k = key.lower()
    if k.startswith("goal"):
        return None
    if k.startswith("vm") or "mib" in k:
        return "mem", "MiB"
    if k.endswith("_ms") or "_ms_" in k:
        return "wall", "ms"
    return inherited


def _cpu_twin(key: str) -> str | None:
    """The CPU sibling's name of a wall stats dict named ``key`` (``wall`` → ``cpu``,
    ``floor_wall`` → ``floor_cpu``, ``encode_seconds`` → ``encode_cpu``), or None."""
    for wall in ("wall", "seconds"):
        if wall in key:
            return key.replace(wall, "cpu")
    return None


def extract(doc: Mapping[str, Any]) -> dict[str, Sample]:
    """Every figure of one run's JSON, by name (the path of keys joined with `` › ``; the
    benchjson ``figures`` level is left out of the name and a final ``cpu``/``wall`` key is
    named in brackets)."""
    if not isinstance(doc, Mapping):
        raise ValueError(f"a benchmark's JSON must be an object, not {type(doc).__name__}")
    figs = {k: v for k, v in doc.items() if k not in SKIP_TOP}
    figures = figs.pop("figures", {})
    return {**dict(_walk((), figures, None, None)), **dict(_walk((), figs, None, None))}


def _walk(path: tuple[str, ...], value: Mapping[str, Any], unit: str | None,
          inherited: tuple[str, str] | None) -> Iterator[tuple[str, Sample]]:
    if not isinstance(value, Mapping):
        return
    unit = value["unit"] if isinstance(value.get("unit"), str) else unit
    for k, v in value.items():
        k = str(k)
        sk = _scalar_kind(k, inherited)
        if _is_stats(v):
            twin = _cpu_twin(k)
            if twin is not None and twin != k and _is_stats(value.get(twin)):
                continue  # CPU preferred: its twin is reported
            kind = "cpu" if "cpu" in k else "wall"
            yield _name(path, k), Sample(float(v["min"]), float(v["median"]), unit or "s", kind)
        elif isinstance(v, Mapping):
            yield from _walk((*path, k), v, unit, sk)
        elif _is_num(v) and sk is not None:
            yield _name(path, k), Sample(float(v), float(v), sk[1], sk[0])
        elif isinstance(v, list) and sk is not None:
            for i, x in enumerate(v):
                if _is_num(x):
                    yield _name((*path, k), f"[{i}]"), Sample(float(x), float(x), sk[1], sk[0])


def _name(path: tuple[str, ...], key: str) -> str:
    if key in ("cpu", "wall"):
        return f"{SEP.join(path) or '(run)'} ({key})"
    return SEP.join((*path, key))


def _aggregate(runs: Sequence[Mapping[str, Sample]], name: str) -> tuple[float, float, Sample] | None:
    got = [r[name] for r in runs if name in r]
    if not got:
        return None
    return min(s.min for s in got), statistics.median(s.median for s in got), got[0]


def verdict(ratio_median: float | None, ratio_min: float | None, threshold: float) -> str:
    """``ok`` when head's median is within ``threshold`` of base's (``faster`` when below it by
    more than ``threshold``); over the threshold, ``over (min ok)`` when the minimums are still
    within it (the shared machine's noise is the likelier cause), else ``OVER``."""
    if threshold < 0:
        raise ValueError(f"threshold must be >= 0, not {threshold}")
    if ratio_median is None:
        return "n/a"
    limit = 1.0 + threshold
    if ratio_median <= limit:
        return "faster" if ratio_median < 1.0 - threshold else "ok"
    if ratio_min is not None and ratio_min <= limit:
        return "over (min ok)"
    return "OVER"


def _ratio(head: float, base: float) -> float | None:
    if base == 0:
        return None if head != 0 else 1.0
    return head / base


def compare(base_runs: Sequence[Mapping[str, Sample]], head_runs: Sequence[Mapping[str, Sample]],
            threshold: float = 0.10) -> list[Row]:
    """One row per figure seen in either tree, in the order the runs name them (base first)."""
    if not base_runs or not head_runs:
        raise ValueError("need at least one run of each tree")
    names: dict[str, None] = {}
    for r in (*base_runs, *head_runs):
        names.update(dict.fromkeys(r))
    rows = []
    for name in names:
        b, h = _aggregate(base_runs, name), _aggregate(head_runs, name)
        proto = (b or h)[2]  # type: ignore[index]  # one of them is there: the name came from a run
        if b is None or h is None:
            rows.append(Row(name, proto.unit, proto.kind, b and b[0], b and b[1], h and h[0], h and h[1], None, None,
                            "only in head" if b is None else "only in base", is_control(name)))
            continue
        rm, rn = _ratio(h[1], b[1]), _ratio(h[0], b[0])
        control = is_control(name)
        v = verdict(rm, rn, threshold)
        rows.append(Row(name, proto.unit, proto.kind, b[0], b[1], h[0], h[1], rm, rn,
                        f"{v} (control)" if control else v, control))
    return rows


def _fmt(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def _fmt_ratio(v: float | None) -> str:
    return "—" if v is None else f"{v:.3f}"


def markdown(rows: Sequence[Row], base_label: str = "base", head_label: str = "head") -> str:
    """The table: per figure base min / median, head min / median, the ratios and the verdict."""
    lines = [f"| figure | unit | {base_label} min / median | {head_label} min / median | "
             f"{head_label} ÷ {base_label} (median / min) | verdict |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        unit = r.unit + (f" {r.kind.upper()}" if r.kind == "cpu" else f" {r.kind}" if r.kind == "wall" else "")
        lines.append(f"| {r.figure} | {unit.strip()} | {_fmt(r.base_min)} / {_fmt(r.base_median)} | "
                     f"{_fmt(r.head_min)} / {_fmt(r.head_median)} | {_fmt_ratio(r.ratio_median)} / "
                     f"{_fmt_ratio(r.ratio_min)} | {r.verdict} |")
    return "\n".join(lines)


def failed(rows: Sequence[Row]) -> list[Row]:
    """The rows that fail the comparison: OVER on a figure of EPU's code (not a control)."""
    return [r for r in rows if r.verdict == "OVER" and not r.control]


def as_json(rows: Sequence[Row]) -> list[dict[str, Any]]:
    return [asdict(r) for r in rows]
