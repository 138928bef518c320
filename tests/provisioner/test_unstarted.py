"""A terminate sent ``unless_started``: destroyed only while the VM has not started.

The engine terminates an instance its view holds ``pending`` at once, without a removal from the
batch system; its view lags the cloud, and an HTCondor startd joins by itself as soon as its VM
boots. Before ``unless_started`` the provisioner destroyed such a VM whatever it ran
(``epu sim --seed 1 --scenario htcondor-booting-terminates``: a job killed at t=627 s).
"""

from __future__ import annotations

import pytest
from epu.common.clock import ManualClock
from epu.common.messages import LaunchRequest, TerminateRequest
from epu.services.provisioner.cloud import TAG_DEPLOYMENT, TAG_LAUNCH, TAG_STORE, CloudNode
from epu.services.provisioner.sim import SimulatedNodeDriver
from epu.services.provisioner.unstarted import judge


def node(state: str | None, native: str = "x") -> CloudNode:
    return CloudNode("c-1", "worker-1", state, native, "10.0.0.1")


@pytest.mark.parametrize(("state", "listed_as", "listed", "may_exist", "verdict"), [
    ("pending", "pending", True, True, "destroy"),
    ("requested", "pending", True, True, "destroy"),
    ("pending", "started", True, True, "refuse"),
    ("requested", "started", True, True, "refuse"),
    ("started", None, False, True, "refuse"),        # the record says so: no listing needed
    ("joined", None, False, True, "refuse"),
    ("pending", None, False, True, "wait"),          # the listing failed
    ("pending", "absent", True, True, "wait"),       # not listed: unknown, not gone
    ("requested", "absent", True, True, "wait"),     # its create is in flight or was tried
    ("requested", "absent", True, False, "close"),   # no create made: nothing to destroy
    (None, "absent", True, False, "close"),          # unknown here, no node anywhere (as before)
    (None, "pending", True, False, "destroy"),
    (None, "started", True, False, "refuse"),
    ("pending", "failed", True, True, "wait"),       # a listing may show a running node ERROR
    ("pending", "terminated", True, True, "wait"),
    ("pending", "unknown", True, True, "refuse"),    # STOPPED, REBOOTING...: it ran
    ("terminating", None, False, True, "accepted"),
    ("terminated", None, False, True, "over"),
    ("failed", None, False, True, "over"),
])
def test_the_verdict(state, listed_as, listed, may_exist, verdict) -> None:
    n = None if listed_as in (None, "absent") else node(None if listed_as == "unknown" else listed_as)
    assert judge(state, n, listed=listed, create_may_exist=may_exist).verdict == verdict


def test_a_node_the_polls_keep_missing_is_taken_as_gone() -> None:
    """Bounded: the poll presumes it gone after ``vanish_misses`` listings; waiting longer would
    leave the terminate unanswered for good (the engine's pipeline unhealthy: nothing counted lost)."""
    assert judge("pending", None, listed=True, create_may_exist=True, presumed_gone=True).verdict == "destroy"
    assert judge("pending", None, listed=False, create_may_exist=True, presumed_gone=True).verdict == "wait"


def launch(i: int = 1) -> LaunchRequest:
    return LaunchRequest(launch_id=f"launch-{i}", domain="alpha", site="sim", node_name=f"worker-{i}")


def unless_started(i: int = 1, **kw: object) -> TerminateRequest:
    return TerminateRequest(request_id=f"t-{i}", instance_id=f"launch-{i}", domain="alpha",
                            reason="operator's terminate: never in the batch system", unless_started=True, **kw)


def live(cloud: SimulatedNodeDriver) -> int:
    return cloud.ex_count(live_only=True)


def test_a_node_still_booting_is_destroyed(make_provisioner, cloud) -> None:
    prov, events = make_provisioner({"sim": cloud})
    prov.handle_launch(launch())
    assert prov.wait_idle() and prov.store.get("launch-1").state == "pending"
    prov.handle_terminate(unless_started())
    assert prov.wait_idle()
    assert live(cloud) == 0
    assert events.states("launch-1") == ["requested", "pending", "terminating"]
    assert "still booting" in prov.store.get("launch-1").reason


