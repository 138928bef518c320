"""A node command answered with an error waits a doubling delay before it is planned again
(``services/decision/retries.py``): a batch controller down for an hour was asked 360 times an
hour per node (invariant 12 in htcondor-two-views and our-outage)."""

from __future__ import annotations

from epu.common.messages import NodeCommandResult
from epu.services.decision.retries import CommandRetries

from tests.decision.helpers import event, jobs, make_engine, snapshot


def test_backoff_doubles_to_its_maximum_and_ends_with_a_success() -> None:
    r = CommandRetries(initial=20, maximum=300)
    r.answered("i", "add", "c1", False, 0)
    assert r.waiting(19) == {("i", "add")} and r.waiting(20) == set()
    r.answered("i", "add", "c1", False, 5)  # the same answer again counts once
    assert r.next_end(0) == 20
    for cid in ["c2", "c3", "c4", "c5", "c6"]:
        r.answered("i", "add", cid, False, 100)
    assert r.next_end(100) == 400  # 20, 40, 80, 160, 300 (capped), 300
    r.answered("i", "add", "c7", True, 101)
    assert r.waiting(101) == set() and len(r) == 0


def test_an_add_the_batch_system_keeps_refusing_is_asked_less_and_less_often() -> None:
    e, bus, clock = make_engine()
    e.on_snapshot(snapshot(queued=jobs(1)))
    e.iterate()
    (launch,) = bus.of("instance.launch")
    e.on_instance_event(event(launch, "started", 2, clock.now()))
    adds = []
    for _ in range(360):  # an hour, an iteration every 10 s, the controller down throughout
        clock.advance(10)
        e.on_snapshot(snapshot(queued=jobs(1), at=clock.now()))
        bus.clear()
        e.iterate()
        for c in bus.of("node.command"):
            adds.append(c)
            e.on_node_result(NodeCommandResult(command_id=c.command_id, domain="d", action=c.action, node=c.node,
                                               ok=False, error="slurmctld not responding"))
    # was 360: the add every 10 s until the instance stalled (600 s), then its remove every 10 s
    n_add = sum(1 for c in adds if c.action == "add")
    assert 4 <= n_add <= 7 and len(adds) <= 25, [c.action for c in adds]
