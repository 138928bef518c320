"""The engine's retained status (``EngineStatus``) and how ``epu status`` folds it with live events."""

from __future__ import annotations

from epu.common.messages import EngineStatus, InstanceEvent, InstanceStatus
from epu.services.decision.status import Board
from epu.services.decision.statusfeed import StatusFeed

from tests.decision.helpers import event, jobs, make_engine, node, snapshot


def _joined_engine():
    """An engine with two launched instances, one of them joined (its node busy in the snapshot)."""
    e, bus, clock = make_engine()
    e.on_snapshot(snapshot(queued=jobs(2)))
    e.iterate()
    launches = bus.of("instance.launch")
    for launch in launches:
        e.on_instance_event(event(launch, "started", 2, clock.now()))
    clock.advance(5)
    e.on_snapshot(snapshot(at=clock.now(), nodes=[node(launches[0].node_name, "busy", used=1, jobs_=["1"])]))
    e.iterate()
    return e, bus, clock, launches


def test_status_lists_every_instance_with_its_batch_membership():
    e, bus, clock, launches = _joined_engine()
    feed = StatusFeed(e, bus)
    (st,) = feed.after_iteration([], clock.now())
    assert bus.of("decision.status") == [st] and st.routing_key() == "decision.status.d"
    by_id = {i.instance_id: i for i in st.instances}
    assert set(by_id) == {la.launch_id for la in launches}, "every live instance, not only recent changes"
    first, second = by_id[launches[0].launch_id], by_id[launches[1].launch_id]
    assert (first.in_batch, first.node_state) == (True, "busy")
    assert (second.in_batch, second.node_state) == (False, "")
    assert st.policy == "queue-demand" and st.max_nodes == 10 and st.nodes_by_state == {"busy": 1}
    # the wire round trip keeps it whole
    assert EngineStatus.from_wire(st.to_wire()) == st


def test_status_published_on_change_and_heartbeat_only_while_active():
    e, bus, clock, launches = _joined_engine()
    feed = StatusFeed(e, bus, heartbeat=30)
    assert len(feed.after_iteration([], clock.now())) == 1
    clock.advance(5)
    assert feed.after_iteration([], clock.now()) == [], "unchanged within the heartbeat: not sent again"
    e.on_instance_event(event(launches[1], "terminated", 5, clock.now()))
    (st,) = feed.after_iteration([], clock.now())
    assert [i.instance_id for i in st.instances] == [launches[0].launch_id], "a change is sent at once"
    clock.advance(31)
    e.on_snapshot(snapshot(at=st.snapshot_at, nodes=[node(launches[0].node_name, "busy", used=1, jobs_=["1"])]))
    assert len(feed.after_iteration([], clock.now())) == 1, "the heartbeat re-sends an unchanged status"
    clock.advance(e.settings.active_window_seconds + 1)  # no fresh snapshot: standby for the domain
    assert feed.after_iteration([], clock.now()) == [], "only the engine acting for a domain publishes"


def _entry(iid: str, state: str, seq: int, since: float, in_batch: bool = False) -> InstanceStatus:
    return InstanceStatus(instance_id=iid, site="s1", state=state, seq=seq, in_batch=in_batch, since=since)


def _status(at: float, *entries: InstanceStatus) -> EngineStatus:
    return EngineStatus(domain="d", at=at, policy="queue-demand", instances=list(entries), snapshot_at=at - 1,
                        queued_jobs=3, nodes_by_state={"free": 2})


def test_board_starts_whole_from_the_status_and_keeps_the_newer_of_status_and_events():
    b = Board("d")
    assert b.apply(_status(100.0, _entry("i1", "started", 2, 90), _entry("i2", "joined", 3, 95, True),
                           _entry("i3", "pending", 1, 99)))
    (st,) = b.as_json()
    assert st["instances_by_state"] == {"started": 1, "joined": 1, "pending": 1}, "all three at once"
    assert st["queue"]["jobs"] == 3 and st["engine"]["policy"] == "queue-demand"
    ev = dict(domain="d", site="s1")
    assert not b.apply(InstanceEvent(instance_id="i2", state="started", seq=2, at=80.0, **ev)), "stale event"
    assert b.apply(InstanceEvent(instance_id="i3", state="terminated", seq=4, at=101.0, **ev))
    assert b.apply(InstanceEvent(instance_id="i4", state="requested", seq=1, at=102.0, **ev))
    assert b.apply(InstanceEvent(instance_id="i5", state="requested", seq=1, at=98.0, **ev))  # just announced
    assert not b.apply(_status(99.0)), "an older status changes nothing"
    # a newer status built before i4's event reached the engine, still listing ended i3 with its older seq
    assert b.apply(_status(101.5, _entry("i1", "joined", 2, 90, True), _entry("i3", "pending", 1, 99)))
    ids = {i["instance_id"]: i for i in b.as_json()[0]["instances"]}
    assert set(ids) == {"i1", "i4", "i5"}, "i2 ended (not listed), i3's end is newer, i4's event is newer, " \
        "i5's event may not have reached the engine yet"
    assert b.apply(_status(110.0, _entry("i1", "joined", 2, 90, True)))
    assert {i["instance_id"] for i in b.as_json()[0]["instances"]} == {"i1"}, "unlisted long enough: ended"
    assert ids["i1"]["in_batch"] and ids["i1"]["state"] == "joined", "joining moves no seq: the status says so"


def test_the_board_renders_the_engines_view_and_every_instance():
    from epu.services.decision.status import render
    from rich.console import Console

    b = Board()
    b.apply(_status(100.0, _entry("i1", "joined", 2, 90, True), _entry("i2", "started", 2, 95)))
    b.domains["d"].engine = b.domains["d"].engine.model_copy(update={"breaker": "3 of 4 nodes [missing]"})
    console = Console(record=True, width=140)
    console.print(render(b))
    text = console.export_text()
    assert "queue-demand v0" in text and "breaker open: 3 of 4 nodes [missing]" in text
    assert "i1 s1 joined" in text and "in batch" in text and "i2 s1 started" in text and "not in batch" in text


def test_status_built_from_columns_is_the_validated_message():
    """The feed builds the instances column-wise (``StatusParts``): the result is what validating
    the same fields as a message gives, every field in place, and the digest ignores only ``at``."""
    from epu.services.decision.statusfeed import status_parts

    e, _bus, clock, _launches = _joined_engine()
    parts = status_parts(e, "d", clock.now(), None)
    st = parts.build()
    assert st == EngineStatus.model_validate(st.model_dump()) and len(st.instances) == 2
    assert all(isinstance(i, InstanceStatus) and i.since > 0 and i.state for i in st.instances)
    assert status_parts(e, "d", clock.now() + 5, None).digest() == parts.digest()
    clock.advance(1)  # a new snapshot with the joined node gone: another digest
    e.on_snapshot(snapshot(at=clock.now(), nodes=[]))
    assert status_parts(e, "d", clock.now(), None).digest() != parts.digest()


def test_status_wire_body_is_model_dump_byte_for_byte():
    """``EngineStatus.to_wire`` shares each instance's field map instead of copying it: the same
    map, key order and bytes as ``model_dump`` (the wire contract unchanged)."""
    from epu.common.codec import packb

    e, bus, clock, _launches = _joined_engine()
    (st,) = StatusFeed(e, bus).after_iteration([], clock.now())
    wire, dumped = st.to_wire(), st.model_dump(mode="python")
    assert wire == dumped and list(wire) == list(dumped)
    assert [list(i) for i in wire["instances"]] == [list(i) for i in dumped["instances"]]
    assert packb(wire) == packb(dumped)
