"""The engine's safety rules of issue 11, one test per rule, on the real engine and store.

Each of these was a way EPU killed a running job or a healthy node (the simulator's scenarios,
``tests/sim``, found or reproduce them; docs/simulation.md has the table)."""

from __future__ import annotations

from epu.common.messages import NodeCommandResult, NodeInfo, PolicyChange, SensorSnapshot

from tests.decision.helpers import config, event, jobs, make_engine


def result(cmd, ok=True, error=None):
    return NodeCommandResult(command_id=cmd.command_id, domain=cmd.domain, action=cmd.action, node=cmd.node,
                             ok=ok, error=error)


def snap(clock, nodes=(), queued=(), running_jobs=None, available=True):
    nodes = list(nodes)
    if running_jobs is None:
        running_jobs = len({j for n in nodes for j in n.jobs})
    return SensorSnapshot(domain="d", backend="test", taken_at=clock.now(), available=available,
                          jobs=list(queued) if available else [], nodes=nodes if available else [],
                          running_jobs=running_jobs if available else 0)


class Domain:
    """An engine with ``n`` workers brought up to joined (identity reported by the backend)."""

    def __init__(self, n: int = 1, *, cfg=None, fqdn: str = "", identity: bool = True) -> None:
        self.e, self.bus, self.clock = make_engine(cfg=cfg or config(
            domains={"d": {"max_nodes": 10, "sites": ["s1", "s2"], "params": {"idle_seconds": 0}}}))
        self.fqdn, self.identity = fqdn, identity
        self.e.on_snapshot(snap(self.clock, queued=jobs(n)))
        self.e.iterate()
        self.launches = self.bus.of("instance.launch")
        for i, la in enumerate(self.launches):
            self.e.on_instance_event(event(la, "pending", 1, self.clock.now()))
            self.e.on_instance_event(event(la, "started", 2, self.clock.now(), ip=f"10.0.0.{i + 1}"))
        self.step(queued=jobs(n))
        for c in self.bus.of("node.command"):
            self.e.on_node_result(result(c))
        self.bus.clear()
        self.step(nodes=[self.node(la, "busy", jobs_=[f"j{i}"]) for i, la in enumerate(self.launches)])
        assert {i.state for i in self.e.store.instances("d")} == {"joined"}
        self.bus.clear()

    def node(self, la, state="free", jobs_=(), cores=1):
        name = la.node_name + self.fqdn
        return NodeInfo(name=name, state=state, cores=cores, cores_used=len(jobs_), jobs=list(jobs_),
                        instance_id=la.launch_id if self.identity else None)

    def step(self, seconds=10.0, **kw):
        self.clock.advance(seconds)
        self.e.on_snapshot(snap(self.clock, **kw))
        return self.e.iterate()

    def sent(self, kind):
        return [m for m in self.bus.sent if getattr(m, "action", None) == kind or
                (kind == "terminate" and m.TYPE == "instance.terminate") or
                (kind == "launch" and m.TYPE == "instance.launch")]


# ---------------------------------------------------------------- identity, not hostnames


def test_an_htcondor_fqdn_node_with_identity_joins_and_its_jobs_protect_it():
    d = Domain(2, fqdn=".cluster.internal")
    busy = [d.node(la, "busy", jobs_=["7"]) for la in d.launches]
    for _ in range(100):  # well past the stall limit: joined nodes are not stalled
        d.step(nodes=busy)
    assert d.sent("terminate") == [] and d.sent("remove") == []


def test_without_identity_the_fqdn_is_matched_by_its_short_name():
    d = Domain(1, fqdn=".cluster.internal", identity=False)
    (inst,) = d.e.store.instances("d")
    assert inst.state == "joined"


def test_a_node_reporting_another_instance_is_not_ours_even_with_our_name():
    d = Domain(1)
    (la,) = d.launches
    impostor = NodeInfo(name=la.node_name, state="busy", cores=1, cores_used=1, jobs=["1"], instance_id="someone-else")
    for _ in range(70):
        d.step(nodes=[impostor])
    # our node is missing (the one with our name is another instance's): lost, removed first
    assert {(c.command_id, c.node) for c in d.sent("remove")} == {(d.sent("remove")[0].command_id, la.node_name)}
    assert d.sent("terminate") == []


