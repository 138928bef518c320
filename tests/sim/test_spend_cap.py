"""Invariant 8 (spend within the cap): the ``spend-cap`` scenario holds it, the cap actually
binds there, and the checker catches an engine whose cap rule is switched off."""

from __future__ import annotations

import pytest
from epu.common.messages import DecisionRecord
from epu.services.decision import budget

from epu.sim.scenarios import get_scenario, names
from epu.sim.simulation import Simulation


def test_spend_cap_scenarios_are_listed() -> None:
    assert {"spend-cap", "spend-cap-types"} <= set(names())


@pytest.mark.parametrize(("name", "seed"), [("spend-cap", 1), ("spend-cap", 2), ("spend-cap", 3),
                                            ("spend-cap-types", 1)])
def test_spend_cap_holds_and_binds(name: str, seed: int) -> None:
    sim = Simulation(get_scenario(name), seed)
    held: list[str] = []
    sim.bus.taps.append(lambda msg, _sender: held.extend(
        n for n in msg.notes if n.startswith("spend cap:")) if isinstance(msg, DecisionRecord) else None)
    result = sim.run()
    assert [str(v) for v in result.violations] == []
    assert any("held" in n for n in held), "the cap never held a launch: the scenario does not test it"


def test_a_broken_cap_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cap rule admits everything: the domain spends past its cap, invariant 8 says so."""
    monkeypatch.setattr(budget, "admit", lambda launches, _b: budget.Admission([True] * len(launches)))
    monkeypatch.setattr("epu.services.decision.planner.admit",
                        lambda launches, _b: budget.Admission([True] * len(launches)))
    result = Simulation(get_scenario("spend-cap"), 1).run()
    assert 8 in {v.invariant for v in result.violations}
