"""The engine in-process (fake bus, ManualClock): life cycle, intent log, guard rails, changes."""

from __future__ import annotations

import pytest
from epu.common.messages import NodeCommandResult, PolicyChange
from epu.services.decision.actions import Decision, Terminate
from epu.services.decision.placement import SiteInfo
from epu.services.decision.planner import PlacementInput, plan

from tests.decision.helpers import T0, config, event, inst, jobs, make_engine, node, snapshot, view


def result(cmd, ok=True, error=None):
    return NodeCommandResult(command_id=cmd.command_id, domain=cmd.domain, action=cmd.action, node=cmd.node,
                             ok=ok, error=error)


def step(e, clock, **snap):
    clock.advance(5)
    e.on_snapshot(snapshot(at=clock.now(), **snap))
    return e.iterate()


def test_full_life_cycle_launch_add_join_offline_remove_terminate():
    e, bus, clock = make_engine()
    e.on_snapshot(snapshot(queued=jobs(2)))
    (rec,) = e.iterate()
    launches = bus.of("instance.launch")
    assert len(launches) == 2 and rec.saw.queued_jobs == 2 and [a.kind for a in rec.actions] == ["launch"] * 2
    assert launches[0].node_name == f"d-{launches[0].launch_id[:16]}"
    bus.clear()
    for n, launch in enumerate(launches):
        e.on_instance_event(event(launch, "pending", 1, clock.now()))
        e.on_instance_event(event(launch, "started", 2, clock.now(), ip=f"10.0.0.{n + 1}"))
    step(e, clock, queued=jobs(2))
    adds = bus.of("node.command")
    assert [(c.action, c.address, c.cores) for c in adds] == [("add", "10.0.0.1", 1), ("add", "10.0.0.2", 1)]
    assert adds[0].instance_id == launches[0].launch_id
    bus.clear()
    for c in adds:
        e.on_node_result(result(c))
    busy = [node(la.node_name, "busy", used=1, jobs_=[str(i)]) for i, la in enumerate(launches)]
    step(e, clock, nodes=busy)
    assert bus.sent == []  # running jobs: nothing to do
    assert {i.state for i in e.store.instances("d")} == {"joined"}
    step(e, clock, nodes=[node(la.node_name) for la in launches])
    offs = bus.of("node.command")
    assert [c.action for c in offs] == ["offline", "offline"]
    bus.clear()
    for c in offs:
        e.on_node_result(result(c))
    step(e, clock, nodes=[node(la.node_name, "offline", used=1, jobs_=["9"]) for la in launches])
    assert bus.sent == []  # a job still runs on the offlined nodes: wait
    step(e, clock, nodes=[node(la.node_name, "offline") for la in launches])
    removes = bus.of("node.command")
    assert [c.action for c in removes] == ["remove", "remove"]
    bus.clear()
    for c in removes:
        e.on_node_result(result(c))
    step(e, clock, nodes=[])
    terms = bus.of("instance.terminate")
    assert sorted(t.instance_id for t in terms) == sorted(la.launch_id for la in launches)
    bus.clear()
    for launch in launches:
        e.on_instance_event(event(launch, "terminating", 3, clock.now()))
        e.on_instance_event(event(launch, "terminated", 4, clock.now()))
    clock.advance(100)
    step(e, clock, nodes=[])
    assert bus.sent == [] and e.store.instances("d") == []
    assert all(a["done"] for a in e.store.actions("d"))


def test_unavailable_snapshot_never_scales_down():
    e, bus, clock = make_engine(cfg=config(domains={"d": {"params": {"idle_seconds": 60}}}))
    e.on_snapshot(snapshot(queued=jobs(1)))
    e.iterate()
    (launch,) = bus.of("instance.launch")
    e.on_instance_event(event(launch, "started", 1, clock.now()))
    step(e, clock, queued=[])
    (add,) = bus.of("node.command")
    e.on_node_result(result(add))
    step(e, clock, nodes=[node(launch.node_name)])
    bus.clear()
    # idle now, but the sensor cannot read the cluster: empty lists are not an empty cluster
    clock.advance(5)
    e.on_snapshot(snapshot(at=clock.now(), available=False))
    for _ in range(30):
        clock.advance(5)
        e.iterate()
    assert bus.sent == []
    assert e.store.instances("d")[0].state == "joined"


