"""Issue 26, defect 8: every write that changes an instance is a compare-and-set, not only plan
commits. When the input queue and a snapshot queue are consumed by different engines (a
consumer cancelled on one queue), two processes write the same instance rows; a node result
written on a row read before the other engine's instance event was stored used to undo that
event (a lost update). On SQLite, PostgreSQL and the simulators' in-memory store."""

from __future__ import annotations

from typing import Any

import pytest
from epu.common.clock import ManualClock
from epu.common.messages import InstanceEvent, NodeCommandResult

from tests.conformance.test_decision_fencing import engine
from tests.decision.helpers import T0, event, jobs, snapshot


def _started_with_add_sent(a: Any, bus: Any, clock: ManualClock) -> tuple[Any, Any]:
    """Engine A launched one instance, it started, and A sent its ``add``."""
    a.on_snapshot(snapshot(queued=jobs(1), at=clock.now()))
    a.iterate()
    (launch,) = bus.of("instance.launch")
    a.handle_input(event(launch, "pending", 1, clock.now()))
    a.handle_input(event(launch, "started", 2, clock.now(), ip="10.0.0.5"))
    clock.advance(5)
    a.on_snapshot(snapshot(queued=jobs(1), at=clock.now()))
    a.iterate()
    (add,) = [c for c in bus.of("node.command") if c.action == "add"]
    return launch, add


def _race(store: Any, iid: str, other_write: Any) -> list[int]:
    """Let another engine's write land right after this store's next read of instance ``iid``
    (the window between a handler's read and its write)."""
    real = store.instance
    fired: list[int] = []

    def instance(instance_id: str) -> Any:
        got = real(instance_id)
        if instance_id == iid and not fired:
            fired.append(1)
            other_write()
        return got

    store.instance = instance
    return fired


def test_a_node_result_never_undoes_another_engines_instance_event(store_url) -> None:
    clock = ManualClock(T0)
    a, bus_a = engine(store_url, "A", clock)
    b, _ = engine(store_url, "B", clock)
    launch, add = _started_with_add_sent(a, bus_a, clock)
    # B consumes the input queue now: the cloud took the node back meanwhile
    ended = event(launch, "terminated", 3, clock.now()).model_copy(update={"error_kind": "preempted"})
    fired = _race(a.store, launch.launch_id, lambda: b.handle_input(ended))
    # A, still on the results, reads the instance; B's event is stored; A writes the add's failure
    a.handle_input(NodeCommandResult(command_id=add.command_id, domain="d", action="add", node=add.node,
                                     ok=False, error="timeout"))
    assert fired
    b.store.sync()
    inst = b.store.instance(launch.launch_id)
    assert inst.state == "terminated", "the node result's write undid the other engine's event (lost update)"
    # read again, the result finds its action answered by the event (an ended instance's add is over)
    row = a.store.action(add.command_id)
    assert row["done"] and row["outcome"] == "instance terminated"


def test_an_instance_event_never_undoes_another_engines_node_result(store_url) -> None:
    clock = ManualClock(T0)
    a, bus_a = engine(store_url, "A", clock)
    b, _ = engine(store_url, "B", clock)
    launch, add = _started_with_add_sent(a, bus_a, clock)
    failed_add = NodeCommandResult(command_id=add.command_id, domain="d", action="add", node=add.node,
                                   ok=False, error="timeout")
    fired = _race(a.store, launch.launch_id, lambda: b.handle_input(failed_add))
    # A handles a later event of the instance (a new address) while B stores the add's failure
    a.handle_input(InstanceEvent(**{**event(launch, "started", 3, clock.now(), ip="10.0.0.6").model_dump(),
                                    "reason": "address changed"}))
    assert fired
    b.store.sync()
    inst = b.store.instance(launch.launch_id)
    assert inst.add_sent_at is None, "the event's write undid the other engine's node result (lost update)"
    assert inst.ip == "10.0.0.6" and inst.seq == 3


def test_a_write_on_a_stale_read_is_refused_not_applied(store_url) -> None:
    """The store's own check, below the engine's retry: a write resting on a read that another
    engine's write made stale raises ``StaleWrite`` and stores nothing."""
    from epu.services.decision.lease import StaleWrite

    clock = ManualClock(T0)
    a, bus_a = engine(store_url, "A", clock)
    b, _ = engine(store_url, "B", clock)
    launch, _add = _started_with_add_sent(a, bus_a, clock)
    a.store.sync()
    stale = a.store.instance(launch.launch_id)
    b.handle_input(event(launch, "terminated", 3, clock.now()))
    with pytest.raises(StaleWrite):
        a.store.save_instances([stale])
    b.store.sync()
    assert b.store.instance(launch.launch_id).state == "terminated"
    a.store.sync()  # read again: the write goes through
    a.store.save_instances([a.store.instance(launch.launch_id)])


def test_a_plan_prepared_before_another_engines_write_is_not_committed(store_url) -> None:
    """A plan commit is a compare-and-set too (after its lease check): a plan prepared on rows
    another engine wrote since is not stored, nothing of it is sent, and the next iteration —
    on a fresh read — decides again."""
    clock = ManualClock(T0)
    a, bus_a = engine(store_url, "A", clock)
    b, _ = engine(store_url, "B", clock)
    launch, _add = _started_with_add_sent(a, bus_a, clock)
    bus_a.clear()
    real = a.store.commit_plans
    fired: list[int] = []

    def commit_plans(writes):  # noqa: ANN001, ANN202
        if not fired:
            fired.append(1)
            b.handle_input(event(launch, "terminated", 3, clock.now()))
        return real(writes)

    a.store.commit_plans = commit_plans
    clock.advance(5)
    a.on_snapshot(snapshot(queued=jobs(3), at=clock.now()))
    a.iterate()
    assert fired and bus_a.of("instance.launch") == [], "a plan on a stale read was sent"
    b.store.sync()
    assert b.store.instance(launch.launch_id).state == "terminated"
    clock.advance(5)
    a.on_snapshot(snapshot(queued=jobs(3), at=clock.now()))
    a.iterate()
    assert len(bus_a.of("instance.launch")) == 3  # read again: the whole demand, the ended one gone
