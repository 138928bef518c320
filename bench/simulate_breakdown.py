"""Where ``epu simulate``'s CPU goes, by class of simulated event.

    .venv/bin/python bench/simulate_breakdown.py [DAYS] [--json]   (default 5 days of NASA)

Why: cProfile charges every Python call and inflates small functions several times over, so its
shares mislead on a run of millions of short events. This tool times each event of the world
itself — every callback queued with ``at``/``after``/``call_at``/``call_after`` is wrapped in a
CPU-clock read before and after — and sums by the event's label with the words that vary (numbers, ids, node names) blanked
(``deliver instance.state to decision.input``, ``iterate engine``, ...). What is left of the run's
CPU (the event loop, the digest, the sampler between events, the wrapper itself) is shown as one
row. The run is the same as ``epu simulate --scenario nasa-month`` windowed to DAYS: the digest is
printed so it can be checked against an unwrapped run.

Read with docs/performance.md ("Workload simulation").
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from epu.sim import world as world_module  # noqa: E402
from epu.simulate.plan import run_plan  # noqa: E402
from epu.simulate.scenarios import nasa  # noqa: E402

_VARYING = re.compile(r"\w*\d\w*|[a-z]+-[0-9a-f]+")  # a word with a digit, or a name like sim-3fa2c


class Meter:
    """CPU nanoseconds and counts per event class, filled by the wrapped callbacks."""

    def __init__(self) -> None:
        self.cost: Counter[str] = Counter()
        self.count: Counter[str] = Counter()
        self._keys: dict[str, str] = {}

    def key(self, label: str) -> str:
        k = self._keys.get(label)
        if k is None:
            k = self._keys[label] = " ".join("#" if _VARYING.fullmatch(w) else w for w in label.split()) or "(unlabelled)"
        return k

    def wrap(self, fn: Callable[[], None], label: str) -> Callable[[], None]:
        key = self.key(label)
        clock = time.process_time_ns
        cost, count = self.cost, self.count

        def timed() -> None:
            t0 = clock()
            fn()
            cost[key] += clock() - t0
            count[key] += 1

        return timed


def install(meter: Meter) -> Callable[[], None]:
    """Wrap the world's four scheduling calls; returns the function that undoes it."""
    W = world_module.World
    originals = {name: getattr(W, name) for name in ("at", "after", "call_at", "call_after")}

    def patched(original: Callable[..., Any]) -> Callable[..., Any]:
        def schedule(self: Any, when: float, fn: Callable[[], None], label: str = "") -> Any:
            return original(self, when, meter.wrap(fn, label), label)

        return schedule

    for name, original in originals.items():
        setattr(W, name, patched(original))

    def undo() -> None:
        for name, original in originals.items():
            setattr(W, name, original)

    return undo


def main() -> None:
    as_json = "--json" in sys.argv
    argv = [a for a in sys.argv[1:] if a != "--json"]
    days = float(argv[0]) if argv else 5.0
    plan = nasa(days)(1)
    meter = Meter()
    undo = install(meter)
    try:
        t0 = time.process_time()
        summary = run_plan(plan)
        total = time.process_time() - t0
    finally:
        undo()
    timed = sum(meter.cost.values()) / 1e9
    rows = [{"event": k, "count": meter.count[k], "cpu_s": round(v / 1e9, 3),
             "share": round(v / 1e9 / total, 4), "us_per_event": round(v / 1e3 / meter.count[k], 1)}
            for k, v in meter.cost.most_common()]
    rest = {"event": "(event loop, digest, sampler, wrapper; not inside an event)", "count": None,
            "cpu_s": round(total - timed, 3), "share": round((total - timed) / total, 4), "us_per_event": None}
    head = {"days": days, "jobs": summary["jobs"], "launches": summary["launches"], "events": summary["events"],
            "engine_iterations": summary["engine_iterations"], "cpu_s": round(total, 2),
            "digest": summary["digest"]}
    if as_json:
        print(json.dumps({**head, "rows": [*rows, rest]}, indent=1))
        return
    print(f"NASA iPSC/860, first {days:g} days: {head['jobs']} jobs, {head['launches']} launches, "
          f"{head['events']} events, {head['engine_iterations']} engine iterations run; "
          f"{total:.1f} s CPU (digest {summary['digest'][:8]})")
    print(f"{'CPU s':>7} {'share':>6} {'events':>8} {'µs/event':>9}  event class")
    for r in [*rows, rest]:
        count = "" if r["count"] is None else f"{r['count']:8d}"
        per = "" if r["us_per_event"] is None else f"{r['us_per_event']:9.1f}"
        print(f"{r['cpu_s']:7.2f} {100 * r['share']:5.1f}% {count:>8} {per:>9}  {r['event']}")


if __name__ == "__main__":
    main()
