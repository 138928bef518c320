"""The sensor service on the real RabbitMQ: snapshots, commands, dedupe, dead-letters."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from epu.common.broker import Broker, Publisher
from epu.common.clock import ManualClock
from epu.common.codec import packb
from epu.common.config import parse_config
from epu.common.messages import NodeCommand, NodeCommandResult, SensorSnapshot, new_id
from epu.common.runtime import Service, run_in_thread
from epu.common.testing import drain, wait_for
from epu.services.sensor.app import build_service
from epu.services.sensor.simulated import SimulatedBatch
from kombu import Queue

pytestmark = [pytest.mark.rabbitmq, pytest.mark.timeout(120)]


class Tap:
    """Everything on the events exchange, collected through a queue bound with '#'."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.name = broker.topology.n("test.sensor.tap")
        self.seen: list[Any] = []
        with broker.connection() as conn:
            ch = conn.channel()
            broker.topology.events_exchange(ch).declare()
            Queue(self.name, exchange=broker.topology.events_exchange, routing_key="#", durable=False,
                  auto_delete=False)(ch).declare()

    def messages(self) -> list[Any]:
        self.seen += [m for _, m in drain(self.broker, self.name)]
        return self.seen

    def snapshots(self) -> list[SensorSnapshot]:
        return [m for m in self.messages() if isinstance(m, SensorSnapshot)]

    def results(self) -> list[NodeCommandResult]:
        return [m for m in self.messages() if isinstance(m, NodeCommandResult)]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1_800_000_000.0)


@pytest.fixture
def sim(clock: ManualClock) -> SimulatedBatch:
    return SimulatedBatch(clock, nodes={"w1": 2})


@pytest.fixture
def service(broker: Broker, clock: ManualClock, sim: SimulatedBatch, tmp_path) -> Iterator[Service]:
    config = parse_config({
        "broker": {"url": broker.url, "prefix": broker.topology.prefix},
        "sensor": {"domain": "alpha", "backend": "simulated", "poll_seconds": 60,
                   "options": {"state_path": str(tmp_path / "sensor.sqlite3"), "tick_seconds": 0.02,
                               "retry_initial_seconds": 2}},
    }, environ={})
    svc = build_service(config, clock=clock, backend=sim)
    yield svc
    svc.stop()


@pytest.fixture
def tap(broker: Broker) -> Tap:
    return Tap(broker)


def start(svc: Service) -> None:
    run_in_thread(svc)
    assert svc.wait_ready(15)


def send(broker: Broker, command: NodeCommand) -> None:
    pub = Publisher(broker, source="test")
    try:
        pub.publish(command)
    finally:
        pub.close()


def test_snapshot_on_start_and_every_poll_period(service: Service, tap: Tap, clock: ManualClock,
                                                 sim: SimulatedBatch) -> None:
    sim.submit(cores=2, count=3, duration=1000)
    start(service)
    first = wait_for(lambda: tap.snapshots(), 15, message="first snapshot")[0]
    assert first.available and first.domain == "alpha" and first.running_jobs == 1
    assert first.queued_count() == 2 and first.jobs == []  # shapes on the wire, not one record per job
    clock.advance(60)
    wait_for(lambda: len(tap.snapshots()) >= 2, 15, message="second snapshot after one period")


def test_command_result_snapshot_and_dedupe(service: Service, tap: Tap, broker: Broker,
                                            sim: SimulatedBatch, clock: ManualClock) -> None:
    start(service)
    wait_for(lambda: tap.snapshots(), 15, message="first snapshot")
    command = NodeCommand(command_id=new_id(), domain="alpha", action="add", node="w2", cores=4)
    send(broker, command)
    result = wait_for(lambda: tap.results(), 15, message="command result")[0]
    assert result.ok and result.command_id == command.command_id and not result.duplicate
    clock.advance(1)  # the re-read after a change is coalesced: refresh_seconds (1 s) later
    wait_for(lambda: any("w2" in {n.name for n in s.nodes} for s in tap.snapshots()), 15,
             message="snapshot soon after the change")
    sim.execute("remove", "w2")
    send(broker, command)  # re-sent (or redelivered): not run again, result sent again
    again = wait_for(lambda: tap.results()[1:], 15, message="duplicate result")[0]
    assert again.duplicate and again.ok and again.command_id == command.command_id
    assert "w2" not in sim.node_names()


def test_unreadable_backend_publishes_unavailable(service: Service, tap: Tap, clock: ManualClock,
                                                  sim: SimulatedBatch) -> None:
    sim.submit(count=4, duration=1000)
    sim.set_available(False, "sinfo: error: Unable to contact slurm controller")
    start(service)
    snaps = wait_for(lambda: tap.snapshots(), 15, message="unavailable snapshot")
    assert not snaps[0].available and snaps[0].jobs == [] and "slurm controller" in (snaps[0].error or "")
    clock.advance(2)
    wait_for(lambda: len(tap.snapshots()) >= 2, 15, message="retry after backoff")
    assert all(not s.available for s in tap.snapshots())
    sim.set_available(True)
    clock.advance(4)
    wait_for(lambda: tap.snapshots()[-1].available, 15, message="recovered snapshot")
    assert tap.snapshots()[-1].running_jobs == 2


def test_hostile_node_name_is_dead_lettered_with_reason(service: Service, broker: Broker, sim: SimulatedBatch,
                                                        tap: Tap) -> None:
    start(service)
    topo = broker.topology
    body = {"command_id": "c-evil", "domain": "alpha", "action": "add", "node": "x;reboot", "cores": 1}
    envelope = {"schema_version": "1.0", "type": "node.command", "id": new_id(), "timestamp": 0.0,
                "source": "attacker", "correlation_id": None, "body": body}
    pub = Publisher(broker, source="test")
    try:
        pub.publish_raw(packb(envelope), exchange=topo.commands_exchange.name, routing_key="sensor.alpha",
                        content_type="application/x-msgpack")
    finally:
        pub.close()
    from tests.support.dead import DeadLetters

    found = DeadLetters(broker)
    (dead,) = wait_for(lambda: found.take(1), 15, message="the dead letter")
    assert "node" in dead.reason and "x;reboot" not in sim.node_names()
    # and the sender gets an answer, so it stops re-sending (issue 14)
    (result,) = wait_for(lambda: [r for r in tap.results() if r.command_id == "c-evil"], 15,
                         message="failed result for the invalid command")
    assert not result.ok and "invalid command, not executed" in (result.error or "") and result.node == "x;reboot"
