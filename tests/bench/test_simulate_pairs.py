"""``bench/simulate_pairs.py`` runs a round in two trees and reports their CPU and whether they
simulated the same thing; it refuses a tree it cannot run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "bench" / "simulate_pairs.py"


def test_one_round_of_a_tree_against_itself(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(TOOL), "--base", str(ROOT), "--days", "0.05", "--rounds", "1",
                          "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads(out.stdout)
    (row,) = doc["rounds"]
    assert row["same_digest"] is True  # one tree, one seed: the same run
    assert row["base_cpu_s"] > 0 and row["head_cpu_s"] > 0
    assert doc["median_ratio"] == row["ratio"]


def test_a_tree_without_a_virtualenv_is_refused(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(TOOL), "--base", str(tmp_path), "--rounds", "1"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert str(tmp_path) in out.stderr and "make venv" in out.stderr
