"""The seeded simulation in CI: every scenario over a fixed set of seeds, every invariant checked.

No scenario is expected to fail: a violation fails the test with the command that replays it.
``make sim`` runs many more seeds (docs/simulation.md)."""

from __future__ import annotations

import pytest

from epu.sim.runner import run_one
from epu.sim.scenarios import get_scenario, names


def ci_seeds(name: str) -> list[int]:
    return list(range(1, get_scenario(name).seeds_in_ci + 1))


CASES = [(name, seed) for name in names() for seed in ci_seeds(name)]


@pytest.mark.parametrize(("scenario", "seed"), CASES, ids=[f"{n}-{s}" for n, s in CASES])
def test_invariants_hold(scenario: str, seed: int) -> None:
    r = run_one(scenario, seed)
    assert not r.violations, "\n".join([str(v) for v in r.violations[:10]] + [f"replay: {r.replay()}"])


def test_every_scenario_runs_over_at_least_four_seeds_in_ci() -> None:
    """A regression on seed 6 of one scenario landed because CI ran only its seed 1 (issue 33)."""
    assert {n: len(ci_seeds(n)) for n in names() if len(ci_seeds(n)) < 4} == {}
