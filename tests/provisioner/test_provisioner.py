"""The provisioner against the simulated cloud: idempotency, errors, polling, reconciliation."""

from __future__ import annotations

import pytest
from epu.common.clock import ManualClock
from epu.common.messages import LaunchRequest, TerminateRequest
from epu.common.testing import wait_for
from epu.services.provisioner.cloud import TAG_DEPLOYMENT, TAG_LAUNCH, TAG_STORE
from epu.services.provisioner.sim import SimulatedNodeDriver


def launch(i: int = 1, site: str = "sim", **kw: object) -> LaunchRequest:
    return LaunchRequest(launch_id=f"launch-{i}", domain="alpha", site=site, node_name=f"worker-{i}", **kw)


def test_duplicate_and_redelivered_launch_make_one_instance(make_provisioner, cloud: SimulatedNodeDriver) -> None:
    prov, events = make_provisioner({"sim": cloud})
    for _ in range(5):
        prov.handle_launch(launch())
    assert prov.wait_idle()
    prov.handle_launch(launch())  # a late redelivery after the launch landed
    assert prov.wait_idle()
    assert cloud.ex_count() == 1
    rec = prov.store.get("launch-1")
    assert rec.state == "pending" and rec.cloud_id
    assert events.states("launch-1") == ["requested", "pending"]
    [node] = cloud.list_nodes()
    assert node.extra["tags"][TAG_LAUNCH] == "launch-1" and node.extra["tags"]["epu-domain"] == "alpha"
    assert node.extra["client_token"] == "launch-1"
    assert node.extra["userdata_bytes"] > 0


def test_events_carry_node_name_ip_and_increasing_seq(make_provisioner, cloud, clock: ManualClock) -> None:
    prov, events = make_provisioner({"sim": cloud})
    prov.handle_launch(launch(cores=4))
    assert prov.wait_idle()
    assert prov.poll("sim").transitions == 0
    clock.advance(30)
    assert prov.poll("sim").transitions == 1
    assert prov.poll("sim").transitions == 0  # each transition published once
    started = events.for_("launch-1")[-1]
    assert started.state == "started" and started.node_name == "worker-1" and started.ip and started.cores == 4
    assert [e.seq for e in events.for_("launch-1")] == [1, 2, 3]
    prov.handle_terminate(TerminateRequest(request_id="t1", instance_id="launch-1", domain="alpha", reason="idle"))
    assert prov.wait_idle()
    prov.poll("sim")
    assert events.states("launch-1") == ["requested", "pending", "started", "terminating", "terminated"]
    # idempotent: repeating the terminate changes nothing
    prov.handle_terminate(TerminateRequest(request_id="t1", instance_id="launch-1", domain="alpha"))
    assert prov.wait_idle() and len(events.for_("launch-1")) == 5


def test_unknown_terminate_without_a_node_is_recorded_terminal(make_provisioner, cloud) -> None:
    prov, events = make_provisioner({"sim": cloud})
    rec = prov.handle_terminate(TerminateRequest(request_id="t", instance_id="nobody", domain="alpha"))
    assert rec.state == "terminating" and rec.site == ""  # stored before any cloud call
    assert prov.wait_idle()
    assert events.states("nobody") == ["terminating", "terminated"]
    assert "no node carries its launch id" in prov.store.get("nobody").reason
    # a launch arriving later for that id is not started
    prov.handle_launch(LaunchRequest(launch_id="nobody", domain="alpha", site="sim", node_name="n"))
    assert prov.wait_idle() and cloud.ex_count() == 0


def test_unknown_terminate_destroys_the_node_carrying_its_launch_id(make_provisioner, cloud, clock) -> None:
    """A store replaced by a new, empty one: the engine's terminates for the old store's instances
    reach a provisioner that never heard of them. It finds each node by its launch id (whatever
    deployment tag it carries) and destroys it — never a node of another domain."""
    prov, events = make_provisioner({"sim": cloud})
    size, image = cloud.list_sizes()[0], cloud.list_images()[0]
    cloud.create_node("old-1", size, image, ex_metadata={TAG_DEPLOYMENT: "epu-old", TAG_STORE: "old",
                                                          TAG_LAUNCH: "old-1", "epu-domain": "alpha"})
    cloud.create_node("other", size, image, ex_metadata={TAG_DEPLOYMENT: "epu-old", TAG_STORE: "old",
                                                          TAG_LAUNCH: "other-1", "epu-domain": "beta"})
    prov.handle_terminate(TerminateRequest(request_id="t1", instance_id="old-1", domain="alpha", reason="idle"))
    prov.handle_terminate(TerminateRequest(request_id="t2", instance_id="other-1", domain="alpha"))
    assert prov.wait_idle()
    live = {n.name for n in cloud.list_nodes() if n.state.value != "terminated"}
    assert live == {"other"}
    rec = prov.store.get("old-1")
    assert rec.state == "terminating" and rec.site == "sim" and rec.cloud_id
    assert prov.store.get("other-1").state == "terminated"  # its domain is not the terminate's
    for _ in range(4):  # not listed as ours (another deployment's tag): closed once it is missed enough
        clock.advance(30)
        prov.poll("sim")
    assert events.states("old-1") == ["terminating", "terminated"]