def test_a_node_that_booted_before_the_poll_is_refused_and_recorded_started(make_provisioner, cloud,
                                                                             clock: ManualClock) -> None:
    """The record still says pending (no poll since the boot): the cloud is asked, not the record."""
    prov, events = make_provisioner({"sim": cloud})
    prov.handle_launch(launch())
    assert prov.wait_idle()
    clock.advance(30)  # booted; the provisioner has not polled
    assert prov.store.get("launch-1").state == "pending"
    prov.handle_terminate(unless_started())
    assert prov.wait_idle()
    assert live(cloud) == 1
    rec = prov.store.get("launch-1")
    assert rec.state == "started" and rec.reason.startswith("terminate refused")
    assert events.states("launch-1") == ["requested", "pending", "started"]
    # the engine's safe way out ends with a plain terminate once the node is removed: carried out
    prov.handle_terminate(TerminateRequest(request_id="t-2", instance_id="launch-1", domain="alpha",
                                           reason="operator's terminate: removed from the batch system"))
    assert prov.wait_idle() and live(cloud) == 0


def test_a_record_already_started_is_refused_again_without_a_cloud_call(make_provisioner, cloud,
                                                                        clock: ManualClock) -> None:
    """The engine had not heard the ``started`` yet when it sent: the record is told again (same seq)."""
    calls: list[str] = []
    prov, events = make_provisioner({"sim": cloud}, on_cloud_call=lambda site, op, *_: calls.append(op))
    prov.handle_launch(launch())
    assert prov.wait_idle()
    clock.advance(30)
    assert prov.poll("sim").transitions == 1
    calls.clear()
    prov.handle_terminate(unless_started())
    assert prov.wait_idle()
    assert live(cloud) == 1 and calls == []
    told = events.for_("launch-1")[-1]
    assert told.state == "started" and told.seq == prov.store.get("launch-1").seq
    assert told.reason.startswith("terminate refused: the instance is started")


def test_an_unknown_answer_destroys_nothing_and_a_resend_decides(make_provisioner, cloud) -> None:
    prov, events = make_provisioner({"sim": cloud})
    prov.handle_launch(launch())
    assert prov.wait_idle()
    cloud.inject("transient", 5, call="list")  # the listing fails past every retry
    prov.handle_terminate(unless_started())
    assert prov.wait_idle()
    assert live(cloud) == 1 and prov.store.get("launch-1").state == "pending"
    assert events.states("launch-1") == ["requested", "pending"]
    prov.handle_terminate(unless_started())  # the engine's re-send (same request id)
    assert prov.wait_idle()
    assert live(cloud) == 0 and events.states("launch-1")[-1] == "terminating"


def test_forced_and_plain_terminates_are_carried_out_as_before(make_provisioner, cloud, clock) -> None:
    prov, _ = make_provisioner({"sim": cloud})
    prov.handle_launch(launch(1))
    prov.handle_launch(launch(2))
    assert prov.wait_idle()
    clock.advance(30)  # both run, both records pending
    prov.handle_terminate(unless_started(1, force=True))
    prov.handle_terminate(TerminateRequest(request_id="t-2", instance_id="launch-2", domain="alpha"))
    assert prov.wait_idle()
    assert live(cloud) == 0
    rec = prov.store.get("launch-1")
    assert rec.reason.endswith("(proof: forced)") and rec.end_proof == "forced"
    # the two terminates run on the provisioner's workers in either order: the ledger holds both
    assert sorted((d.instance_id, d.proof) for d in prov.store.destroys()) == [("launch-1", "forced"),
                                                                              ("launch-2", "removed")]


def test_an_instance_this_store_does_not_know_is_destroyed_only_while_booting(make_provisioner, cloud, clock) -> None:
    """A store replaced by an empty one: the node found by its launch id is judged like any."""
    prov, events = make_provisioner({"sim": cloud})
    size, image = cloud.list_sizes()[0], cloud.list_images()[0]
    tags = {TAG_DEPLOYMENT: "epu-old", TAG_STORE: "old", "epu-domain": "alpha"}
    cloud.create_node("worker-1", size, image, ex_metadata={**tags, TAG_LAUNCH: "launch-1"})
    clock.advance(30)  # launch-1's node runs
    cloud.create_node("worker-2", size, image, ex_metadata={**tags, TAG_LAUNCH: "launch-2"})
    prov.handle_terminate(unless_started(1))
    prov.handle_terminate(unless_started(2))
    prov.handle_terminate(unless_started(3))
    assert prov.wait_idle()
    assert {n.name for n in cloud.list_nodes() if n.state.value != "terminated"} == {"worker-1"}
    assert events.states("launch-2") == ["terminating"]
    assert events.states("launch-3") == ["terminated"]