def test_commands_use_the_name_the_batch_system_reports():
    d = Domain(1, fqdn=".cluster.internal")
    (la,) = d.launches
    d.step(nodes=[d.node(la, "free")])
    (off,) = d.sent("offline")
    assert off.node == la.node_name + ".cluster.internal" and off.instance_id == la.launch_id


# ---------------------------------------------------------------- removal is confirmed, never inferred


def test_a_draining_node_missing_from_one_snapshot_is_not_terminated():
    d = Domain(1)
    (la,) = d.launches
    d.step(nodes=[d.node(la, "free")])
    (off,) = d.sent("offline")
    d.e.on_node_result(result(off))
    d.bus.clear()
    d.step(nodes=[])  # one snapshot without the node (a collector restart): it may still run jobs
    assert d.sent("terminate") == []
    (rm,) = d.sent("remove")  # the batch system is asked, and answers
    d.e.on_node_result(result(rm, ok=False, error="node runs 1 job(s)"))
    d.bus.clear()
    d.step(nodes=[d.node(la, "offline", jobs_=["9"])])
    assert d.sent("terminate") == [] and d.sent("remove") == []  # a job runs there: wait
    d.step(nodes=[d.node(la, "offline")])
    (rm,) = d.sent("remove")
    d.e.on_node_result(result(rm))
    d.bus.clear()
    d.step(nodes=[])
    (term,) = d.sent("terminate")
    assert term.instance_id == la.launch_id


def test_a_remove_answered_in_progress_or_unknown_is_asked_again_and_never_terminates():
    """Issue 26, defect 1, the engine's side: the sensor answers a ``remove`` it cannot confirm
    (HTCondor: no ads in the collector — unknown; a peaceful shutdown whose master has not exited
    yet) with a failed, transient result. The engine must keep the VM and ask again until the
    sensor answers ok — however long the node stays out of the snapshots."""
    d = Domain(1)
    (la,) = d.launches
    d.step(nodes=[d.node(la, "free")])
    (off,) = d.sent("offline")
    d.e.on_node_result(result(off))
    d.bus.clear()
    answers = ["remove n: no ad for it in the collector - unknown, not gone; retried",
               "remove n: peaceful shutdown of its master in progress; not removed until the master has exited",
               "remove n: its master still answers: shutdown in progress; retried"]
    for error in answers * 3:
        d.step(seconds=300, nodes=[])  # the collector lost it: absent from every snapshot (asked after a backoff)
        (rm,) = d.sent("remove")
        d.e.on_node_result(result(rm, ok=False, error=error))
        assert d.sent("terminate") == []
        d.bus.clear()
    d.step(seconds=300, nodes=[])
    (rm,) = d.sent("remove")
    d.e.on_node_result(result(rm))  # the master exited and the schedd lists no job there
    d.bus.clear()
    d.step(nodes=[])
    (term,) = d.sent("terminate")
    assert term.instance_id == la.launch_id


def test_stalled_instance_that_was_added_is_removed_before_it_is_terminated():
    cfg = config(domains={"d": {"max_nodes": 10, "sites": ["s1"], "params": {"stall_seconds": 300}}})
    e, bus, clock = make_engine(cfg=cfg)
    e.on_snapshot(snap(clock, queued=jobs(1)))
    e.iterate()
    (la,) = bus.of("instance.launch")
    e.on_instance_event(event(la, "pending", 1, clock.now()))
    e.on_instance_event(event(la, "started", 2, clock.now()))
    for _ in range(31):
        clock.advance(10)
        e.on_snapshot(snap(clock, queued=jobs(1)))
        e.iterate()
    (rm,) = [c for c in bus.of("node.command") if c.action == "remove"]
    assert bus.of("instance.terminate") == []  # not in the same iteration
    # the node registered and took a job after the last snapshot: the batch system refuses
    e.on_node_result(result(rm, ok=False, error="node runs 1 job(s): offline it first"))
    bus.clear()
    clock.advance(10)
    e.on_snapshot(snap(clock, nodes=[NodeInfo(name=la.node_name, state="busy", cores=1, cores_used=1,
                                              jobs=["5"], instance_id=la.launch_id)]))
    e.iterate()
    assert bus.of("instance.terminate") == []
    assert [c.action for c in bus.of("node.command")] == ["offline"]  # drained first, its job finishes


# ---------------------------------------------------------------- the circuit breaker