def test_action_stored_before_send_and_resent_with_same_id_until_outcome():
    e, bus, clock = make_engine()
    e.on_snapshot(snapshot(queued=jobs(1)))
    e.iterate()
    (launch,) = bus.of("instance.launch")
    row = e.store.action(launch.launch_id)
    assert row["kind"] == "launch" and row["attempts"] == 1 and not row["done"]
    bus.clear()
    clock.advance(31)
    e.on_snapshot(snapshot(queued=jobs(1), at=clock.now()))
    e.iterate()
    assert [m.launch_id for m in bus.of("instance.launch")] == [launch.launch_id]  # re-sent, not a new launch
    e.on_instance_event(event(launch, "pending", 1, clock.now()))
    assert e.store.action(launch.launch_id)["done"]
    bus.clear()
    clock.advance(31)
    e.on_snapshot(snapshot(queued=jobs(1), at=clock.now()))
    e.iterate()
    assert bus.of("instance.launch") == []


def test_stale_and_duplicate_instance_events_do_not_move_state_back():
    e, bus, clock = make_engine()
    e.on_snapshot(snapshot(queued=jobs(1)))
    e.iterate()
    (launch,) = bus.of("instance.launch")
    e.on_instance_event(event(launch, "started", 2, clock.now()))
    e.on_instance_event(event(launch, "pending", 1, clock.now()))   # stale
    e.on_instance_event(event(launch, "started", 2, clock.now()))   # duplicate
    assert e.store.instance(launch.launch_id).state == "started"


def test_failed_add_is_retried_after_a_backoff():
    e, bus, clock = make_engine()
    e.on_snapshot(snapshot(queued=jobs(1)))
    e.iterate()
    (launch,) = bus.of("instance.launch")
    e.on_instance_event(event(launch, "started", 1, clock.now()))
    bus.clear()
    step(e, clock, queued=jobs(1))
    (add,) = bus.of("node.command")
    e.on_node_result(result(add, ok=False, error="qmgr: Unauthorized Request"))
    bus.clear()
    step(e, clock, queued=jobs(1))
    assert bus.of("node.command") == []  # not at the next iteration: the batch system said no (retries)
    clock.advance(15)
    step(e, clock, queued=jobs(1))
    (again,) = bus.of("node.command")
    assert again.action == "add" and again.command_id != add.command_id


def test_guard_rail_never_terminates_a_node_running_a_job_unless_forced():
    v = view(nodes=[node("n-a", "busy", used=1, jobs_=["7"])], instances=[inst("a")])
    pin = PlacementInput(["s1"], "rank", {"s1": SiteInfo("s1")}, {}, {}, {})
    out = plan(v, Decision([Terminate("a", "policy says so")]), pin, set())
    assert out.actions == [] and "a job runs there" in out.notes[-1]
    out = plan(v, Decision([Terminate("a", "operator", force=True)]), pin, set())
    assert [p.kind for p in out.actions] == ["terminate"] and out.actions[0].message.force


def test_restart_continues_without_double_launch_or_forgotten_drain(tmp_path):
    url = f"sqlite:///{tmp_path / 'd.db'}"
    e, bus, clock = make_engine(url)
    e.on_snapshot(snapshot(queued=jobs(3)))
    e.iterate()
    launches = bus.of("instance.launch")
    e.on_instance_event(event(launches[0], "started", 1, clock.now()))
    step(e, clock, queued=jobs(3))
    (add,) = bus.of("node.command")
    e.on_node_result(result(add))
    step(e, clock, queued=jobs(2), nodes=[node(launches[0].node_name)])
    # joined and idle, but 2 jobs still queued and 2 instances pending: nothing new
    clock.advance(5)
    e.on_snapshot(snapshot(at=clock.now(), nodes=[node(launches[0].node_name)]))
    bus.clear()
    e.iterate()
    offs = [c for c in bus.of("node.command") if c.action == "offline"]
    assert len(offs) == 1
    # a new engine on the same store: nothing repeated, the drain goes on
    e2, bus2, _ = make_engine(url, clock=clock)
    clock.advance(5)
    e2.on_snapshot(snapshot(at=clock.now(), nodes=[node(launches[0].node_name, "offline")]))
    e2.on_node_result(result(offs[0]))
    e2.iterate()
    assert bus2.of("instance.launch") == []
    assert [c.action for c in bus2.of("node.command")] == ["remove"]


