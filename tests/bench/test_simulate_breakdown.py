"""bench/simulate_breakdown.py times every simulated event without changing the run."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import simulate_breakdown as sb  # noqa: E402

from epu.sim.world import World  # noqa: E402
from epu.simulate.plan import run_plan  # noqa: E402
from epu.simulate.scenarios import nasa  # noqa: E402


def test_labels_with_numbers_ids_and_node_names_fall_into_one_class() -> None:
    m = sb.Meter()
    assert m.key("deliver instance.state to decision.input") == "deliver instance.state to decision.input"
    assert m.key("batch register sim-3fa2c") == m.key("batch register sim-beef") == "batch register #"
    assert m.key("cloud cloud booted cloud-17") == "cloud cloud booted #"
    assert m.key("") == "(unlabelled)"


def test_every_event_is_timed_and_the_run_is_the_same() -> None:
    plan = nasa(0.05)(1)
    plain = run_plan(plan)
    meter = sb.Meter()
    undo = sb.install(meter)
    try:
        metered = run_plan(plan)
    finally:
        undo()
    assert World.call_after.__name__ == "call_after"  # undone
    assert metered["digest"] == plain["digest"]
    assert sum(meter.count.values()) == metered["events"] == plain["events"]
    assert meter.count["iterate engine"] > 0 and meter.cost["iterate engine"] > 0
