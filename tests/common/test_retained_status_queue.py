"""The retained status queue against the real RabbitMQ: a status published while a reader holds
the previous one is the one readers see (the reader's put-back must not win), and a deployment
whose status queues an earlier version declared one deep is upgraded by declaring.

pika is the reader here on purpose: an independent client doing exactly basic.get then
basic.nack(requeue), the sequence ``epu status`` performs, interleaved with the engine's publish.
"""

from __future__ import annotations

import pika
import pytest
from epu.common.broker import Broker, Publisher
from epu.common.messages import EngineStatus
from epu.common.retained import read_retained

#: quorum: what is under test is how a quorum queue counts a held status against x-max-length
pytestmark = [pytest.mark.rabbitmq, pytest.mark.quorum]


def _pika(broker: Broker) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(broker.url))


def _status(at: float) -> EngineStatus:
    return EngineStatus(domain="alpha", at=at, policy=f"p{int(at)}")


def test_a_status_published_while_a_reader_holds_the_last_replaces_it(broker: Broker) -> None:
    topo = broker.topology
    with broker.connection() as conn:
        topo.declare(conn.channel(), [topo.status_spec("alpha")])
    name = topo.n(topo.status_spec("alpha").name)
    pub = Publisher(broker, "decision")
    reader = _pika(broker)
    try:
        pub.publish(_status(1.0))
        channel = reader.channel()
        held, _props, _body = channel.basic_get(name, auto_ack=False)
        assert held is not None, "the first status is in the queue"
        pub.publish(_status(2.0))  # confirmed: the broker has applied x-max-length by now
        channel.basic_nack(held.delivery_tag, requeue=True)
        reader.close()
        for _read in range(3):
            got = read_retained(broker, [name]).messages[name]
            assert (got.at, got.policy) == (2.0, "p2"), "the newer status, not the one put back"
    finally:
        pub.close()
        if reader.is_open:
            reader.close()


def test_a_one_deep_status_queue_of_an_earlier_version_is_replaced_by_declaring(broker: Broker) -> None:
    """Redeclaring a queue with other arguments is a 406 that closes the channel; the status queue
    holds only a value the engine sends again, so declaring replaces it and carries on."""
    topo = broker.topology
    name = topo.n(topo.status_spec("alpha").name)
    old = _pika(broker)
    try:
        old.channel().queue_declare(name, durable=True, arguments={
            "x-queue-type": "quorum", "x-max-length": 1, "x-overflow": "drop-head"})
    finally:
        old.close()
    later = topo.decision_snapshot_spec("alpha")  # declared after it, on the channel carried on with
    with broker.connection() as conn:
        topo.declare(conn.channel(), [topo.status_spec("alpha"), later])
        topo.declare(conn.channel(), [topo.status_spec("alpha"), later])  # now it matches: a no-op
    check = _pika(broker)
    try:
        channel = check.channel()
        channel.queue_declare(topo.n(later.name), passive=True)
        # a declare with other arguments than the queue's would be refused (406): it has the new ones
        channel.queue_declare(name, durable=True,
                              arguments=topo.kombu_queues(topo.status_spec("alpha"))[0].queue_arguments)
    finally:
        check.close()
    pub = Publisher(broker, "decision")
    try:
        pub.publish(_status(3.0))
    finally:
        pub.close()
    assert read_retained(broker, [name]).messages[name].at == 3.0


def test_other_queues_declared_differently_still_fail_loudly(broker: Broker) -> None:
    """Only rebuildable latest-value queues are replaced: a work queue holds records."""
    from amqp.exceptions import PreconditionFailed

    topo = broker.topology
    name = topo.n(topo.provisioner_spec().name)
    old = _pika(broker)
    try:
        old.channel().queue_declare(name, durable=True)  # classic, no dead-lettering
    finally:
        old.close()
    with broker.connection() as conn, pytest.raises(PreconditionFailed):
        topo.declare(conn.channel(), [topo.provisioner_spec()])
