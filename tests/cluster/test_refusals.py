"""A publish the broker refuses (406 PRECONDITION_FAILED: larger than ``max_message_size``) is an
error for that message, never a lost broker: no reconnect cycle, the other messages of the
batch confirmed, the publisher still usable — on a node of our own with a 1 MiB limit."""

from __future__ import annotations

import logging

import pytest
from epu.common.broker import Broker, Publisher, PublishRefused
from epu.common.messages import PolicyChange, PolicyOutcome
from epu.common.runtime import Service, run_in_thread
from epu.common.testing import drain
from epu.common.topology import Topology
from kombu import Queue

from tests.support.dead import DeadLetters
from tests.support.rabbitnodes import RabbitNode


def test_a_too_large_message_is_refused_not_retried(small_node: RabbitNode,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    broker = Broker(small_node.url(), Topology(prefix="refuse."))
    with broker.connection() as conn:
        ch = conn.channel()
        broker.topology.events_exchange(ch).declare()
        Queue("refuse.outcomes", exchange=broker.topology.events_exchange, routing_key="policy.outcome.#",
              durable=False)(ch).declare()
    pub = Publisher(broker, "test")
    big = PolicyOutcome(change_id="big", domain="r", applied=False, reason="x" * (2 * 1024 * 1024))
    try:
        pub.publish(PolicyOutcome(change_id="before", domain="r", applied=True))
        conn = pub._conn
        with caplog.at_level(logging.WARNING, logger="epu.broker"), \
                pytest.raises(PublishRefused, match="PRECONDITION_FAILED|larger than") as info:
            pub.publish_many([PolicyOutcome(change_id="a", domain="r", applied=True), big,
                              PolicyOutcome(change_id="b", domain="r", applied=True)])
        assert not info.value.transient
        assert list(info.value.refused) and len(info.value.refused) == 1
        assert not [r for r in caplog.records if "retrying" in r.getMessage()], "not taken for a lost broker"
        pub.publish(PolicyOutcome(change_id="after", domain="r", applied=True))
        assert pub._conn is conn, "the same connection"
    finally:
        pub.close()
    # at least once: a message published before the channel closed over ``big`` may be routed
    # and still unconfirmed, so it is resent singly — with the same message id, which is how
    # consumers drop the copy. Every message arrives; no two distinct messages share a change.
    got = [(env.body["change_id"], env.id) for env, _m in drain(broker, "refuse.outcomes")]
    assert sorted({cid for cid, _ in got}) == ["a", "after", "b", "before"]
    assert len({mid for _, mid in got}) == 4, f"a copy is a resend of the same message: {got}"
    assert "big" not in {cid for cid, _ in got}


def test_a_handler_whose_output_is_refused_is_dead_lettered_not_looped(small_node: RabbitNode) -> None:
    """The old failure: a refused (dead-letter) publish taken for a lost broker — reconnect
    cycles, nothing else consumed. Here the handler's refused publish is a permanent failure of
    that message: bounded attempts, then its dead letter (the original, small message)."""
    broker = Broker(small_node.url(), Topology(prefix="refuse2."))
    svc = Service("decision", broker)
    handled: list[str] = []

    def handler(msg: PolicyChange, env) -> None:
        handled.append(msg.change_id)
        if msg.change_id == "explodes":
            svc.publish(PolicyOutcome(change_id="huge", domain="r", applied=False, reason="y" * (2 << 20)))

    svc.consume(broker.topology.decision_control_spec(), handler)
    t = run_in_thread(svc)
    try:
        assert svc.wait_ready(20)
        svc.publish(PolicyChange(change_id="explodes", domain="r"))
        svc.publish(PolicyChange(change_id="fine", domain="r"))
        from epu.common.testing import wait_for

        wait_for(lambda: "fine" in handled, 20, message="the next message handled")
        found = DeadLetters(broker)
        dead = wait_for(lambda: found.take(1), 10, message="dead letter")
    finally:
        svc.stop()
        t.join(15)
    assert handled.count("explodes") == 3 and svc.reconnect_count == 0
    assert "PRECONDITION_FAILED" in dead[0].reason or "larger" in dead[0].reason
