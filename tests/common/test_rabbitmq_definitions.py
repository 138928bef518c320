"""deploy/rabbitmq/definitions.json: generated from the topology, loaded into the real broker,
each service user can do its job and is refused what it must not do (checked with pika)."""

from __future__ import annotations

import json
import secrets
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest

from common.broker import Broker
from common.codec import encode
from common.definitions import rabbitmq_definitions
from common.messages import Envelope, NodeCommand, SensorSnapshot
from common.runtime import Service, run_in_thread
from common.testing import wait_for
from common.topology import Topology
from tests.conftest import RABBIT_HOST, rabbitmqctl

pytestmark = pytest.mark.rabbitmq
ROOT = Path(__file__).resolve().parents[2]


def test_committed_definitions_match_the_topology() -> None:
    committed = json.loads((ROOT / "deploy/rabbitmq/definitions.json").read_text())
    generated = rabbitmq_definitions(Topology(), ["alpha"], vhost="epu")
    assert committed == generated, "regenerate: epu deploy rabbitmq-definitions --domain alpha -o deploy/rabbitmq/definitions.json"
    assert all(u["password_hash"] == "" for u in committed["users"]), "no password is committed"


@pytest.fixture(scope="module")
def loaded() -> Iterator[dict]:
    vhost = f"epu-defs-{uuid.uuid4().hex[:8]}"
    user_prefix = f"t{uuid.uuid4().hex[:6]}-"
    topology = Topology()
    base = rabbitmq_definitions(topology, ["alpha", "beta"], vhost=vhost, user_prefix=user_prefix)
    passwords = {u["name"]: secrets.token_urlsafe(12) for u in base["users"]}
    doc = rabbitmq_definitions(topology, ["alpha", "beta"], vhost=vhost, user_prefix=user_prefix, passwords=passwords)
    # via stdin: rabbitmqctl reads files as the rabbitmq user, which cannot see pytest's tmp dirs
    res = rabbitmqctl("import_definitions", check=False, stdin=json.dumps(doc))
    assert res.returncode == 0, res.stdout + res.stderr
    # the import is asynchronous: wait until the last user's topic permissions are in place
    last = user_prefix + "epu-operator"
    wait_for(lambda: "decision" in rabbitmqctl("list_user_topic_permissions", last, check=False).stdout,
             30, message="definitions imported")
    yield {"vhost": vhost, "prefix": user_prefix, "passwords": passwords, "topology": topology}
    for name in passwords:
        rabbitmqctl("delete_user", name, check=False)
    rabbitmqctl("delete_vhost", vhost, check=False)


def connect(loaded: dict, role: str) -> pika.BlockingConnection:
    user = loaded["prefix"] + role
    host, port = RABBIT_HOST.split(":")
    params = pika.ConnectionParameters(host, int(port), loaded["vhost"],
                                       pika.PlainCredentials(user, loaded["passwords"][user]))
    return pika.BlockingConnection(params)


def can(loaded: dict, role: str, action: Callable[[pika.adapters.blocking_connection.BlockingChannel], object]) -> bool:
    """Run ``action`` on a fresh confirming channel as ``role``: True if the broker allowed it."""
    conn = connect(loaded, role)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        action(ch)
        return True
    except (pika.exceptions.ChannelClosedByBroker, pika.exceptions.ProbableAccessDeniedError) as exc:
        assert "ACCESS_REFUSED" in str(exc) or "403" in str(exc), exc
        return False
    finally:
        if conn.is_open:
            conn.close()


def publish(exchange: str, key: str) -> Callable:
    return lambda ch: ch.basic_publish(exchange, key, b"x")


def consume(queue: str) -> Callable:
    return lambda ch: ch.basic_consume(queue, lambda *a: None)


def test_sensor_user_reads_only_its_queue_and_writes_only_its_events(loaded: dict) -> None:
    assert can(loaded, "epu-sensor-alpha", consume("epu.sensor.alpha"))
    assert can(loaded, "epu-sensor-alpha", publish("epu.events", "sensor.snapshot.alpha"))
    assert can(loaded, "epu-sensor-alpha", publish("epu.events", "node.result.alpha"))
    assert can(loaded, "epu-sensor-alpha", publish("epu.dlx", "epu.sensor.alpha"))
    assert not can(loaded, "epu-sensor-alpha", consume("epu.sensor.beta"))
    assert not can(loaded, "epu-sensor-alpha", consume("epu.provisioner"))
    assert not can(loaded, "epu-sensor-alpha", publish("epu.events", "sensor.snapshot.beta"))
    assert not can(loaded, "epu-sensor-alpha", publish("epu.events", "instance.state.alpha.started"))
    assert not can(loaded, "epu-sensor-alpha", publish("epu.commands", "provisioner"))
    assert not can(loaded, "epu-sensor-alpha", lambda ch: ch.queue_declare("mine"))