def test_unknown_terminate_whose_lookup_failed_is_retried_by_reconciliation(make_provisioner, cloud) -> None:
    prov, events = make_provisioner({"sim": cloud})
    cloud.create_node("old-1", cloud.list_sizes()[0], cloud.list_images()[0],
                      ex_metadata={TAG_DEPLOYMENT: "epu-old", TAG_LAUNCH: "old-1", "epu-domain": "alpha"})
    cloud.inject("transient", 5, call="list")  # the listing fails past every retry
    prov.handle_terminate(TerminateRequest(request_id="t1", instance_id="old-1", domain="alpha"))
    assert prov.wait_idle()
    assert prov.store.get("old-1").site == ""
    prov.reconcile_all()
    assert prov.wait_idle()
    assert prov.store.get("old-1").site == "sim"
    assert [n.name for n in cloud.list_nodes() if n.state.value != "terminated"] == []


def test_transient_errors_converge(make_provisioner, cloud) -> None:
    prov, events = make_provisioner({"sim": cloud})
    cloud.inject("transient", 3)
    prov.handle_launch(launch())
    assert prov.wait_idle()
    assert prov.store.get("launch-1").state == "pending" and cloud.ex_count() == 1
    assert cloud.calls["create"] == 4


def test_capacity_reported_at_once(make_provisioner, cloud) -> None:
    prov, events = make_provisioner({"sim": cloud})
    cloud.set_knobs(quota=0)
    prov.handle_launch(launch())
    assert prov.wait_idle()
    failed = events.for_("launch-1")[-1]
    assert failed.state == "failed" and failed.error_kind == "capacity" and "InstanceLimitExceeded" in failed.reason
    assert cloud.calls["create"] == 1  # not retried: the engine fails over instead


def test_site_quota_is_a_capacity_error(make_provisioner, cloud) -> None:
    prov, events = make_provisioner({"sim": cloud}, site_kw={"quota": 2})
    for i in range(3):
        prov.handle_launch(launch(i))
    assert prov.wait_idle()
    last = events.for_("launch-2")[-1]
    assert last.state == "failed" and last.error_kind == "capacity" and "quota" in last.reason
    assert cloud.ex_count() == 2


def test_permanent_errors_fail_with_reason(make_provisioner, cloud) -> None:
    prov, events = make_provisioner({"sim": cloud}, site_kw={"image": "no-such-image"})
    cloud.set_knobs(images=["sim-image"])
    prov.handle_launch(launch(1))
    prov.handle_launch(launch(2, site="nowhere"))
    assert prov.wait_idle()
    one, two = events.for_("launch-1")[-1], events.for_("launch-2")[-1]
    assert one.state == "failed" and one.error_kind == "permanent" and "InvalidAMIID" in one.reason
    assert two.state == "failed" and two.error_kind == "permanent" and "unknown site" in two.reason


def test_lost_answers_never_make_a_second_node(make_provisioner, cloud, clock: ManualClock) -> None:
    prov, events = make_provisioner({"sim": cloud})
    cloud.inject("lost", 2)  # created, but the answer timed out: retried with the same token
    prov.handle_launch(launch(1))
    assert prov.wait_idle()
    assert prov.store.get("launch-1").state == "pending"
    # a provider without client tokens: no second create after a lost answer (a listing may not
    # show the first node yet); reconciliation adopts it by its launch-id tag
    cloud.client_tokens = False
    creates = cloud.calls["create"]
    cloud.inject("lost", 1)
    prov.handle_launch(launch(2))
    assert prov.wait_idle()
    assert cloud.ex_count() == 2 and cloud.calls["create"] == creates + 1
    rec = prov.store.get("launch-2")
    assert rec.state == "requested" and rec.cloud_id is None and "create outcome unknown" in rec.reason
    assert events.states("launch-2") == ["requested"]
    assert prov.reconcile("sim").adopted == ["launch-2"]
    assert prov.store.get("launch-2").state == "pending" and cloud.ex_count() == 2