def test_everything_vanishing_opens_the_breaker_and_nothing_is_taken_out():
    d = Domain(5)
    busy = [d.node(la, "busy", jobs_=[f"j{i}"]) for i, la in enumerate(d.launches)]
    records = []
    for _ in range(120):  # 20 minutes of snapshots with no node but 5 running jobs
        records += d.step(nodes=[], running_jobs=5)
    assert d.sent("remove") == [] and d.sent("terminate") == [] and d.sent("offline") == []
    assert any("circuit breaker open" in n for r in records for n in r.notes)
    assert d.e.breakers() == {"d": "5 of 5 joined nodes missing from the snapshot at once"}
    records = d.step(nodes=busy)  # a healthy snapshot closes it
    assert any("circuit breaker closed" in n for n in records[0].notes) and d.e.breakers() == {}


def test_jobs_running_on_no_listed_node_open_the_breaker():
    d = Domain(1)
    (la,) = d.launches
    d.step(nodes=[d.node(la, "free")], running_jobs=12)
    assert "12 jobs running but only 0" in d.e.breakers()["d"]
    assert d.sent("offline") == []  # no scale-down while the picture is implausible


def test_an_operator_releases_the_breaker():
    d = Domain(5)
    for _ in range(3):
        d.step(nodes=[], running_jobs=5)
    assert d.e.breakers()
    out = d.e.on_policy_change(PolicyChange(change_id="rel", domain="d", release_breaker=True))
    assert out.applied and "released" in out.reason
    assert d.e.breakers() == {}
    for _ in range(70):
        d.step(nodes=[], running_jobs=5)
    # the operator accepted the picture: lost nodes go (removed first)
    assert len({c.instance_id for c in d.sent("remove")}) == 5


# ---------------------------------------------------------------- our own outage


def test_stall_clock_stops_while_the_sensor_is_unavailable():
    cfg = config(domains={"d": {"max_nodes": 10, "sites": ["s1"]}})
    e, bus, clock = make_engine(cfg=cfg)
    e.on_snapshot(snap(clock, queued=jobs(1)))
    e.iterate()
    (la,) = bus.of("instance.launch")
    e.on_instance_event(event(la, "pending", 1, clock.now()))
    for _ in range(50):  # 500 s of a batch controller that cannot be read
        clock.advance(10)
        e.on_snapshot(snap(clock, available=False))
        e.iterate()
    for _ in range(30):  # healthy again for 300 s: 800 s since launch but only 300 s healthy
        clock.advance(10)
        e.on_snapshot(snap(clock, queued=jobs(1)))
        e.iterate()
    assert bus.of("instance.terminate") == [] and e.store.site_health() == {}
    for _ in range(31):
        clock.advance(10)
        e.on_snapshot(snap(clock, queued=jobs(1)))
        e.iterate()
    assert [t.instance_id for t in bus.of("instance.terminate")] == [la.launch_id]
    assert e.store.site_health()["s1"].failures == 1


def test_an_unanswering_provisioner_is_our_outage_too():
    cfg = config(domains={"d": {"max_nodes": 10, "sites": ["s1"]}})
    e, bus, clock = make_engine(cfg=cfg)
    e.on_snapshot(snap(clock, queued=jobs(1)))
    e.iterate()
    for _ in range(100):  # the launch is never acknowledged: nothing to blame a site for
        clock.advance(10)
        e.on_snapshot(snap(clock, queued=jobs(1)))
        e.iterate()
    assert bus.of("instance.terminate") == [] and e.store.site_health() == {}


def test_at_most_one_failure_per_site_per_iteration():
    cfg = config(domains={"d": {"max_nodes": 10, "sites": ["s1", "s2"]}})
    e, bus, clock = make_engine(cfg=cfg)
    e.on_snapshot(snap(clock, queued=jobs(3)))
    e.iterate()
    for la in bus.of("instance.launch"):
        e.on_instance_event(event(la, "failed", 1, clock.now(), error_kind="capacity", reason="no capacity"))
    clock.advance(5)
    e.on_snapshot(snap(clock, queued=jobs(3)))
    e.iterate()
    assert e.store.site_health()["s1"].failures == 1


# ---------------------------------------------------------------- one step per node per iteration


def test_reclaim_and_finish_drains_never_act_on_the_same_node():
    d = Domain(1)
    (la,) = d.launches
    d.step(nodes=[d.node(la, "free")])
    (off,) = d.sent("offline")
    d.e.on_node_result(result(off))
    d.bus.clear()
    # drained and empty (remove is due) and demand is back (online is due): one of them only
    d.step(nodes=[d.node(la, "offline")], queued=jobs(1))
    cmds = [c.action for c in d.bus.of("node.command")]
    assert cmds == ["online"]