def test_decision_user(loaded: dict) -> None:
    assert can(loaded, "epu-decision", consume("epu.decision.input"))
    assert can(loaded, "epu-decision", consume("epu.decision.control"))
    assert can(loaded, "epu-decision", publish("epu.commands", "sensor.alpha"))
    assert can(loaded, "epu-decision", publish("epu.commands", "provisioner"))
    assert can(loaded, "epu-decision", publish("epu.events", "decision.record.alpha"))
    assert can(loaded, "epu-decision", publish("epu.events", "policy.outcome.alpha"))
    assert not can(loaded, "epu-decision", publish("epu.events", "instance.state.alpha.started"))
    assert not can(loaded, "epu-decision", consume("epu.provisioner"))
    assert not can(loaded, "epu-decision", lambda ch: ch.exchange_delete("epu.events"))


def test_provisioner_and_ctxbroker_users(loaded: dict) -> None:
    assert can(loaded, "epu-provisioner", consume("epu.provisioner"))
    assert can(loaded, "epu-provisioner", publish("epu.events", "instance.state.alpha.started"))
    assert not can(loaded, "epu-provisioner", publish("epu.events", "decision.record.alpha"))
    assert not can(loaded, "epu-provisioner", consume("epu.decision.input"))
    assert can(loaded, "epu-ctxbroker", consume("epu.ctxbroker.instances"))
    assert can(loaded, "epu-ctxbroker", publish("epu.events", "context.member.abc"))
    assert not can(loaded, "epu-ctxbroker", publish("epu.events", "instance.state.alpha.terminated"))


def test_operator_sends_control_messages_and_taps_events_but_nothing_else(loaded: dict) -> None:
    assert can(loaded, "epu-operator", publish("epu.commands", "decision.control"))
    assert not can(loaded, "epu-operator", publish("epu.commands", "sensor.alpha"))
    assert not can(loaded, "epu-operator", publish("epu.events", "decision.record.alpha"))
    assert not can(loaded, "epu-operator", consume("epu.provisioner"))

    def tap(ch: object) -> None:
        name = f"epu.tap.{uuid.uuid4().hex[:8]}"
        ch.queue_declare(name, exclusive=True, auto_delete=True)
        ch.queue_bind(name, "epu.events", "#")
        ch.basic_consume(name, lambda *a: None)

    assert can(loaded, "epu-operator", tap)
    assert not can(loaded, "epu-operator", lambda ch: ch.queue_declare("not-a-tap", exclusive=True))


def test_a_real_sensor_service_runs_as_its_least_privilege_user(loaded: dict) -> None:
    """The kombu runtime with declare=false does its whole job under these permissions."""
    user = loaded["prefix"] + "epu-sensor-alpha"
    url = f"amqp://{user}:{loaded['passwords'][user]}@{RABBIT_HOST}/{loaded['vhost']}"
    broker = Broker(url, loaded["topology"], declare=False)
    got: list[NodeCommand] = []
    svc = Service("sensor", broker)

    def handler(msg: NodeCommand, env: Envelope) -> None:
        got.append(msg)
        svc.publish(SensorSnapshot(domain="alpha", backend="simulated", taken_at=1.0))

    svc.consume(loaded["topology"].sensor_spec("alpha"), handler)
    t = run_in_thread(svc)
    assert svc.wait_ready(15)
    # the decision user sends a command; an operator tap sees the sensor's snapshot
    seen: list[bytes] = []
    tap_conn = connect(loaded, "epu-operator")
    ch = tap_conn.channel()
    q = f"epu.tap.{uuid.uuid4().hex[:8]}"
    ch.queue_declare(q, exclusive=True, auto_delete=True)
    ch.queue_bind(q, "epu.events", "sensor.snapshot.*")
    dconn = connect(loaded, "epu-decision")
    cmd = NodeCommand(command_id="c1", domain="alpha", action="add", node="w1")
    dconn.channel().basic_publish("epu.commands", "sensor.alpha", encode(Envelope.wrap(cmd, "decision")),
                                  pika.BasicProperties(content_type="application/x-msgpack"))
    stop = threading.Event()
    try:
        wait_for(lambda: got, 10, message="sensor received the command")

        def poll() -> bool:
            method, _props, body = ch.basic_get(q, auto_ack=True)
            if body:
                seen.append(body)
            return bool(seen)

        wait_for(poll, 10, message="operator tap saw the snapshot")
    finally:
        stop.set()
        svc.stop()
        t.join(10)
        tap_conn.close()
        dconn.close()
    assert got[0].node == "w1"
