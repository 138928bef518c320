"""Issue 34's wedge, reproduced on a RabbitMQ node of our own with a small open-file limit.

RabbitMQ 3.x counts file handles against a budget of about 90 % of its open-file limit, and every
quorum queue reserves three of them for as long as it exists; classic queues reserve none. When
the budget is used up the broker does not refuse anything: a new connection is accepted but never
greeted, a queue declared on an open connection never answers, nothing is logged, the CPU idles.
That is what ``make test`` met: the suite's ~285 quorum queues used up the 927 handles of a broker
started under a shell's limit of 1,024, the demo's tap authenticated and then hung in its declare
(the broker dropped it 90 s later for missed heartbeats), and for 12 minutes no test could connect.

Here: the budget falls by three per quorum queue and not at all for classic ones; once it is used
up, a fresh connection gets no greeting (what the suite's check stops on, with the budget in its
line), and a declare on an open connection gets no answer (what ``common.stall`` breaks off); once
queues are deleted the broker answers again by itself."""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import amqp
import pytest
from epu.common.broker import Broker
from epu.common.stall import BrokerStalled, bounded
from epu.common.topology import Topology
from kombu import Queue

from tests.support.brokercheck import handshake_problem
from tests.support.rabbitnodes import RabbitNode

pytestmark = [pytest.mark.rabbitmq, pytest.mark.cluster]

NOFILE = 300
"""The node's open-file limit: a budget of ~200 handles, used up by ~65 quorum queues."""


@pytest.fixture
def small_budget_node(tmp_path: Path) -> Iterator[RabbitNode]:
    node = RabbitNode(tmp_path, 1, secrets.token_hex(16).upper(), nofile=NOFILE)
    try:
        node.start()
        yield node
    finally:
        node.stop(timeout=60)  # a wedged node may not answer `stop`: then it is killed
        if node.running:
            node.kill()


def budget(node: RabbitNode) -> tuple[int, int]:
    """RabbitMQ's own count: (handles in use, limit)."""
    out = node.ctl("eval", "file_handle_cache:info().", timeout=60).stdout
    found = dict(re.findall(r"\{(\w+),(\d+)\}", out.replace(" ", "").replace("\n", "")))
    return int(found["total_used"]), int(found["total_limit"])


def declare(channel: amqp.Channel, name: str, quorum: bool) -> None:
    channel.queue_declare(name, durable=True, auto_delete=False,
                          arguments={"x-queue-type": "quorum"} if quorum else {})


def test_quorum_queues_use_up_the_brokers_file_handles_and_then_it_answers_nothing(
        small_budget_node: RabbitNode) -> None:
    node = small_budget_node
    used, limit = budget(node)
    assert limit < NOFILE

    admin = amqp.Connection(f"127.0.0.1:{node.port}", userid="guest", password="guest", heartbeat=0)
    admin.connect()
    channel = admin.channel()
    for i in range(10):
        declare(channel, f"classic.{i}", quorum=False)
    after_classic, _ = budget(node)
    for i in range(10):
        declare(channel, f"quorum.{i}", quorum=True)
    after_quorum, _ = budget(node)
    assert after_classic - used <= 2, "classic queues reserve no file handles"
    assert after_quorum - after_classic == 30, "three file handles per quorum queue"

    # a client that connected before the budget runs out (as the demo's tap did)
    broker = Broker(node.url(), Topology(prefix="t."), call_timeout=3.0)
    early = broker.connection()
    try:
        n = 10
        while handshake_problem("127.0.0.1", node.port, "guest", "guest", seconds=2) is None:
            for _ in range(5):
                declare(channel, f"quorum.{n}", quorum=True)
                n += 1
            assert n < (limit // 3) + 20, "the budget never ran out"
        used, _ = budget(node)
        assert used >= limit - 3, f"{used} of {limit}: out of file handles with {n} quorum queues"
        # the suite's check: a connection the broker accepts but never greets
        problem = handshake_problem("127.0.0.1", node.port, "guest", "guest", seconds=3)
        assert problem is not None and "timed out" in problem

        # the tap's declare on its open connection: no answer, broken off by the deadline
        started = time.monotonic()
        tap = Queue("t.epu.tap.x", exclusive=True, auto_delete=True, durable=False)
        with pytest.raises(BrokerStalled, match="did not answer queue.declare"), \
                bounded(early, broker.call_timeout, "queue.declare"):
            tap(early.channel()).declare()
        assert time.monotonic() - started < broker.call_timeout + 5
    finally:
        early.release()

    # queues deleted (from the CLI: AMQP is what is stuck), the broker answers again by itself
    for i in range(15):
        node.ctl("delete_queue", f"quorum.{i}", timeout=60)
    deadline = time.monotonic() + 60
    while handshake_problem("127.0.0.1", node.port, "guest", "guest", seconds=3) is not None:
        assert time.monotonic() < deadline, "the broker did not recover once handles were freed"
    admin.collect()