def test_policy_change_applied_versioned_and_used_next_iteration():
    e, bus, clock = make_engine()
    v1 = e.store.current_config("d")[0]
    out = e.on_policy_change(PolicyChange(change_id="c1", domain="d", policy="fixed", params={"nodes": 3},
                                          operator="alice"))
    assert out.applied and out.version == v1 + 1 and out.config["policy"] == "fixed"
    assert bus.of("policy.outcome") == [out]
    e.on_snapshot(snapshot())
    (rec,) = e.iterate()
    assert rec.policy == "fixed" and rec.policy_version == v1 + 1 and len(bus.of("instance.launch")) == 3
    # re-delivered: answered again, not applied twice
    again = e.on_policy_change(PolicyChange(change_id="c1", domain="d", policy="fixed", params={"nodes": 3}))
    assert again.applied and again.version == v1 + 1 and e.store.current_config("d")[0] == v1 + 1


@pytest.mark.parametrize(("change", "reason"), [
    ({"policy": "magic"}, "unknown policy 'magic'"),
    ({"params": {"idle_secnds": 1}}, "queue-demand.idle_secnds: unknown parameter"),
    ({"min_nodes": 5, "max_nodes": 2}, "min_nodes (5) is greater than max_nodes (2)"),
    ({"sites": ["mars"]}, "unknown site(s) mars"),
    ({"placement": "random"}, "placement"),
    ({"domain": "other"}, "unknown domain 'other'"),
])
def test_bad_policy_change_rejected_with_reason(change, reason):
    e, bus, clock = make_engine()
    before = e.store.current_config("d")
    out = e.on_policy_change(PolicyChange(change_id="bad", **{"domain": "d", **change}))
    assert not out.applied and reason in out.reason
    assert e.store.current_config("d") == before


def test_pause_and_resume():
    e, bus, clock = make_engine()
    assert e.on_policy_change(PolicyChange(change_id="p", domain="d", paused=True)).applied
    e.on_snapshot(snapshot(queued=jobs(4)))
    assert e.iterate() == [] and bus.of("instance.launch") == []
    assert e.on_policy_change(PolicyChange(change_id="r", domain="d", paused=False)).applied
    e.iterate()
    assert len(bus.of("instance.launch")) == 4


def test_operator_listing_sites_lets_a_backed_off_site_back():
    e, bus, clock = make_engine(cfg=config(domains={"d": {"sites": ["s1"]}}))
    e.on_snapshot(snapshot(queued=jobs(1)))
    e.iterate()
    (launch,) = bus.of("instance.launch")
    e.on_instance_event(event(launch, "failed", 1, clock.now(), error_kind="permanent", reason="bad image"))
    bus.clear()
    step(e, clock, queued=jobs(1))
    assert bus.of("instance.launch") == []  # backing off, no other site
    assert e.on_policy_change(PolicyChange(change_id="s", domain="d", sites=["s1"])).applied
    step(e, clock, queued=jobs(1))
    assert [m.site for m in bus.of("instance.launch")] == ["s1"]


def test_standby_without_snapshot_never_acts():
    e, bus, clock = make_engine()
    assert e.iterate() == [] and bus.sent == []
    e.on_snapshot(snapshot(queued=jobs(1)))
    clock.advance(181)  # no snapshot for longer than the active window: this engine is not active
    assert e.iterate() == [] and bus.sent == []


