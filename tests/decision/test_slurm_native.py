"""Native mode (services/decision/slurm_native.py): Slurm's power saving picks the nodes, the
engine launches exactly those, under their names, as the types their features name, gives back
what it cannot serve, replaces a stalled node under the same name, and ends a suspended node only
with its removal confirmed."""

from __future__ import annotations

from epu.common.messages import NodeInfo, SlurmPower
from epu.services.decision.slurm_native import Requests

from tests.decision.helpers import config, event, make_engine, snapshot
from tests.decision.test_engine import result

SITES = {
    "ec2": {"driver": "epu-sim", "quota": 20, "types": {
        "c4": {"size": "sim.c4", "cores": 4, "memory_mb": 8000, "price_per_hour": 0.2},
        "g1": {"size": "sim.g1", "cores": 8, "memory_mb": 16000, "gpus": 1, "price_per_hour": 1.0}}},
    "os": {"driver": "epu-sim", "quota": 20, "types": {
        "c4": {"size": "m1.large", "cores": 4, "memory_mb": 8000, "price_per_hour": 0.3},
        "g1": {"size": "g.large", "cores": 8, "memory_mb": 16000, "gpus": 1, "price_per_hour": 1.2}}},
}


def native_engine(max_nodes: int = 10, **domain):
    cfg = config({"d": {"max_nodes": max_nodes, "sites": ["ec2", "os"], "native": "slurm",
                        "type_nodes": {"g1": {"names": ["gpu-[1-4]"]}}, **domain}}, SITES)
    return make_engine(cfg=cfg)


def power(action: str, *names: str, batch: str = "b1") -> SlurmPower:
    return SlurmPower(batch_id=batch, domain="d", action=action, nodes=list(names))  # type: ignore[arg-type]


def slot(name: str, native: str, *, features: list[str] = (), state: str = "down", jobs: list[str] = (),
         instance_id: str | None = None) -> NodeInfo:
    return NodeInfo(name=name, state=state, cores=4, native_state=native, features=list(features), jobs=list(jobs),
                    instance_id=instance_id, cores_used=4 if jobs else 0)


def test_a_resume_launches_exactly_that_node_as_its_type() -> None:
    e, bus, clock = native_engine()
    e.on_snapshot(snapshot(nodes=[slot("cpu-1", "IDLE+CLOUD+POWERING_UP", features=["c4"])]))
    e.handle_input(power("resume", "cpu-1", "gpu-2"))
    e.iterate()
    launches = sorted(bus.of("instance.launch"), key=lambda m: m.node_name)
    assert [(la.node_name, la.instance_type) for la in launches] == [("cpu-1", "c4"), ("gpu-2", "g1")]
    assert launches[0].site == "ec2", "rank order: the first site offering the type"
    assert bus.of("node.command") == [], "nothing given back"
    # the next iteration launches nothing more: the names are held
    bus.clear()
    clock.advance(5)
    e.on_snapshot(snapshot(at=clock.now(), nodes=[slot("cpu-1", "IDLE+CLOUD+POWERING_UP", features=["c4"])]))
    e.iterate()
    assert bus.of("instance.launch") == []


def test_a_call_delivered_twice_is_one_batch() -> None:
    req = Requests()
    assert req.on_power(power("resume", "n1"), 1.0)
    assert not req.on_power(power("resume", "n1"), 2.0)
    assert req.duplicates == 1 and req.of("d").resumes == {"n1": 1.0}


def test_a_lost_resume_call_is_found_in_the_snapshot() -> None:
    e, bus, _clock = native_engine()
    e.on_snapshot(snapshot(nodes=[slot("cpu-3", "ALLOCATED+CLOUD+POWERING_UP", features=["c4"], jobs=["7"])]))
    e.iterate()
    assert [la.node_name for la in bus.of("instance.launch")] == ["cpu-3"]


def test_what_cannot_be_served_is_given_back_at_once() -> None:
    e, bus, _clock = native_engine(max_nodes=1)
    e.on_snapshot(snapshot(nodes=[slot("cpu-1", "CLOUD+POWERING_UP", features=["c4"]),
                                  slot("odd-1", "CLOUD+POWERING_UP", features=["weird"])]))
    e.handle_input(power("resume", "gpu-1", "cpu-1", "odd-1"))
    e.iterate()
    launched = [la.node_name for la in bus.of("instance.launch")]
    assert len(launched) == 1, "max_nodes=1"
    backs = {c.node: c.reason for c in bus.of("node.command") if c.action == "give_back"}
    assert set(backs) | set(launched) == {"gpu-1", "cpu-1", "odd-1"} and not set(backs) & set(launched)
    assert "no instance type for node odd-1" in backs["odd-1"]
    assert all(r.startswith("epu: cannot serve") for r in backs.values())


def test_not_native_ignores_calls_and_the_gate_holds_give_backs() -> None:
    cfg = config({"d": {"max_nodes": 4, "sites": ["ec2"]}}, SITES)
    e, bus, _clock = make_engine(cfg=cfg)
    assert not e.on_slurm_power(power("resume", "cpu-1"))
    from epu.services.decision.gate import give_back
    sent = e.gate.send("d", [give_back("d", "cpu-1", "x")])
    assert sent.ids == [] and sent.held[0][1] == "give back native only"
    assert bus.of("node.command") == []


