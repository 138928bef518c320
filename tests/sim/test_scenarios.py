"""The seeded simulation in CI: every scenario over a fixed set of seeds, every invariant checked.

Scenarios that reproduce a defect another stream is fixing are listed in ``KNOWN_FAILING`` with
the issue bullet: while they still find a violation the test is an expected failure (xfail,
with the replay command), and once the fix is merged they must pass — remove the entry then.
``make sim`` runs many more seeds (docs/simulation.md)."""

from __future__ import annotations

import pytest

from epu.sim.runner import run_one
from epu.sim.scenarios import get_scenario, names

KNOWN_FAILING: dict[str, str] = {}


def ci_seeds(name: str) -> list[int]:
    return list(range(1, get_scenario(name).seeds_in_ci + 1))


CASES = [(name, seed) for name in names() for seed in ci_seeds(name)]


@pytest.mark.parametrize(("scenario", "seed"), CASES, ids=[f"{n}-{s}" for n, s in CASES])
def test_invariants_hold(scenario: str, seed: int) -> None:
    r = run_one(scenario, seed)
    if r.violations and scenario in KNOWN_FAILING:
        pytest.xfail(f"{KNOWN_FAILING[scenario]}: {r.violations[0]} — replay: {r.replay()}")
    assert not r.violations, "\n".join([str(v) for v in r.violations[:10]] + [f"replay: {r.replay()}"])