def test_a_create_with_unknown_outcome_is_driven_again_only_after_a_wait(make_provisioner, cloud,
                                                                         clock: ManualClock) -> None:
    """Without client tokens a 5xx on create may or may not have made the node. Nothing listed: the
    launch is created again, but only ``resume_after_seconds`` after the attempt, when a node made
    by it would be listed."""
    prov, events = make_provisioner({"sim": cloud})
    cloud.client_tokens = False
    cloud.inject("transient", 1)  # refused before anything was made
    prov.handle_launch(launch())
    assert prov.wait_idle()
    assert prov.store.get("launch-1").state == "requested" and cloud.ex_count() == 0
    clock.advance(10)
    assert prov.reconcile("sim").resumed == [] and prov.wait_idle() and cloud.ex_count() == 0
    clock.advance(30)
    assert prov.reconcile("sim").resumed == ["launch-1"] and prov.wait_idle()
    assert cloud.ex_count() == 1 and prov.store.get("launch-1").state == "pending"


def test_slow_site_does_not_block_another(make_provisioner, tmp_path, clock: ManualClock) -> None:
    slow = SimulatedNodeDriver(path=str(tmp_path / "slow.db"), api_latency=1.0, clock=clock)
    fast = SimulatedNodeDriver(path=str(tmp_path / "fast.db"), clock=clock)
    prov, events = make_provisioner({"slow": slow, "fast": fast}, site_kw={"max_in_flight": 2})
    for i in range(4):
        prov.handle_launch(launch(i, site="slow"))
    for i in range(10, 16):
        prov.handle_launch(launch(i, site="fast"))
    wait_for(lambda: fast.ex_count() == 6, timeout=0.9, message="fast site done while slow site busy")
    assert slow.ex_count() <= 2
    assert prov.wait_idle(10)


def test_vanished_node_is_presumed_gone_never_closed_and_readopted(make_provisioner, cloud, clock) -> None:
    """Was: two polls without the node closed the record as terminated, and the next reconcile
    destroyed the node when a partial listing had hidden it (issue 11). Now absence only flags
    the record, announced with its own seq, and a node listed again is re-adopted."""
    prov, events = make_provisioner({"sim": cloud})
    prov.handle_launch(launch())
    assert prov.wait_idle()
    cloud.inject("partial", 4, call="list")  # four listings omit the node (a short page)
    for _ in range(4):
        clock.advance(30)
        prov.poll("sim")
    rec = prov.store.get("launch-1")
    assert rec.state == "pending" and rec.presumed_gone  # 3 misses over 60 s: presumed, not closed
    gone = events.for_("launch-1")[-1]
    assert gone.presumed_gone and gone.state == gone.previous == "pending" and "presumed gone" in gone.reason
    report = prov.reconcile("sim")  # the listing is whole again
    assert report.readopted == ["launch-1"] and report.swept == [] and cloud.ex_count() == 1
    back = events.for_("launch-1")
    assert not back[-1].presumed_gone and back[-1].state == "started" and back[-2].reason.endswith("re-adopted")
    assert [e.seq for e in back] == list(range(1, len(back) + 1))


def test_boot_failure_reported(make_provisioner, cloud, clock: ManualClock) -> None:
    cloud.set_knobs(boot_failure_rate=1.0)
    prov, events = make_provisioner({"sim": cloud})
    prov.handle_launch(launch())
    assert prov.wait_idle()
    clock.advance(30)
    prov.poll("sim")  # one listing of ERROR is one listing's word (issue 26): not yet
    assert events.states("launch-1")[-1] == "pending" and cloud.ex_count() == 1
    for _ in range(3):  # the run of listings a presumption takes: a failed boot, the node destroyed
        clock.advance(30)
        prov.poll("sim")
    assert events.states("launch-1")[-1] == "failed"
    assert events.for_("launch-1")[-1].error_kind == "transient" and "boot failed" in events.for_("launch-1")[-1].reason


def test_reconcile_adopts_known_and_sweeps_unknown_after_grace(make_provisioner, cloud, clock: ManualClock) -> None:
    prov, events = make_provisioner({"sim": cloud}, grace=60)
    # a launch stored, whose node exists in the cloud but the store never heard of it
    prov.store.record_launch(launch(1), clock.now())
    prov.store.note_cloud_attempt("launch-1", clock.now())
    store = prov.identity.store_id
    tags = {TAG_DEPLOYMENT: "epu", TAG_STORE: store, TAG_LAUNCH: "launch-1"}
    cloud.create_node("worker-1", cloud.list_sizes()[0], cloud.list_images()[0], ex_metadata=tags)
    # an orphan: tagged with our deployment and store, launch id unknown
    cloud.create_node("stray", cloud.list_sizes()[0], cloud.list_images()[0],
                      ex_metadata={TAG_DEPLOYMENT: "epu", TAG_STORE: store, TAG_LAUNCH: "who-knows"})
    # someone else's node: never touched
    cloud.create_node("other", cloud.list_sizes()[0], cloud.list_images()[0],
                      ex_metadata={TAG_DEPLOYMENT: "other", TAG_LAUNCH: "x"})
    report = prov.reconcile("sim")
    assert report.adopted == ["launch-1"] and report.swept == [] and len(report.waiting_orphans) == 1
    assert prov.store.get("launch-1").cloud_id
    clock.advance(61)
    report = prov.reconcile("sim")
    assert len(report.swept) == 1
    live = {n.name for n in cloud.list_nodes() if n.state.value != "terminated"}
    assert live == {"worker-1", "other"}


