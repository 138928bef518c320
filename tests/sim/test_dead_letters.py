"""The ``dead-letters`` scenario (issue 33): a stolen sensor credential forges forced terminates for the
dead-letter queue while an administrator requeues every letter. With the fix, the broker refuses the
injection and the requeue's check (``common.deadletters``, as ``epu dead requeue`` runs it) refuses
every forged letter; with the requeue of before (sent where the letter's headers say, as the
operator) and a dead-letter exchange anyone may write, invariant 10 — a requeued letter never gains
authority — catches the attack, and the forced terminate kills a running job (invariant 1). Each
half of the fix holds on its own."""

from __future__ import annotations

from dataclasses import replace

import pytest

from epu.sim import bus as simbus
from epu.sim.scenarios import get_scenario
from epu.sim.simulation import Simulation

SEED = 9101


def run(monkeypatch: pytest.MonkeyPatch, *, writable_dlx: bool = False, old_requeue: bool = False) -> Simulation:
    if writable_dlx:  # the definitions of before: every service user could write epu.dlx
        monkeypatch.setattr(simbus.Identities, "may_write", lambda self, user, exchange: True)
    sim = Simulation(replace(get_scenario("dead-letters"), hours=2.0), SEED)
    sim.bus.requeue_lends_authority = old_requeue
    sim.result = sim.run()  # type: ignore[attr-defined]
    return sim


def test_forged_letters_are_refused_at_the_broker_and_at_the_requeue(monkeypatch: pytest.MonkeyPatch) -> None:
    sim = run(monkeypatch)
    assert not sim.result.violations, sim.result.violations  # type: ignore[attr-defined]
    adv, requeuer, bus = sim.adversary, sim.requeuer, sim.bus  # type: ignore[attr-defined]
    assert adv.refused > 0 and bus.stats.refused_publishes >= adv.refused
    assert not any(letter.claims for letter in bus.dead), "nothing got into the dead-letter exchange but by the broker"
    forged = [x for x in bus.dead if x.msg.TYPE == "instance.terminate" and x.sent.sender is adv]
    assert forged and all(x.queue == "epu.decision.input" and x.note and x.note.startswith("sender not allowed")
                          for x in forged), "each forged terminate died for real, at the engines' input"
    assert requeuer.refusals.get("it died because sender not allowed", 0) > 0
    assert bus.stats.requeues_refused > 0


def test_the_requeue_of_before_lends_the_operators_authority(monkeypatch: pytest.MonkeyPatch) -> None:
    sim = run(monkeypatch, writable_dlx=True, old_requeue=True)
    violations = sim.result.violations  # type: ignore[attr-defined]
    requeued = [v for v in violations if v.invariant == 10 and "requeued dead letter" in v.detail]
    assert requeued, violations
    assert "instance.terminate" in requeued[0].detail and "adversary" in requeued[0].detail


@pytest.mark.parametrize(("writable_dlx", "old_requeue"), [(True, False), (False, True)])
def test_each_half_of_the_fix_holds_alone(monkeypatch: pytest.MonkeyPatch, writable_dlx: bool,
                                          old_requeue: bool) -> None:
    """A dead-letter exchange anyone may write, with the new requeue: the forged letters' proven
    sender may not send terminates. The old requeue, with the new definitions: nothing forged gets in."""
    sim = run(monkeypatch, writable_dlx=writable_dlx, old_requeue=old_requeue)
    assert not sim.result.violations, sim.result.violations  # type: ignore[attr-defined]
    if writable_dlx:
        assert any(x.claims for x in sim.bus.dead), "injected letters were there to requeue"
        assert sim.requeuer.refusals.get("its sender may not send it", 0) > 0  # type: ignore[attr-defined]