def test_a_stalled_node_is_replaced_under_the_same_name() -> None:
    e, bus, clock = native_engine()
    e.on_snapshot(snapshot(nodes=[slot("gpu-1", "CLOUD+POWERING_UP")]))
    e.handle_input(power("resume", "gpu-1"))
    e.iterate()
    (first,) = bus.of("instance.launch")
    e.on_instance_event(event(first, "pending", 1, clock.now()))
    names = []
    for _ in range(200):  # 600 s of stall_seconds, 5 s a step
        bus.clear()
        clock.advance(5)
        e.on_snapshot(snapshot(at=clock.now(), nodes=[slot("gpu-1", "CLOUD+POWERING_UP")]))
        e.iterate()
        names += [la.node_name for la in bus.of("instance.launch")]
        if names:
            break
    assert names == ["gpu-1"], "a replacement under the name Slurm waits for"
    (second,) = bus.of("instance.launch")
    assert (first.site, second.site) == ("ec2", "os"), "the stalled site backs off: failover to the next"
    assert not [c for c in bus.of("node.command") if c.action == "give_back"]
    (old,) = [i for i in e.store.instances("d") if i.instance_id == first.launch_id]
    assert old.retire == "stalled", "the old one goes the safe way (its name was seen in Slurm)"


def _joined(e, bus, clock):
    """gpu-1 resumed by Slurm, launched, started, added and joined: (its launch, its node)."""
    e.on_snapshot(snapshot(nodes=[slot("gpu-1", "CLOUD+POWERING_UP")]))
    e.handle_input(power("resume", "gpu-1"))
    e.iterate()
    (la,) = bus.of("instance.launch")
    for seq, st in enumerate(("pending", "started"), 1):
        e.on_instance_event(event(la, st, seq, clock.now()))
    bus.clear()
    clock.advance(5)
    e.on_snapshot(snapshot(at=clock.now(), nodes=[slot("gpu-1", "CLOUD+POWERING_UP")]))
    e.iterate()
    (add,) = bus.of("node.command")
    e.on_node_result(result(add))
    bus.clear()
    clock.advance(5)
    up = slot("gpu-1", "IDLE+CLOUD", state="free", instance_id=la.launch_id)
    e.on_snapshot(snapshot(at=clock.now(), nodes=[up]))
    e.iterate()
    return la, up


def test_a_suspend_removes_then_terminates_with_the_proof() -> None:
    e, bus, clock = native_engine()
    la, up = _joined(e, bus, clock)
    assert e.store.instances("d")[0].state == "joined"
    e.handle_input(power("suspend", "gpu-1", batch="b2"))
    clock.advance(5)
    e.on_snapshot(snapshot(at=clock.now(), nodes=[up]))
    e.iterate()
    (remove,) = bus.of("node.command")
    assert remove.action == "remove" and bus.of("instance.terminate") == [], "no terminate before the removal"
    e.on_node_result(result(remove))
    bus.clear()
    clock.advance(5)
    e.on_snapshot(snapshot(at=clock.now(), nodes=[slot("gpu-1", "IDLE+CLOUD+POWERED_DOWN")]))
    e.iterate()
    (term,) = bus.of("instance.terminate")
    assert term.proof == "removed" and term.retire == "native"


def test_a_call_is_spent_once_slurm_no_longer_waits_for_the_node() -> None:
    """A snapshot read after the call that shows the node not powering up (powered down, so left
    out of the snapshot) spends the call: no launch for a node nobody waits for (seed 920068)."""
    e, bus, clock = native_engine()
    e.on_snapshot(snapshot(nodes=[]))
    e.handle_input(power("resume", "gpu-3"))
    clock.advance(5)
    e.on_snapshot(snapshot(at=clock.now(), nodes=[]))  # read after the call: gpu-3 is powered down again
    e.iterate()
    assert bus.of("instance.launch") == [] and bus.of("node.command") == []
    assert e.native.of("d").resumes == {}


def test_a_job_given_back_in_part_is_given_back_whole() -> None:
    """SLURM_RESUME_FILE: a job's nodes are all served or all given back (one cannot be typed here),
    so Slurm requeues the job at once instead of holding a node for it until ResumeTimeout."""
    from epu.common.messages import SlurmResumeJob

    e, bus, _clock = native_engine()
    e.on_snapshot(snapshot(nodes=[slot("cpu-1", "CLOUD+POWERING_UP", features=["c4"]),
                                  slot("cpu-2", "CLOUD+POWERING_UP", features=["c4"]),
                                  slot("odd-1", "CLOUD+POWERING_UP", features=["weird"])]))
    job = SlurmResumeJob(job_id=7, nodes_alloc=["cpu-1", "odd-1"], nodes_resume=["cpu-1", "odd-1"])
    e.handle_input(SlurmPower(batch_id="b9", domain="d", action="resume", nodes=["cpu-1", "odd-1", "cpu-2"],
                              jobs=[job]))
    e.iterate()
    assert [la.node_name for la in bus.of("instance.launch")] == ["cpu-2"], "the other job's node is served"
    backs = {c.node: c.reason for c in bus.of("node.command") if c.action == "give_back"}
    assert set(backs) == {"cpu-1", "odd-1"} and "all or nothing" in backs["cpu-1"]
    assert [i.node_name for i in e.store.instances("d")] == ["cpu-2"], "the dropped launch was never stored"


