"""``Publisher.publish_many`` against the real RabbitMQ: a batch confirmed together arrives whole
and in order, survives a connection the broker closed, and reports what the broker refused."""

from __future__ import annotations

import dataclasses
import logging

import msgpack
import pytest
from amqp.exceptions import MessageNacked
from epu.common.broker import Broker, Publisher
from epu.common.messages import PolicyOutcome
from epu.common.testing import drain, queue_depth
from kombu import Queue

from tests.conftest import rabbitmqctl

pytestmark = pytest.mark.rabbitmq


def outcome(i: int, domain: str) -> PolicyOutcome:
    return PolicyOutcome(change_id=f"c{i}", domain=domain, applied=True, version=i)


def bind(broker: Broker, name: str, key: str, **arguments: object) -> str:
    """A classic queue of this test's own on the events exchange."""
    topo = broker.topology
    qname = topo.n(name)
    with broker.connection() as conn:
        channel = conn.channel()
        topo.events_exchange(channel).declare()
        Queue(qname, exchange=topo.events_exchange, routing_key=key, durable=False, auto_delete=False,
              queue_arguments=arguments or None)(channel).declare()
    return qname


def change_ids(broker: Broker, qname: str) -> list[str]:
    return [env.body["change_id"] for env, _msg in drain(broker, qname)]


def test_a_batch_is_confirmed_whole_and_in_order(broker: Broker) -> None:
    qname = bind(broker, "pm.all", "policy.outcome.batch")
    pub = Publisher(broker, "test")
    try:
        envelopes = pub.publish_many([outcome(i, "batch") for i in range(1500)])
        # returned means confirmed: every message is in the queue already, no waiting
        assert queue_depth(broker, qname) == 1500
    finally:
        pub.close()
    assert change_ids(broker, qname) == [f"c{i}" for i in range(1500)]
    assert len({e.id for e in envelopes}) == 1500
    assert pub.publish_many([]) == []


def test_a_connection_the_broker_closed_is_replaced_and_nothing_lost(broker: Broker, rabbit_vhost: str,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    qname = bind(broker, "pm.reconnect", "policy.outcome.recon")
    pub = Publisher(broker, "test")
    try:
        pub.publish_many([outcome(0, "recon")])  # the publisher now holds an open connection
        out = rabbitmqctl("list_connections", "-q", "--no-table-headers", "pid", "vhost").stdout
        pids = [line.split()[0] for line in out.splitlines() if line.strip().endswith(rabbit_vhost)]
        assert pids
        for pid in pids:
            rabbitmqctl("close_connection", pid, "test: forced close", check=False)
        # (the broker has sent connection.close; the idle publisher has not read it yet)
        with caplog.at_level(logging.WARNING, logger="epu.broker"):
            pub.publish_many([outcome(i, "recon") for i in range(1, 401)])  # fails, reconnects, resends
    finally:
        pub.close()
    assert any(r.getMessage() == "publish failed, retrying" for r in caplog.records), "the closed connection was hit"
    ids = change_ids(broker, qname)
    assert set(ids) == {f"c{i}" for i in range(401)}  # at least once, and nothing lost


def test_messages_the_broker_refuses_are_reported_and_the_rest_delivered(broker: Broker) -> None:
    # a queue that refuses (nacks) publishes beyond 3 messages
    qname = bind(broker, "pm.full", "policy.outcome.full", **{"x-max-length": 3, "x-overflow": "reject-publish"})
    pub = Publisher(dataclasses.replace(broker, nack_retry_seconds=1.0), "test")
    try:
        with pytest.raises(MessageNacked, match="broker refused 5 of 8 messages") as info:
            pub.publish_many([outcome(i, "full") for i in range(8)])
        assert info.value.transient, "a full queue may take the message later: the caller may retry"
        # the publisher is still usable afterwards
        drained = change_ids(broker, qname)
        pub.publish_many([outcome(9, "full")])
    finally:
        pub.close()
    assert drained == ["c0", "c1", "c2"]
    assert change_ids(broker, qname) == ["c9"]


def test_memory_transport_publishes_one_by_one(memory_broker: Broker) -> None:
    qname = bind(memory_broker, "pm.mem", "policy.outcome.mem")
    pub = Publisher(memory_broker, "test")
    try:
        pub.publish_many([outcome(i, "mem") for i in range(5)])
    finally:
        pub.close()
    with memory_broker.connection() as conn:
        q = Queue(qname, no_declare=True)(conn.channel())
        got = []
        while (m := q.get(no_ack=True, accept=None)) is not None:
            got.append(msgpack.unpackb(m.body)["body"]["change_id"])
    assert got == [f"c{i}" for i in range(5)]


def test_an_unroutable_command_is_an_error_the_sender_sees(broker: Broker, caplog: pytest.LogCaptureFixture) -> None:
    from epu.common.broker import Unroutable
    from epu.common.messages import NodeCommand

    with broker.connection() as conn:
        broker.topology.declare(conn.channel(), [])  # exchanges, no sensor queue for "nowhere"
    pub = Publisher(broker, "test")
    try:
        with caplog.at_level(logging.WARNING, logger="epu.broker"), pytest.raises(Unroutable, match="unroutable"):
            pub.publish(NodeCommand(command_id="c1", domain="nowhere", action="add", node="w1"))
        # an event nobody listens to is fine (events are observations, not orders)
        pub.publish(outcome(1, "nobody"))
        assert not caplog.records, "a refusal is not retried as a broker loss"
    finally:
        pub.close()


def test_a_refused_publish_is_not_a_connection_loss(broker: Broker, caplog: pytest.LogCaptureFixture) -> None:
    from epu.common.broker import PublishRefused

    qname = bind(broker, "pm.refused", "policy.outcome.refused")
    pub = Publisher(broker, "test")
    try:
        pub.publish_many([outcome(0, "refused")])
        conn = pub._conn
        with caplog.at_level(logging.WARNING, logger="epu.broker"), pytest.raises(PublishRefused, match="404"):
            pub.publish_raw(b"x", exchange=broker.topology.n("no-such-exchange"), routing_key="k")
        assert not [r for r in caplog.records if "retrying" in r.getMessage()]
        pub.publish_many([outcome(1, "refused")])
        assert pub._conn is conn, "the connection was kept"
    finally:
        pub.close()
    assert change_ids(broker, qname) == ["c0", "c1"]
