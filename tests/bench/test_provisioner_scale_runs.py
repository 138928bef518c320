"""``bench/bench_provisioner_scale.py`` runs to the end on a small fleet and prints its figures as
JSON: its set-up asserts on the provisioner's API (a quiet poll moves nothing), and a change to
that API once broke the bench without any test noticing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_provisioner_scale.py"


def test_the_bench_runs_and_reports_every_figure() -> None:
    out = subprocess.run([sys.executable, str(BENCH), "--nodes", "50", "--repeat", "1", "--json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads(out.stdout)
    text = json.dumps(doc)
    for figure in ("poll, quiet", "poll, 1 % changed", "report, quiet", "listing alone"):
        assert figure in text, figure
