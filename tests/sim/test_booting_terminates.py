"""An operator's unforced terminate of an HTCondor instance whose VM is booting, as a seeded
scenario. The engine holds the instance ``pending`` (the provisioner has not polled since the
boot) and terminates it directly; the startd joined by itself and took a queued job. With a
provisioner that carries out every terminate — what it did before ``unless_started`` — a job is
killed on seed 1 (t=627 s); with today's, no invariant is violated and the refusals happened."""

from __future__ import annotations

from unittest import mock

from epu.services.provisioner import unstarted
from epu.services.provisioner.unstarted import Judgement

from epu.sim.scenarios import get_scenario
from epu.sim.simulation import Simulation

SCENARIO = "htcondor-booting-terminates"


def carried_out(state: str | None, *_: object, **__: object) -> Judgement:
    """The provisioner before ``unless_started``: a live record's terminate is always carried out."""
    return Judgement("over", "closed") if state in ("terminated", "failed") else Judgement("destroy", "asked")


def test_a_provisioner_that_does_not_look_kills_a_job() -> None:
    with mock.patch.object(unstarted, "judge", carried_out):
        result = Simulation(get_scenario(SCENARIO), seed=1).run()
    assert [v.invariant for v in result.violations] == [1], [str(v) for v in result.violations[:5]]


def test_a_terminate_unless_started_violates_nothing_and_is_refused_when_the_vm_runs() -> None:
    verdicts: list[str] = []
    judge = unstarted.judge

    def counted(*a: object, **k: object) -> Judgement:
        j = judge(*a, **k)  # type: ignore[arg-type]
        verdicts.append(j.verdict)
        return j

    with mock.patch.object(unstarted, "judge", counted):
        result = Simulation(get_scenario(SCENARIO), seed=1).run()
    assert not result.violations, [str(v) for v in result.violations[:5]]
    assert "refuse" in verdicts, verdicts  # the VMs it would have destroyed ran: refused
