"""Issue 33, defect 7, as a seeded scenario: a PostgreSQL failover. The engines' store answers
writes as a client meets a failover (session cut, then SQLSTATE 25006 read-only and 25P02
aborted-transaction answers) for 20-120 s at a time, while an operator pauses the domain inside
each window and changes bounds. The bus judges a handler's failure with the runtime's own rule
(``common.runtime.infrastructure``). With the classification of before the fix (25006 and 25P02
neither transient nor permanent) changes are dead-lettered and never answered — invariant 7 on
every seed; with today's, every change is applied once the database takes writes again."""

from __future__ import annotations

import pytest
from epu.common import failures

from epu.sim.scenarios import get_scenario, names
from epu.sim.simulation import Simulation

SEEDS = (1, 2, 3)


def test_the_scenario_is_registered() -> None:
    assert "store-failover" in names()


def test_failover_answers_blamed_on_the_message_lose_operator_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(failures, "_PG_TRANSIENT_CODES", ("55P03", "55006"))  # before issue 33
    for seed in SEEDS:
        result = Simulation(get_scenario("store-failover"), seed=seed).run()
        lost = [v for v in result.violations if v.invariant == 7 and "never answered" in v.detail]
        assert lost, f"seed {seed}: the scenario did not catch the lost operator changes"
        assert result.stats["dead_lettered"] > 0


def test_every_change_sent_during_a_failover_is_answered_and_obeyed() -> None:
    for seed in SEEDS:
        sim = Simulation(get_scenario("store-failover"), seed=seed)
        result = sim.run()
        assert not result.violations, [str(v) for v in result.violations[:5]]
        assert sim.decision_faults.failed_writes > 0, "no write met the failover: the scenario tests nothing"
        assert sim.bus.stats.transient_retries > 0 and sim.bus.stats.dead_lettered == 0
        assert len(sim.operator.changes) >= 4