def test_a_failed_online_puts_the_node_back_on_its_way_out():
    d = Domain(1)
    (la,) = d.launches
    d.step(nodes=[d.node(la, "free")])
    (off,) = d.sent("offline")
    d.e.on_node_result(result(off))
    d.bus.clear()
    d.step(nodes=[d.node(la, "offline")], queued=jobs(1))
    (on,) = d.sent("online")
    d.e.on_node_result(result(on, ok=False, error="scontrol: timeout"))
    assert d.e.store.instance(la.launch_id).state == "draining"
    d.bus.clear()
    d.step(nodes=[d.node(la, "offline")])
    assert [c.action for c in d.bus.of("node.command")] == ["remove"]


def test_an_offline_that_took_effect_after_a_failed_attempt_puts_the_node_on_its_way_out():
    """The command was sent again while the sensor was down; on its return the first attempt
    timed out and the second took effect. Found by ``epu sim --seed 1010 --scenario policy-spare``:
    the node stayed offline while the engine counted it in service, never idle, billed forever."""
    d = Domain(1)
    (la,) = d.launches
    d.step(nodes=[d.node(la, "free")])
    (off,) = d.sent("offline")
    d.e.on_node_result(result(off, ok=False, error="simulated: command timed out"))
    assert d.e.store.instance(la.launch_id).state == "joined"  # the failure is believed first
    d.e.on_node_result(result(off))  # ... then the same command, attempted again, took effect
    inst = d.e.store.instance(la.launch_id)
    assert inst.state == "draining" and inst.drain_at is not None
    d.bus.clear()
    d.step(nodes=[d.node(la, "offline")])
    assert [c.action for c in d.bus.of("node.command")] == ["remove"]


def test_a_failed_offline_sent_again_during_a_drain_does_not_undo_it():
    """The drain's offline took; a stale snapshot still shows the node in service, so the engine
    sends ``offline`` again, and that attempt times out. Found by ``epu sim --seed 7046 --scenario
    batch-faults``: the failure put the instance back to ``joined`` while its node stayed offline
    in the batch system — counted in service, never idle, never retired, billed to the end."""
    d = Domain(1)
    (la,) = d.launches
    d.step(nodes=[d.node(la, "free")])
    (off,) = d.sent("offline")
    d.e.on_node_result(result(off))  # the drain began and took
    began = d.e.store.instance(la.launch_id).state_at
    d.bus.clear()
    d.step(nodes=[d.node(la, "free")])  # stale: taken as if before the offline
    (again,) = d.sent("offline")
    assert again.reason.endswith("drain it first")
    assert d.e.store.instance(la.launch_id).state_at == began  # still the drain's start
    d.e.on_node_result(result(again, ok=False, error="simulated: command timed out"))
    inst = d.e.store.instance(la.launch_id)
    assert inst.state == "draining" and inst.retire == "scale-down"
    d.bus.clear()
    d.step(nodes=[d.node(la, "offline")])  # the truth: offline and empty
    assert [c.action for c in d.bus.of("node.command")] == ["remove"]


def test_the_failed_offline_that_began_a_drain_still_puts_the_node_back():
    """Only a re-sent offline keeps the drain: when the first one fails the node is in service —
    and stays so while the snapshots say it is (a job started on it meanwhile)."""
    d = Domain(1)
    (la,) = d.launches
    d.step(nodes=[d.node(la, "free")])
    (off,) = d.sent("offline")
    sent_at = d.e.store.instance(la.launch_id).drain_at
    d.e.on_node_result(result(off, ok=False, error="scontrol: node busy"))
    inst = d.e.store.instance(la.launch_id)
    assert inst.state == "joined" and inst.retire == "" and inst.drain_at == sent_at
    d.bus.clear()
    d.step(nodes=[d.node(la, "busy", jobs_=("j1",))])
    assert d.sent("offline") == [] and d.e.store.instance(la.launch_id).state == "joined"


