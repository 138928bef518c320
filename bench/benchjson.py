"""The ``--json`` output every benchmark shares, so bench/report.py can write docs/performance.md
from what the commands printed (issue 15, item 6) rather than from figures copied by hand.

One JSON object per run::

    {"bench": "reconcile", "command": "bench/bench_reconcile.py --json", "machine": {...},
     "figures": {"poll, steady (500 nodes)": {"unit": "ms", "wall": {"min", "median", "max"},
                                              "cpu": {...}, "baseline": "listing alone (500 nodes)"},
                 ...},
     ...}                                   # a benchmark's own extra keys

``wall``/``cpu`` are min/median/max over the repeats; ``baseline`` names the figure measured in
the same run that this one is compared with (or ``floor``, a value). The machine is shared
(2 cores), so CPU time is recorded beside wall time whenever a benchmark measures it.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any


def stats(xs: Sequence[float], scale: float = 1.0, digits: int = 4) -> dict[str, float]:
    """min / median / max of ``xs`` (each multiplied by ``scale``)."""
    if not xs:
        raise ValueError("no measurements")
    return {"min": round(min(xs) * scale, digits), "median": round(statistics.median(xs) * scale, digits),
            "max": round(max(xs) * scale, digits)}


def machine() -> dict[str, Any]:
    """Where and when: what a reader needs to compare two runs."""
    return {"python": platform.python_version(), "cpus": os.cpu_count(),
            "load_average": [round(x, 2) for x in os.getloadavg()],
            "utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime())}


class Results:
    """Figures of one benchmark run, printed as one JSON object by ``emit``."""

    def __init__(self, bench: str) -> None:
        self.doc: dict[str, Any] = {"bench": bench, "command": " ".join(["bench/" + os.path.basename(sys.argv[0]),
                                                                          *sys.argv[1:]]),
                                    "machine": machine(), "figures": {}}

    def add(self, name: str, *, unit: str, wall: Sequence[float] | None = None, cpu: Sequence[float] | None = None,
            scale: float = 1.0, baseline: str | None = None, **extra: Any) -> None:
        """A figure: ``wall``/``cpu`` samples (seconds, shown in ``unit`` after ``scale``), the
        name of the figure it is compared with, and anything else worth keeping."""
        fig: dict[str, Any] = {"unit": unit}
        if wall:
            fig["wall"] = stats(wall, scale)
        if cpu:
            fig["cpu"] = stats(cpu, scale)
        if baseline is not None:
            fig["baseline"] = baseline
        fig.update(extra)
        self.doc["figures"][name] = fig

    def emit(self) -> None:
        print(json.dumps(self.doc, indent=1))


@contextlib.contextmanager
def json_mode(enabled: bool) -> Iterator[None]:
    """With ``--json``, the human-readable lines go to stderr so stdout is the JSON alone."""
    if not enabled:
        yield
        return
    with contextlib.redirect_stdout(sys.stderr):
        yield
