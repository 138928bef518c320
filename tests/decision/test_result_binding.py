"""A node result counts only as the answer of its own command: its domain (bound to its sender by
common.senders) and action must be the command's (issue 26, defect 4). Otherwise a sensor that
learnt another domain's command id could say "removed" for a node still running jobs."""

from __future__ import annotations

from epu.common.messages import NodeCommandResult

from tests.decision.helpers import event, jobs, make_engine, snapshot


def test_a_result_from_another_domain_or_for_another_action_is_not_its_commands_answer() -> None:
    e, bus, clock = make_engine()
    e.on_snapshot(snapshot(queued=jobs(1)))
    e.iterate()
    (launch,) = bus.of("instance.launch")
    e.on_instance_event(event(launch, "pending", 1, clock.now()))
    e.on_instance_event(event(launch, "started", 2, clock.now()))
    bus.clear()
    clock.advance(5)
    e.on_snapshot(snapshot(queued=jobs(1), at=clock.now()))
    e.iterate()
    (add,) = bus.of("node.command")
    assert add.action == "add"
    for domain, action in (("other", "add"), ("d", "remove")):
        e.on_node_result(NodeCommandResult(command_id=add.command_id, domain=domain, action=action, node=add.node,
                                           ok=True))
        assert not e.store.action(add.command_id)["done"], (domain, action)
    e.on_node_result(NodeCommandResult(command_id=add.command_id, domain="d", action="add", node=add.node, ok=True))
    assert e.store.action(add.command_id)["done"]
