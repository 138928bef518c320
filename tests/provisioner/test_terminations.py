"""The one door to destroy (issue 33, design rule 12): every destroy is made by
``terminations.Terminations.destroy`` under a proof, recorded before it is made (the ledger, the
record's reason, a log line, a metric); the gate applies one table by proof — removed and forced
destroy (forced only from the operator), unstarted and bookkeeping are judged on a listing taken
now and never destroy a started VM. The real Provisioner, the simulated libcloud driver, SQLite."""

from __future__ import annotations

import logging

import pytest
from epu.common.clock import ManualClock
from epu.common.messages import LaunchRequest, TerminateRequest
from epu.common.retire import Proof, RetireReason
from epu.common.senders import SenderPolicy
from epu.services.provisioner.cloud import TAG_DEPLOYMENT, TAG_LAUNCH, TAG_STORE
from epu.services.provisioner.sim import SimulatedNodeDriver
from epu.services.provisioner.terminations import may_force


def launch(i: int = 1) -> LaunchRequest:
    return LaunchRequest(launch_id=f"launch-{i}", domain="alpha", site="sim", node_name=f"worker-{i}")


def live(cloud: SimulatedNodeDriver) -> int:
    return cloud.ex_count(live_only=True)


def forced(i: int = 1) -> TerminateRequest:
    return TerminateRequest(request_id=f"f-{i}", instance_id=f"launch-{i}", domain="alpha", reason="now",
                            force=True, retire=RetireReason.OPERATOR, proof=Proof.FORCED)


def bookkeeping(i: int = 1) -> TerminateRequest:
    return TerminateRequest(request_id=f"b-{i}", instance_id=f"launch-{i}", domain="alpha",
                            reason="ended (the provisioner's record of it is older than its end)",
                            unless_started=True, retire=RetireReason.ENDED, proof=Proof.BOOKKEEPING)


@pytest.mark.parametrize(("policy", "sender", "allowed"), [
    (SenderPolicy(), None, True),  # no validated user: the in-memory transport, a development broker
    (SenderPolicy(), "epu-operator", True),
    (SenderPolicy(), "guest", True),  # none of EPU's users (only while require_sender_user is false)
    (SenderPolicy(), "epu-decision", False),  # the engine never forces
    (SenderPolicy(), "epu-provisioner", False),
    (SenderPolicy(), "epu-sensor-alpha", False),
    (SenderPolicy("prod-", True), "prod-epu-operator", True),
    (SenderPolicy("prod-", True), "prod-epu-decision", False),
])
def test_who_may_force(policy: SenderPolicy, sender: str | None, allowed: bool) -> None:
    assert may_force(policy, sender) is allowed


def test_a_forced_terminate_is_carried_out_only_from_the_operator(make_provisioner, cloud,
                                                                   clock: ManualClock) -> None:
    """A forced terminate under the engine's user (a bug, or its stolen credential) destroys
    nothing: the record is told again as it is; the operator's destroys at once."""
    prov, events = make_provisioner({"sim": cloud})
    prov.handle_launch(launch(1))
    prov.handle_launch(launch(2))
    assert prov.wait_idle()
    clock.advance(30)
    prov.poll("sim")  # both started
    prov.handle_terminate(forced(1), sender="epu-decision")
    assert prov.wait_idle()
    assert live(cloud) == 2 and prov.store.get("launch-1").state == "started"
    told = events.for_("launch-1")[-1]
    assert told.state == "started" and told.reason.startswith("forced terminate refused: sent by 'epu-decision'")
    assert prov.store.destroys() == []
    prov.handle_terminate(forced(2), sender="epu-operator")
    assert prov.wait_idle()
    assert live(cloud) == 1 and prov.store.get("launch-2").end_proof == "forced"
    assert [(d.instance_id, d.proof) for d in prov.store.destroys()] == [("launch-2", "forced")]


def test_a_bookkeeping_terminate_never_destroys_a_started_vm(make_provisioner, cloud, clock: ManualClock) -> None:
    """Issue 33 (high): a bookkeeping terminate (the engine's record ended, this record is live)
    is judged by its node on a listing taken now: a started record whose node is listed running
    is refused, a pending record whose node booted is refused and recorded ``started``, a node
    still booting is destroyed — under the proof ``bookkeeping``."""
    prov, events = make_provisioner({"sim": cloud})
    prov.handle_launch(launch(1))
    assert prov.wait_idle()
    clock.advance(30)
    prov.poll("sim")  # launch-1 started
    prov.handle_launch(launch(2))
    assert prov.wait_idle()
    clock.advance(30)  # launch-2 booted; no poll since: its record says pending
    prov.handle_launch(launch(3))  # launch-3 boots
    assert prov.wait_idle()
    for i in (1, 2, 3):
        prov.handle_terminate(bookkeeping(i))
    assert prov.wait_idle()
    assert events.for_("launch-1")[-1].reason.startswith("terminate refused: node ")
    assert "is listed running: it runs" in events.for_("launch-1")[-1].reason
    assert prov.store.get("launch-1").state == "started"
    rec2 = prov.store.get("launch-2")
    assert rec2.state == "started" and rec2.reason.startswith("terminate refused")
    rec3 = prov.store.get("launch-3")
    assert rec3.state == "terminating" and rec3.end_proof == "bookkeeping"
    assert live(cloud) == 2
    assert [(d.instance_id, d.proof) for d in prov.store.destroys()] == [("launch-3", "bookkeeping")]