def test_an_offline_answered_with_an_error_that_took_effect_is_drained_after_all():
    """A timeout after the controller applied the offline: the engine believes the failure, then
    the next snapshot shows the node offline. Found by the ``lost-command-answers`` scenario (every
    seed left drained nodes counted in service, billed to the end)."""
    d = Domain(1)
    (la,) = d.launches
    d.step(nodes=[d.node(la, "free")])
    (off,) = d.sent("offline")
    d.e.on_node_result(result(off, ok=False, error="simulated: command timed out (it took effect)"))
    assert d.e.store.instance(la.launch_id).state == "joined"
    d.bus.clear()
    d.step(seconds=20, nodes=[d.node(la, "offline")])  # the truth, taken after the offline was sent (and its backoff)
    (again,) = d.sent("offline")
    assert "after an offline answered with an error" in again.reason
    d.e.on_node_result(result(again))  # "already offline"
    inst = d.e.store.instance(la.launch_id)
    assert inst.state == "draining" and inst.retire == "scale-down"
    d.bus.clear()
    d.step(nodes=[d.node(la, "offline")])
    assert [c.action for c in d.bus.of("node.command")] == ["remove"]


def test_a_late_success_changes_nothing_once_the_engine_moved_on():
    """Only a scale-down drain put back to ``joined`` by the failure is taken up again: a node
    the engine has since drained anew (its own command) or that ended is left to that path."""
    d = Domain(1)
    (la,) = d.launches
    d.step(nodes=[d.node(la, "free")])
    (off,) = d.sent("offline")
    d.e.on_node_result(result(off))  # success first: a late failure of the same command is ignored
    before = d.e.store.instance(la.launch_id)
    d.e.on_node_result(result(off, ok=False, error="late"))
    d.e.on_node_result(result(off))
    assert d.e.store.instance(la.launch_id) == before


# ---------------------------------------------------------------- batch nodes of ended instances


def test_the_batch_node_of_a_preempted_instance_is_removed():
    d = Domain(1)
    (la,) = d.launches
    d.e.on_instance_event(event(la, "terminated", 3, d.clock.now(), reason="terminated by the cloud"))
    d.step(nodes=[d.node(la, "down")])
    (rm,) = d.sent("remove")
    assert rm.instance_id == la.launch_id
    d.e.on_node_result(result(rm))
    d.bus.clear()
    d.step(nodes=[])
    assert d.sent("remove") == [] and d.e.store.cleanup("d") == []


# ---------------------------------------------------------------- operators


def test_a_preempted_nodes_jobs_are_requeued_with_its_removal_and_the_capacity_replaced():
    d = Domain(1)
    (la,) = d.launches
    d.e.on_instance_event(event(la, "terminated", 3, d.clock.now(), error_kind="preempted",
                                reason="preempted by the cloud (node c1)"))
    assert d.e.store.instance(la.launch_id).preempted
    # the batch system has not noticed yet: its job still counts on the dead node, and is demand again
    d.step(nodes=[d.node(la, "busy", jobs_=["j0"])], queued=jobs(1))
    (rm,) = d.sent("remove")
    assert rm.instance_id == la.launch_id and rm.requeue and not rm.force and "preempted" in rm.reason
    assert len(d.sent("launch")) == 1  # the capacity is replaced by the normal demand path
    assert d.sent("terminate") == []  # the cloud ended it: nothing of ours to give back
    d.e.on_node_result(result(rm))
    d.bus.clear()
    d.step(nodes=[], queued=jobs(1))
    assert d.sent("remove") == [] and d.e.store.cleanup("d") == []


def notice(la, seq, at, when):
    from epu.common.messages import INTERRUPTION_REASON, InstanceEvent

    return InstanceEvent(instance_id=la.launch_id, domain=la.domain, site=la.site, state="started", seq=seq,
                         node_name=la.node_name, cores=la.cores, at=at, interruption_at=when,
                         reason=f"{INTERRUPTION_REASON}: reclaimed at about {when:.0f}")