def test_a_started_node_this_store_does_not_know_is_recorded_and_told_started(make_provisioner, cloud,
                                                                             clock) -> None:
    """Issue 33: ``new-store`` left orphan VMs (invariant 5) since 5c729a2. A store replaced by an
    empty one is asked to terminate, ``unless_started``, an instance the engine still holds
    pending; its node runs. The refusal was silent — "the store that launched it tells the engine"
    — but that store is gone: the engine re-sent the terminate forever and the VM was never
    ended. Now the node is recorded ``started`` here (found by its launch id) and announced, so
    the engine takes it out the safe way, and the plain terminate that follows ends it."""
    prov, events = make_provisioner({"sim": cloud})
    size, image = cloud.list_sizes()[0], cloud.list_images()[0]
    tags = {TAG_DEPLOYMENT: "epu-old", TAG_STORE: "old", "epu-domain": "alpha", TAG_LAUNCH: "launch-1"}
    cloud.create_node("worker-1", size, image, ex_metadata=tags)
    clock.advance(30)  # it runs
    prov.handle_terminate(unless_started(1))
    assert prov.wait_idle()
    assert live(cloud) == 1
    rec = prov.store.get("launch-1")
    assert rec is not None and (rec.state, rec.site) == ("started", "sim") and rec.cloud_id is not None
    assert events.states("launch-1") == ["started"]
    assert events.for_("launch-1")[0].reason.startswith("terminate refused")
    prov.handle_terminate(unless_started(1))  # a re-send that crossed the answer: refused again, told again
    assert prov.wait_idle() and live(cloud) == 1 and events.states("launch-1") == ["started", "started"]
    # the engine's safe way out: drained, removed, then a plain terminate
    prov.handle_terminate(TerminateRequest(request_id="t-9", instance_id="launch-1", domain="alpha",
                                           reason="removed from the batch system"))
    assert prov.wait_idle() and live(cloud) == 0
    assert events.states("launch-1")[-1] == "terminating"


def test_an_unknown_instance_whose_lookup_failed_is_neither_destroyed_nor_closed(make_provisioner, cloud,
                                                                               clock) -> None:
    """A site that cannot be asked where the node is: unknown, not "no node anywhere"."""
    prov, events = make_provisioner({"sim": cloud})
    size, image = cloud.list_sizes()[0], cloud.list_images()[0]
    tags = {TAG_DEPLOYMENT: "epu-old", TAG_STORE: "old", "epu-domain": "alpha", TAG_LAUNCH: "launch-2"}
    cloud.create_node("worker-2", size, image, ex_metadata=tags)  # still booting
    cloud.inject("transient", 5, call="list")  # the lookup fails past every retry
    prov.handle_terminate(unless_started(2))
    assert prov.wait_idle()
    assert live(cloud) == 1 and prov.store.get("launch-2") is None and events.states("launch-2") == []
    prov.handle_terminate(unless_started(2))  # the engine's re-send decides
    assert prov.wait_idle()
    assert live(cloud) == 0 and events.states("launch-2") == ["terminating"]


def test_a_node_the_polls_missed_until_presumed_gone_is_terminated(make_provisioner, cloud, clock) -> None:
    """The VM vanished while booting: one listing without it is unknown (the terminate waits for
    the re-send), but the poll's presumption ends the wait — else the terminate would stay
    unanswered for good (``epu sim --seeds 2 --scenario vanish-preempt`` did not converge)."""
    prov, events = make_provisioner({"sim": cloud})
    prov.handle_launch(launch())
    assert prov.wait_idle()
    cloud.ex_vanish(prov.store.get("launch-1").cloud_id)
    prov.handle_terminate(unless_started())
    assert prov.wait_idle() and events.states("launch-1") == ["requested", "pending"]  # not listed: waits
    for _ in range(3):
        clock.advance(30)
        prov.poll("sim")
    assert prov.store.get("launch-1").presumed_gone
    prov.handle_terminate(unless_started())  # the engine's re-send
    assert prov.wait_idle()
    assert prov.store.get("launch-1").state in ("terminating", "terminated")
