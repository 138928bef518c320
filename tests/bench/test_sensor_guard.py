"""``bench/bench_sensor.py`` fails (exit 1, so ``make bench`` fails) when the snapshot is over
its size limit, and passes under it; a small site and a tiny limit stand in for 1 MiB."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "bench" / "bench_sensor.py"
SMALL = ["--only", "slurm", "--nodes", "50", "--jobs", "500", "--repeats", "1", "--json"]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(TOOL), *SMALL, *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def test_a_snapshot_over_the_limit_fails_the_bench_and_one_under_passes() -> None:
    under = run()  # the default limit, 1 MiB: a 50-node snapshot is far below it
    assert under.returncode == 0, under.stderr[-2000:]
    size = json.loads(under.stdout)["snapshot"]["bytes"]
    over = run("--max-snapshot-mib", str(size / 2 ** 20 * 0.99))
    assert over.returncode == 1
    assert "FAIL" in over.stderr and f"{size:,} bytes" in over.stderr
    assert json.loads(over.stdout)["snapshot"]["bytes"] == size  # the figures are still printed
    assert run("--max-snapshot-mib", str(size / 2 ** 20 * 1.01)).returncode == 0
    by_env = run(env={"EPU_BENCH_SNAPSHOT_MAX_MIB": "0.0001"})
    assert by_env.returncode == 1 and "FAIL" in by_env.stderr