def test_an_interruption_notice_requeues_the_jobs_and_removes_the_node_before_the_cloud_takes_it():
    d = Domain(1)
    (la,) = d.launches
    d.e.on_instance_event(notice(la, 2, d.clock.now(), d.clock.now() + 120))  # seq not above: still news
    inst = d.e.store.instance(la.launch_id)
    assert inst.retire == "interrupted" and inst.state == "joined" and not inst.active
    # the node still runs its job: it is requeued with the removal, not left to die with the machine
    d.step(nodes=[d.node(la, "busy", jobs_=["j0"])])
    (rm,) = d.sent("remove")
    assert rm.instance_id == la.launch_id and rm.requeue and "interruption notice" in rm.reason
    assert d.sent("terminate") == [] and d.sent("offline") == []
    d.e.on_node_result(result(rm))
    d.e.on_instance_event(notice(la, 2, d.clock.now(), d.clock.now() + 120))  # told again: nothing new
    d.bus.clear()
    # the requeued job is demand again: replaced at once; the interrupted instance is given back
    d.step(nodes=[], queued=jobs(1))
    assert len(d.sent("launch")) == 1
    (term,) = d.sent("terminate")
    assert term.instance_id == la.launch_id and "interruption notice" in term.reason


def test_an_interruption_notice_of_an_instance_never_in_the_batch_system_terminates_it():
    e, bus, clock = make_engine(cfg=config(domains={"d": {"max_nodes": 10, "sites": ["s1", "s2"]}}))
    e.on_snapshot(snap(clock, queued=jobs(1)))
    e.iterate()
    (la,) = bus.of("instance.launch")
    e.on_instance_event(event(la, "pending", 1, clock.now()))
    bus.clear()
    e.on_instance_event(notice(la, 1, clock.now(), clock.now() + 120))
    clock.advance(5)
    e.on_snapshot(snap(clock, queued=jobs(1)))
    e.iterate()
    assert [t.instance_id for t in bus.of("instance.terminate")] == [la.launch_id]
    assert len(bus.of("instance.launch")) == 1  # replaced in the same iteration


def test_a_node_that_vanished_without_a_preemption_is_removed_without_requeue():
    d = Domain(1)
    (la,) = d.launches
    d.e.on_instance_event(event(la, "terminated", 3, d.clock.now(), reason="terminated by the cloud (node c1)"))
    d.step(nodes=[d.node(la, "down")])
    (rm,) = d.sent("remove")
    assert not rm.requeue


def test_an_unforced_operator_terminate_drains_first():
    d = Domain(1)
    (la,) = d.launches
    out = d.e.on_policy_change(PolicyChange(change_id="op1", domain="d", retire=[la.launch_id], operator="ann"))
    assert out.applied
    d.step(nodes=[d.node(la, "busy", jobs_=["1"])], queued=jobs(0))
    assert [c.action for c in d.bus.of("node.command")] == ["offline"] and d.sent("terminate") == []
    d.bus.clear()
    d.step(nodes=[d.node(la, "offline", jobs_=["1"])])
    assert d.bus.of("node.command") == [] and d.sent("terminate") == []  # its job finishes first
    d.step(nodes=[d.node(la, "offline")])
    (rm,) = d.sent("remove")
    d.e.on_node_result(result(rm))
    d.step(nodes=[])
    (term,) = d.sent("terminate")
    assert term.instance_id == la.launch_id and not term.force


def test_an_operator_terminate_of_a_pending_instance_is_sent_unless_started_and_a_refusal_goes_the_safe_way():
    """The engine's view lags the cloud: the instance is pending here while its VM may already run
    a startd that joined by itself (``epu sim --seed 1 --scenario htcondor-booting-terminates``).
    The terminate says so (``unless_started``); the provisioner's refusal (the instance reported
    started) puts the instance on the safe way out: drained, removed, then terminated."""
    e, bus, clock = make_engine(cfg=config(domains={"d": {"max_nodes": 10, "sites": ["s1"],
                                                          "params": {"idle_seconds": 0}}}))
    e.on_snapshot(snap(clock, queued=jobs(1)))
    e.iterate()
    (la,) = bus.of("instance.launch")
    e.on_instance_event(event(la, "pending", 1, clock.now()))
    bus.clear()
    assert e.on_policy_change(PolicyChange(change_id="op1", domain="d", retire=[la.launch_id])).applied
    clock.advance(10)
    e.on_snapshot(snap(clock))
    e.iterate()
    (term,) = bus.of("instance.terminate")
    assert term.unless_started and not term.force
    bus.clear()
    e.on_instance_event(event(la, "started", 2, clock.now(), reason="terminate refused: node c-1 runs"))
    (inst,) = e.store.instances("d")
    assert inst.state == "started" and not inst.terminate_sent and inst.retire == "operator"
    node = NodeInfo(name=la.node_name, state="busy", cores=1, cores_used=1, jobs=["1"], instance_id=la.launch_id)
    for _ in range(4):  # past resend_seconds: the refused terminate is answered, never sent again
        clock.advance(10)
        e.on_snapshot(snap(clock, nodes=[node]))
        e.iterate()
    assert bus.of("instance.terminate") == [] and bus.of("instance.launch") == []
    assert {c.action for c in bus.of("node.command")} == {"offline"}  # drained first (a job runs there)
    for c in bus.of("node.command"):
        e.on_node_result(result(c))
    bus.clear()
    clock.advance(10)
    e.on_snapshot(snap(clock, nodes=[node.model_copy(update={"state": "offline", "cores_used": 0, "jobs": []})]))
    e.iterate()
    (rm,) = bus.of("node.command")
    assert rm.action == "remove" and bus.of("instance.terminate") == []
    e.on_node_result(result(rm))
    clock.advance(10)
    e.on_snapshot(snap(clock))
    e.iterate()
    (term,) = bus.of("instance.terminate")
    assert not term.unless_started and not term.force