def test_a_call_before_any_snapshot_shows_its_node_waits_for_one_rather_than_give_it_back() -> None:
    """A sensor without include_powered_down shows a node only once Slurm powers it up: a call
    that reaches the engine first has no features to type it by. The native e2e saw the node
    given back (its job requeued three times); the engine now waits for a snapshot taken after
    the call."""
    e, bus, clock = native_engine()
    e.on_snapshot(snapshot(at=clock.now(), nodes=[]))
    clock.advance(1)
    e.handle_input(power("resume", "cpu-9"))
    e.iterate()
    assert bus.of("node.command") == [] and bus.of("instance.launch") == []
    clock.advance(5)
    e.on_snapshot(snapshot(at=clock.now(), nodes=[slot("cpu-9", "IDLE+CLOUD+POWERING_UP", features=["c4"])]))
    e.iterate()
    assert [(la.node_name, la.instance_type) for la in bus.of("instance.launch")] == [("cpu-9", "c4")]
    assert bus.of("node.command") == []


def _joined_then_removed(e, bus, clock):
    """gpu-1 joined, suspended by Slurm and removed (held by the sensor): its launch."""
    la, up = _joined(e, bus, clock)
    e.handle_input(power("suspend", "gpu-1", batch="b2"))
    clock.advance(5)
    e.on_snapshot(snapshot(at=clock.now(), nodes=[up]))
    bus.clear()
    e.iterate()
    (remove,) = bus.of("node.command")
    e.on_node_result(result(remove))
    return la


def test_a_held_slot_is_released_only_once_its_instance_has_ended() -> None:
    """The sensor holds a removed slot (drained, the identity kept): Slurm must not power it up
    while the machine may still answer (seed 950014). The engine releases it once the instance
    ended — not while it is terminating — and again from a later snapshot if a release is lost."""
    e, bus, clock = native_engine()
    la = _joined_then_removed(e, bus, clock)
    held = slot("gpu-1", "IDLE+CLOUD+DRAIN+POWERED_DOWN", state="offline", instance_id=la.launch_id)
    bus.clear()
    clock.advance(5)
    e.on_snapshot(snapshot(at=clock.now(), nodes=[held]))
    e.iterate()
    (term,) = bus.of("instance.terminate")
    assert [c for c in bus.of("node.command") if c.action == "release"] == []
    e.on_instance_event(event(la, "terminating", 3, clock.now()))
    bus.clear()
    clock.advance(5)
    e.on_snapshot(snapshot(at=clock.now(), nodes=[held]))
    e.iterate()
    assert [c for c in bus.of("node.command") if c.action == "release"] == [], "terminating: the VM may run"
    e.on_instance_event(event(la, "terminated", 4, clock.now()))
    for _ in range(2):  # lost once: the next snapshot still shows it held, so it is sent again
        bus.clear()
        clock.advance(5)
        e.on_snapshot(snapshot(at=clock.now(), nodes=[held]))
        e.iterate()
        (rel,) = bus.of("node.command")
        assert (rel.action, rel.node, rel.instance_id) == ("release", "gpu-1", la.launch_id)
    bus.clear()
    clock.advance(5)
    e.on_snapshot(snapshot(at=clock.now(), nodes=[]))  # released: powered down, idle, left out
    e.iterate()
    assert bus.of("node.command") == []


def test_an_administrators_drain_is_never_released() -> None:
    """A drained slot with no instance identity is not EPU's hold: nothing is sent for it."""
    e, bus, clock = native_engine()
    e.on_snapshot(snapshot(nodes=[slot("cpu-2", "IDLE+CLOUD+DRAIN+POWERED_DOWN", state="offline")]))
    e.iterate()
    assert bus.of("node.command") == []


def test_the_gate_holds_a_release_outside_native_mode_or_of_a_live_instance() -> None:
    from epu.services.decision.gate import Authority, Outgoing, release, verdict

    from tests.decision.helpers import inst

    msg = release("d", "gpu-1", "k")
    live = inst("k", "terminating", joined_at=1.0)
    ended = inst("k", "terminated", joined_at=1.0)
    assert verdict(Outgoing("d", msg, Authority.POLICY, "active", ended, native=False)) == (
        "release when ended", "release outside native mode")
    rule, why = verdict(Outgoing("d", msg, Authority.POLICY, "active", live, native=True))
    assert rule == "release when ended" and "still lives (terminating)" in why
    assert verdict(Outgoing("d", msg, Authority.POLICY, "active", ended, native=True)) is None
    assert verdict(Outgoing("d", msg, Authority.POLICY, "active", None, native=True)) is None