def test_every_destroy_is_recorded_with_its_proof(make_provisioner, cloud, clock: ManualClock, caplog) -> None:
    """The ledger, the log line and the metric name the proof of each destroy: the engine's
    terminate after removal, and the provisioner's own orphan sweep (which has no record)."""
    seen: list[tuple[str, str, str]] = []
    prov, _ = make_provisioner({"sim": cloud}, grace=0.0)
    prov.terminations.on_destroy = lambda site, proof, outcome: seen.append((site, proof, outcome))
    prov.handle_launch(launch(1))
    assert prov.wait_idle()
    tags = {TAG_DEPLOYMENT: prov.identity.deployment, TAG_STORE: prov.identity.store_id, TAG_LAUNCH: "lost"}
    stray = cloud.create_node("stray", cloud.list_sizes()[0], cloud.list_images()[0], ex_metadata=tags)
    caplog.set_level(logging.INFO, logger="epu.provisioner")
    prov.handle_terminate(TerminateRequest(request_id="t", instance_id="launch-1", domain="alpha", reason="idle"))
    assert prov.wait_idle()
    prov.reconcile("sim")  # the orphan: seen now, due at once (grace 0)
    ledger = prov.store.destroys()
    assert [(d.instance_id, d.cloud_id == stray.id, d.proof) for d in ledger] == [
        ("launch-1", False, "removed"), ("lost", True, "orphan")]
    assert ledger[0].why == "idle (proof: removed)" and ledger[1].why.startswith("orphan: launch id lost unknown")
    assert seen == [("sim", "removed", "destroyed"), ("sim", "orphan", "destroyed")]
    lines = [(r.instance, r.proof) for r in caplog.records if r.getMessage() == "destroy"]  # type: ignore[attr-defined]
    assert lines == [("launch-1", "removed"), ("lost", "orphan")]
    assert prov.store.destroys(instance_id="lost") == ledger[1:]


def test_a_destroy_the_store_cannot_record_is_not_made(make_provisioner, cloud, monkeypatch) -> None:
    """Recorded before it is made: a store refusing the write refuses the destroy (the terminate
    stays ``terminating``; reconciliation re-drives it)."""
    prov, _ = make_provisioner({"sim": cloud})
    prov.handle_launch(launch(1))
    assert prov.wait_idle()

    def refuse(_d: object) -> None:
        raise RuntimeError("database is locked")

    monkeypatch.setattr(prov.store, "record_destroy", refuse)
    prov.handle_terminate(TerminateRequest(request_id="t", instance_id="launch-1", domain="alpha"))
    assert prov.wait_idle()
    assert live(cloud) == 1 and prov.store.get("launch-1").state == "terminating"
    monkeypatch.undo()
    prov.reconcile("sim")
    assert prov.wait_idle() and live(cloud) == 0


def test_an_accepted_terminate_is_carried_out_later_under_its_own_proof(make_provisioner, cloud) -> None:
    """A destroy re-driven by reconciliation (the first failed) is made under the proof that was
    accepted, kept with the record."""
    prov, _ = make_provisioner({"sim": cloud})
    prov.handle_launch(launch(1))
    assert prov.wait_idle()
    cloud.inject("permanent", 1, call="destroy")
    prov.handle_terminate(forced(1), sender="epu-operator")
    assert prov.wait_idle() and live(cloud) == 1
    prov.reconcile("sim")
    assert prov.wait_idle() and live(cloud) == 0
    assert [d.proof for d in prov.store.destroys()] == ["forced", "forced"]


def test_a_bookkeeping_terminate_closes_a_started_record_whose_node_is_presumed_gone(
        make_provisioner, cloud, clock: ManualClock) -> None:
    """Two stores on one queue (``two-provisioners``): another store destroyed the node; this one's
    record stays ``started``, its node presumed gone by the polls (never closed on a presumption).
    The engine, which saw the end, asks with a bookkeeping terminate: the record is closed without
    a destroy call, the presumption kept (a node listed again is reported, never destroyed)."""
    prov, events = make_provisioner({"sim": cloud})
    prov.handle_launch(launch(1))
    assert prov.wait_idle()
    clock.advance(30)
    prov.poll("sim")
    rec = prov.store.get("launch-1")
    assert rec.state == "started"
    cloud.destroy_node(next(n for n in cloud.list_nodes() if n.id == rec.cloud_id))  # another store's destroy
    prov.store.note_presence("launch-1", True, clock.now(), "presumed gone: not listed alive")
    prov.handle_terminate(bookkeeping(1))
    assert prov.wait_idle()
    rec = prov.store.get("launch-1")
    assert rec.state == "terminated" and rec.presumed_gone and "presumed gone" in rec.reason
    assert prov.store.destroys() == []  # closed, not destroyed