def test_retire_of_an_unknown_instance_is_rejected():
    d = Domain(1)
    out = d.e.on_policy_change(PolicyChange(change_id="op2", domain="d", retire=["nope"]))
    assert not out.applied and "no instance nope" in out.reason


def test_an_operator_pause_survives_a_restart_with_an_unrelated_file_edit(sqlite_url):
    base = {"max_nodes": 10, "sites": ["s1", "s2"]}
    e, _, clock = make_engine(sqlite_url, config(domains={"d": base}))
    e.on_policy_change(PolicyChange(change_id="p", domain="d", paused=True))
    e.store.engine.dispose()
    edited = {**base, "max_nodes": 12}  # the administrator edits another key
    e2, _, _ = make_engine(sqlite_url, config(domains={"d": edited}), clock=clock)
    _, cfg = e2.store.current_config("d")
    assert cfg.paused and cfg.max_nodes == 12  # both: the operator's pause and the file's edit
    e2.store.engine.dispose()
    e3, _, _ = make_engine(sqlite_url, config(domains={"d": {**edited, "paused": False, "min_nodes": 1}}),
                           clock=clock)
    _, cfg = e3.store.current_config("d")
    assert cfg.paused and cfg.min_nodes == 1  # "paused = false" unchanged in the file: not an edit of it
    e3.store.engine.dispose()
    e4, _, _ = make_engine(sqlite_url, config(domains={"d": {**edited, "paused": True, "min_nodes": 1}}),
                           clock=clock)
    e4.store.engine.dispose()
    e5, _, _ = make_engine(sqlite_url, config(domains={"d": {**edited, "paused": False, "min_nodes": 1}}),
                           clock=clock)
    _, cfg = e5.store.current_config("d")
    assert not cfg.paused  # the file edited that very key since: the file wins on it


def test_a_lost_connection_forgets_the_snapshots():
    d = Domain(1)
    (la,) = d.launches
    d.e.forget_snapshots()
    d.clock.advance(10)
    assert d.e.iterate() == [] and d.bus.sent == []
    assert not d.e.is_active("d")
    d.step(nodes=[d.node(la, "free")])  # a snapshot after reconnecting: active again
    assert d.e.is_active("d")



def test_two_engines_on_one_store_never_act_on_a_stale_working_set(sqlite_url):
    """The broker may hand the control queue and the input queue to different engines of a pair:
    each must see what the other wrote (found by the simulator: chaos seed 1, a standby answered
    an operator's resume from a cached config and the resume was lost)."""
    cfg = config(domains={"d": {"max_nodes": 10, "sites": ["s1", "s2"]}})
    a, _, clock = make_engine(sqlite_url, cfg)
    b, _, _ = make_engine(sqlite_url, cfg, clock=clock)
    assert b.store.current_config("d")[1].paused is False  # b has cached the config
    a.handle_control(PolicyChange(change_id="pause", domain="d", paused=True))
    b.handle_control(PolicyChange(change_id="resume", domain="d", paused=False))
    assert b.store.change_outcome("resume")["version"] == 3  # a new version over a's pause
    a.handle_control(PolicyChange(change_id="bounds", domain="d", max_nodes=9))
    version, current = b.store.current_config("d") if b.store.sync() is None else (0, None)
    assert version == 4 and current.paused is False and current.max_nodes == 9