def test_config_with_bad_policy_params_fails_at_start():
    with pytest.raises(ValueError, match="domains.d: queue-demand.bogus: unknown parameter"):
        make_engine(cfg=config(domains={"d": {"params": {"bogus": 1}}}))


def test_decision_record_explains():
    e, bus, clock = make_engine()
    e.on_snapshot(snapshot(queued=jobs(2), nodes=[node("static1")]))
    (rec,) = e.iterate()
    assert rec.saw.nodes_by_state == {"free": 1} and rec.saw.instances_by_state == {}  # before acting
    assert "1 free workers" in rec.notes[0] and rec.actions[0].reason.startswith("queue demand")
    assert bus.of("decision.record") == [rec]
    assert rec.at >= T0


def test_a_burst_goes_out_as_one_batch_and_a_failed_batch_is_resent_whole():
    e, bus, clock = make_engine()
    batches: list[list] = []
    broker_up = False

    def publish_many(msgs):
        if not broker_up:
            raise ConnectionError("broker gone")
        batches.append(list(msgs))
        for m in msgs:
            bus(m)

    e.publish_many = publish_many
    e.on_snapshot(snapshot(queued=jobs(3)))
    e.iterate()  # the batch fails (and its re-send too; both logged): nothing counts as sent ...
    stored = e.store.actions("d", "launch")
    assert len(stored) == 3 and all(a["sent_at"] is None for a in stored)
    assert bus.of("instance.launch") == []
    broker_up = True
    clock.advance(5)
    e.on_snapshot(snapshot(queued=jobs(3), at=clock.now()))
    e.iterate()  # ... and the same three launches go out next iteration as one batch, none anew
    assert [len(b) for b in batches] == [3]
    assert {m.launch_id for m in bus.of("instance.launch")} == {a["action_id"] for a in stored}
    assert all(a["sent_at"] == clock.now() for a in e.store.actions("d", "launch"))


def test_a_reopened_failed_launch_is_taken_back_as_live_and_added():
    """Issue 26, defect 6: the provisioner reopens a launch it closed ``failed`` when the cloud
    lists its node alive (``previous: failed``); the engine takes the instance back — it may have
    joined by itself — rather than leaving a node nobody drains."""
    e, bus, clock = make_engine()
    e.on_snapshot(snapshot(queued=jobs(1)))
    e.iterate()
    (launch,) = bus.of("instance.launch")
    bus.clear()
    e.on_instance_event(event(launch, "failed", 3, clock.now(), error_kind="transient", reason="503"))
    assert e.store.instance(launch.launch_id).state == "failed"
    # a live word older than the failure does not undo an end (rule 4), nor raises its seq...
    e.on_instance_event(event(launch, "pending", 2, clock.now()))
    assert (e.store.instance(launch.launch_id).state, e.store.instance(launch.launch_id).seq) == ("failed", 3)
    # ...a later one does: a provisioner's record moves on from failed only by reopening it
    clock.advance(60)
    reopened = event(launch, "started", 4, clock.now(), ip="10.0.0.7").model_copy(update={"previous": "failed"})
    e.on_instance_event(reopened)
    inst = e.store.instance(launch.launch_id)
    assert (inst.state, inst.ip, inst.seq, inst.launched_at) == ("started", "10.0.0.7", 4, clock.now())
    assert launch.launch_id in {i.instance_id for i in e.store.instances("d")}
    # the failure it undid, late (a delayed event, an older report entry): older than the reopening
    e.on_instance_event(event(launch, "failed", 3, clock.now(), error_kind="transient", reason="503"))
    e.on_instance_event(event(launch, "failed", 3, clock.now(), error_kind="transient"), repair=True)
    assert e.store.instance(launch.launch_id).state == "started"
    step(e, clock, queued=jobs(1))
    adds = [c for c in bus.of("node.command") if c.action == "add"]
    assert [(c.instance_id, c.address) for c in adds] == [(launch.launch_id, "10.0.0.7")]