def test_reconcile_adopts_a_node_of_this_store_whose_launch_it_lost(make_provisioner, cloud, clock) -> None:
    """A store restored from a backup does not know the launches made since. Their nodes carry this
    store's tags and a domain: adopted and announced (the engine decides), never swept."""
    prov, events = make_provisioner({"sim": cloud}, grace=60)
    tags = {TAG_DEPLOYMENT: "epu", TAG_STORE: prov.identity.store_id, TAG_LAUNCH: "after-backup",
            "epu-domain": "alpha"}
    cloud.create_node("worker-9", cloud.list_sizes()[0], cloud.list_images()[0], ex_metadata=tags)
    report = prov.reconcile("sim")
    assert report.adopted == ["after-backup"] and report.waiting_orphans == [] and report.swept == []
    rec = prov.store.get("after-backup")
    assert (rec.domain, rec.site, rec.node_name, rec.state) == ("alpha", "sim", "worker-9", "pending")
    assert events.states("after-backup") == ["pending"]
    assert [a.kind for a in prov.alerts] == ["orphan-adopted"]
    clock.advance(3600)
    assert prov.reconcile("sim").swept == []
    assert [n.name for n in cloud.list_nodes() if n.state.value != "terminated"] == ["worker-9"]


def test_terminate_while_launch_in_flight(make_provisioner, tmp_path, clock: ManualClock) -> None:
    slowish = SimulatedNodeDriver(path=str(tmp_path / "s.db"), api_latency=0.3, clock=clock)
    prov, events = make_provisioner({"sim": slowish})
    prov.handle_launch(launch())
    wait_for(lambda: slowish.calls["create"] == 1, message="create call started")
    prov.handle_terminate(TerminateRequest(request_id="t", instance_id="launch-1", domain="alpha"))
    assert prov.wait_idle(10)
    wait_for(lambda: (prov.poll("sim"), prov.store.get("launch-1").state)[1] == "terminated", timeout=10,
             message="terminated")
    assert slowish.ex_count() == 0


def test_unpublished_transitions_are_published_by_the_outbox(make_provisioner, cloud, clock: ManualClock) -> None:
    prov, events = make_provisioner({"sim": cloud})
    real = prov._publish
    down = {"on": True}

    def flaky(event):  # the broker is unreachable for a while
        if down["on"]:
            raise ConnectionError("broker down")
        return real(event)

    prov._publish = flaky
    prov.handle_launch(launch())
    assert prov.wait_idle()
    assert events.items == []
    down["on"] = False
    clock.advance(30)
    assert prov.flush_outbox() == 2
    assert events.states("launch-1") == ["requested", "pending"]
    assert prov.flush_outbox() == 0  # once


def test_competing_provisioners_share_store_and_cloud(make_provisioner, tmp_path, sqlite_url, clock) -> None:
    path = str(tmp_path / "shared-cloud.db")
    a, ev_a = make_provisioner({"sim": SimulatedNodeDriver(path=path, clock=clock, api_latency=0.01)})
    b, ev_b = make_provisioner({"sim": SimulatedNodeDriver(path=path, clock=clock, api_latency=0.01)})
    for i in range(20):  # every request delivered to both (a redelivery after a lost ack)
        a.handle_launch(launch(i))
        b.handle_launch(launch(i))
    assert a.wait_idle(20) and b.wait_idle(20)
    assert SimulatedNodeDriver(path=path, clock=clock).ex_count() == 20
    assert {r.state for r in a.store.list()} == {"pending"}
    for i in range(20):  # each transition announced by exactly one of them
        states = [e.state for e in ev_a.for_(f"launch-{i}") + ev_b.for_(f"launch-{i}")]
        assert sorted(states) == ["pending", "requested"]


@pytest.mark.postgres
def test_provisioner_on_postgresql(pg_url, make_provisioner, cloud, clock: ManualClock) -> None:
    prov, events = make_provisioner({"sim": cloud}, url=pg_url)
    for _ in range(3):
        prov.handle_launch(launch())
    assert prov.wait_idle()
    clock.advance(30)
    prov.poll("sim")
    assert cloud.ex_count() == 1 and events.states("launch-1") == ["requested", "pending", "started"]
    assert [h["to_state"] for h in prov.store.history("launch-1")] == ["requested", "pending", "started"]