def test_a_provisioner_that_stops_reporting_is_our_outage():
    """Found by the simulator (our-outage seed 1007): the provisioner died after acknowledging a
    launch; its VM booted unseen and the site was blamed for the stall. The provisioner's
    anti-entropy reports are its heartbeat."""
    from epu.common.messages import InstanceReport

    cfg = config(domains={"d": {"max_nodes": 10, "sites": ["s1"]}})
    e, bus, clock = make_engine(cfg=cfg)
    e.on_snapshot(snap(clock, queued=jobs(1)))
    e.iterate()
    (la,) = bus.of("instance.launch")
    pending = event(la, "pending", 1, clock.now())
    e.on_instance_event(pending)
    e.handle_input(InstanceReport(domain="d", as_of=clock.now(), horizon_seconds=3600, instances=[pending]))
    for _ in range(100):  # 1,000 s without a report: the provisioner is down, not the site
        clock.advance(10)
        e.on_snapshot(snap(clock, queued=jobs(1)))
        e.iterate()
    assert bus.of("instance.terminate") == [] and e.store.site_health() == {}


# ---------------------------------------------------------------- a provisioner on a replaced or restored store


def test_events_of_a_replaced_store_move_an_instance_forward_whatever_their_seq():
    """Found by the simulator (new-store): a provisioner on a new store records an old instance anew
    (seq 1), and its ``terminating``/``terminated`` were dropped as stale — the instance stayed
    ``terminating`` here forever. A state further on is news whatever its seq; one behind is not."""
    d = Domain(1)
    (la,) = d.launches
    d.e.on_instance_event(event(la, "pending", 1, d.clock.now()))  # behind: ignored
    assert d.e.store.instance(la.launch_id).state == "joined"
    d.e.on_instance_event(event(la, "terminating", 1, d.clock.now()))
    d.e.on_instance_event(event(la, "terminated", 2, d.clock.now()))
    inst = d.e.store.instance(la.launch_id)
    assert inst.state == "terminated" and inst.seq == 2


def test_a_report_of_a_restored_store_is_answered_with_terminates_for_what_ended_here():
    """Found by the simulator (restored-store): a store restored from a backup holds live records
    of instances that ended since; nothing ever closed them. The engine, which saw them end, sends
    a terminate for each (the provisioner closes a record whose node is gone); forward entries with
    a lower seq are applied; entries that agree send nothing."""
    from epu.common.messages import InstanceReport

    d = Domain(2)
    ended, live = d.launches
    d.e.on_instance_event(event(ended, "terminating", 3, d.clock.now()))
    d.e.on_instance_event(event(ended, "terminated", 4, d.clock.now()))
    d.bus.clear()
    d.step(nodes=[d.node(live, "busy", jobs_=["j1"])])
    d.bus.clear()
    restored = [event(ended, "started", 2, d.clock.now()), event(live, "started", 2, d.clock.now())]
    d.e.handle_input(InstanceReport(domain="d", as_of=d.clock.now(), horizon_seconds=3600, instances=restored))
    assert [m.instance_id for m in d.bus.of("instance.terminate")] == [ended.launch_id]
    d.bus.clear()
    d.e.handle_input(InstanceReport(domain="d", as_of=d.clock.now(), horizon_seconds=3600,
                                    instances=[event(live, "terminated", 1, d.clock.now())]))
    assert d.e.store.instance(live.launch_id).state == "terminated" and d.bus.of("instance.terminate") == []


def test_a_terminate_answered_but_never_finished_is_sent_again():
    """Found by the simulator (new-store seed 19): the provisioner stored the terminate, answered
    ``terminating`` and was stopped before its destroy; its new store never heard of it. The engine,
    answered, never asked again: the VM ran on, billed. Now it asks again every 10 × resend_seconds."""
    d = Domain(1)
    (la,) = d.launches
    d.e.on_instance_event(event(la, "terminating", 3, d.clock.now()))
    nodes = [d.node(la, "free")]
    again = []
    for _ in range(70):  # 700 s
        d.step(nodes=nodes)
        again += [m for m in d.bus.of("instance.terminate") if "too long" in m.reason]
        d.bus.clear()
    assert [m.instance_id for m in again] == [la.launch_id, la.launch_id]  # at 300 s and 600 s
    d.e.on_instance_event(event(la, "terminated", 1, d.clock.now()))  # from the new store: news
    for _ in range(40):
        d.step(nodes=[])
    assert d.bus.of("instance.terminate") == []
