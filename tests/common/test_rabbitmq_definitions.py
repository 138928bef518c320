"""deploy/rabbitmq/definitions.json: generated from the topology, loaded into the real broker,
each service user can do its job and is refused what it must not do (checked with pika)."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest
from epu.common.broker import Broker
from epu.common.codec import encode
from epu.common.definitions import rabbitmq_definitions
from epu.common.messages import Envelope, NodeCommand, SensorSnapshot
from epu.common.runtime import Service, run_in_thread
from epu.common.testing import wait_for
from epu.common.topology import Topology

from tests.conftest import RABBIT_HOST, rabbitmqctl
from tests.support.definitions import loaded_definitions

pytestmark = pytest.mark.rabbitmq
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.quorum  # the committed file declares production's quorum queues
def test_committed_definitions_match_the_topology() -> None:
    committed = json.loads((ROOT / "deploy/rabbitmq/definitions.json").read_text())
    generated = rabbitmq_definitions(Topology(), ["alpha"], vhost="epu")
    assert committed == generated, "regenerate: epu deploy rabbitmq-definitions --domain alpha -o deploy/rabbitmq/definitions.json"
    assert all(u["password_hash"] == "" for u in committed["users"]), "no password is committed"


@pytest.fixture(scope="module")
def loaded() -> Iterator[dict]:
    with loaded_definitions(["alpha", "beta"]) as d:
        yield {"vhost": d.vhost, "prefix": d.prefix, "passwords": d.passwords, "topology": d.topology}


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
    assert can(loaded, "epu-sensor-alpha", publish("epu.notes", "epu.sensor.alpha"))
    assert not can(loaded, "epu-sensor-alpha", publish("epu.notes", "epu.sensor.beta"))
    assert not can(loaded, "epu-sensor-alpha", publish("epu.notes", "epu.provisioner"))
    assert not can(loaded, "epu-sensor-alpha", consume("epu.sensor.beta"))
    assert not can(loaded, "epu-sensor-alpha", consume("epu.provisioner"))
    assert not can(loaded, "epu-sensor-alpha", publish("epu.events", "sensor.snapshot.beta"))
    assert not can(loaded, "epu-sensor-alpha", publish("epu.events", "instance.state.alpha.started"))
    assert not can(loaded, "epu-sensor-alpha", publish("epu.commands", "provisioner.launch"))
    assert not can(loaded, "epu-sensor-alpha", lambda ch: ch.queue_declare("mine"))


def test_decision_user(loaded: dict) -> None:
    assert can(loaded, "epu-decision", consume("epu.decision.input"))
    assert can(loaded, "epu-decision", consume("epu.decision.control"))
    assert can(loaded, "epu-decision", publish("epu.commands", "sensor.alpha"))
    assert can(loaded, "epu-decision", publish("epu.commands", "provisioner.launch"))
    assert can(loaded, "epu-decision", publish("epu.commands", "provisioner.terminate"))
    assert can(loaded, "epu-decision", publish("epu.events", "decision.record.alpha"))
    assert can(loaded, "epu-decision", publish("epu.events", "policy.outcome.alpha"))
    assert can(loaded, "epu-decision", publish("epu.events", "decision.status.alpha"))
    assert not can(loaded, "epu-decision", publish("epu.events", "instance.state.alpha.started"))
    assert not can(loaded, "epu-decision", consume("epu.provisioner"))
    assert not can(loaded, "epu-decision", lambda ch: ch.exchange_delete("epu.events"))


def test_provisioner_and_ctxbroker_users(loaded: dict) -> None:
    assert can(loaded, "epu-provisioner", consume("epu.provisioner"))
    assert can(loaded, "epu-provisioner", publish("epu.events", "instance.state.alpha.started"))
    assert can(loaded, "epu-provisioner", publish("epu.events", "provisioner.alert.sim.orphan-seen"))
    assert not can(loaded, "epu-provisioner", publish("epu.events", "decision.record.alpha"))
    assert not can(loaded, "epu-provisioner", consume("epu.decision.input"))
    assert can(loaded, "epu-ctxbroker", consume("epu.ctxbroker.instances"))
    assert can(loaded, "epu-ctxbroker", publish("epu.events", "context.member.abc"))
    assert not can(loaded, "epu-ctxbroker", publish("epu.events", "instance.state.alpha.terminated"))


ROLES = ("epu-sensor-alpha", "epu-sensor-beta", "epu-decision", "epu-provisioner", "epu-ctxbroker", "epu-operator")


def test_no_user_may_publish_to_the_dead_letter_exchange(loaded: dict) -> None:
    """Issue 33: only the broker puts messages into epu.dlx (a consumer rejects, the queue's
    x-dead-letter-exchange takes it). A user that could publish there could make a forged
    terminate look like anyone's letter."""
    for role in ROLES:
        assert not can(loaded, role, publish("epu.dlx", "epu.provisioner")), f"{role} may write epu.dlx"
        assert not can(loaded, role, publish("epu.dlx", "")), f"{role} may write epu.dlx"


def test_each_service_writes_death_notes_only_for_the_queues_it_reads(loaded: dict) -> None:
    """A death note's routing key is the rejecting queue's name: only that queue's reader may publish it."""
    readers = {"epu.sensor.alpha": "epu-sensor-alpha", "epu.sensor.beta": "epu-sensor-beta",
               "epu.decision.input": "epu-decision", "epu.decision.control": "epu-decision",
               "epu.decision.snapshot.alpha": "epu-decision", "epu.provisioner": "epu-provisioner",
               "epu.ctxbroker.instances": "epu-ctxbroker"}
    for queue, reader in readers.items():
        for role in ROLES:
            assert can(loaded, role, publish("epu.notes", queue)) == (role == reader), (role, queue)
    assert can(loaded, "epu-operator", lambda ch: ch.basic_get("epu.dead.notes"))
    assert not can(loaded, "epu-decision", lambda ch: ch.basic_get("epu.dead.notes"))


def test_operator_sends_control_messages_and_taps_events_but_nothing_else(loaded: dict) -> None:
    assert can(loaded, "epu-operator", publish("epu.commands", "decision.control"))
    assert can(loaded, "epu-operator", publish("epu.commands", "provisioner.terminate"))
    # terminate and launch have distinct keys: an operator may terminate but never launch
    assert not can(loaded, "epu-operator", publish("epu.commands", "provisioner.launch"))
    assert not can(loaded, "epu-operator", publish("epu.commands", "provisioner"))
    assert not can(loaded, "epu-operator", publish("epu.commands", "sensor.alpha"))
    assert not can(loaded, "epu-operator", publish("epu.events", "decision.record.alpha"))
    assert not can(loaded, "epu-operator", consume("epu.provisioner"))
    # the engine's retained status: read (basic.get, put back), never written or consumed away by others
    assert can(loaded, "epu-operator", lambda ch: ch.basic_get("epu.status.alpha"))
    assert not can(loaded, "epu-operator", publish("epu.events", "decision.status.alpha"))
    assert not can(loaded, "epu-provisioner", publish("epu.events", "decision.status.alpha"))
    assert not can(loaded, "epu-operator", lambda ch: ch.basic_get("epu.decision.snapshot.alpha"))

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


def test_a_passwords_file_must_name_every_user_and_the_output_is_private(tmp_path: Path) -> None:
    import os
    import stat
    import subprocess
    import sys

    users = [u["name"] for u in rabbitmq_definitions(Topology(), ["alpha"])["users"]]

    def deploy(pw: str) -> subprocess.CompletedProcess[str]:
        (tmp_path / "pw.toml").write_text(pw)
        out = tmp_path / "defs.json"
        out.unlink(missing_ok=True)
        return subprocess.run([sys.executable, "-m", "epu", "deploy", "rabbitmq-definitions", "--domain", "alpha",
                               "--passwords-file", str(tmp_path / "pw.toml"), "-o", str(out)],
                              capture_output=True, text=True, timeout=60,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})

    full = "".join(f'"{u}" = "pw-{i}"\n' for i, u in enumerate(users))
    missing = "".join(f'"{u}" = "pw"\n' for u in users if u != "epu-decision")
    misspelled = missing + '"epu-decison" = "pw"\n'
    res = deploy(missing)
    assert res.returncode == 2 and "no password for epu-decision" in res.stderr
    assert not (tmp_path / "defs.json").exists(), "nothing written"
    res = deploy(misspelled)
    assert res.returncode == 2 and "epu-decison" in res.stderr and "misspelled" in res.stderr
    assert "Traceback" not in res.stderr
    res = deploy(full)
    assert res.returncode == 0, res.stderr
    mode = stat.S_IMODE((tmp_path / "defs.json").stat().st_mode)
    assert mode == 0o600, oct(mode)
    doc = json.loads((tmp_path / "defs.json").read_text())
    assert all(u["password_hash"] for u in doc["users"])
    assert "pw-0" not in (tmp_path / "defs.json").read_text()


def test_queues_are_bounded_by_policy() -> None:
    """Small bounds, so the test can reach them: a suspended tap drops its oldest beyond its
    byte bound; dead letters expire; the decision input refuses publishes once full (the
    publisher is told); every durable queue has exactly one bounding policy."""
    import time

    import msgpack
    from epu.common.broker import Publisher, PublishRefused
    from epu.common.definitions import QueueBounds
    from epu.common.messages import InstanceEvent, PolicyOutcome
    from epu.common.testing import queue_depth

    bounds = QueueBounds(tap_max_bytes=64 * 1024, dead_letter_days=2 / 86400, input_max_bytes=32 * 1024,
                         input_max_length=1000)
    with loaded_definitions(["alpha"], bounds=bounds, admin_access=True) as d:
        admin = Broker(d.admin_url, d.topology)
        out = rabbitmqctl("list_queues", "-p", d.vhost, "-q", "--no-table-headers", "name", "policy").stdout
        policies = {(p := line.split())[0]: (p[1:] or [""])[0] for line in out.splitlines() if line.strip()}
        assert policies == {"epu.dead": "epu-dead", "epu.dead.notes": "epu-dead",
                            "epu.decision.input": "epu-decision-input",
                            "epu.provisioner": "epu-work", "epu.decision.control": "epu-work",
                            "epu.ctxbroker.instances": "epu-work", "epu.sensor.alpha": "epu-work",
                            "epu.decision.snapshot.alpha": "",  # one message deep by its own arguments
                            "epu.status.alpha": ""}
        # a tap nobody reads: bounded by bytes
        conn = connect({"prefix": d.prefix, "passwords": d.passwords, "vhost": d.vhost}, "epu-operator")
        ch = conn.channel()
        tap = f"epu.tap.{uuid.uuid4().hex[:8]}"
        ch.queue_declare(tap, exclusive=True, auto_delete=True)
        ch.queue_bind(tap, "epu.events", "#")
        pub = Publisher(Broker(d.url("epu-decision"), d.topology, declare=False), "decision")
        try:
            big = [PolicyOutcome(change_id=f"c{i}", domain="alpha", applied=False, reason="x" * 4000)
                   for i in range(64)]
            pub.publish_many(big)  # ~256 KB into a 64 KB tap
            q = ch.queue_declare(tap, passive=True).method
            assert 0 < q.message_count < 20, q.message_count
        finally:
            conn.close()
        # the decision input refuses beyond its bytes: the provisioner is told, nothing is silently lost
        prov = Publisher(Broker(d.url("epu-provisioner"), d.topology, declare=False, nack_retry_seconds=0.5),
                         "provisioner")
        refused = 0
        try:
            for i in range(20):
                try:
                    prov.publish(InstanceEvent(instance_id=f"i{i}", domain="alpha", site="s", state="failed",
                                               seq=1, reason="y" * 4000, at=1.0))
                except PublishRefused as exc:
                    assert exc.transient, "a full queue may take it later"
                    refused += 1
        finally:
            prov.close()
        assert refused > 0 and queue_depth(admin, "epu.decision.input") < 20
        # the latest-value snapshot queue keeps only the newest snapshot
        sensor = Publisher(Broker(d.url("epu-sensor-alpha"), d.topology, declare=False), "sensor")
        try:
            for i in range(5):
                sensor.publish(SensorSnapshot(domain="alpha", backend="x", taken_at=float(i)))
        finally:
            sensor.close()
        assert queue_depth(admin, "epu.decision.snapshot.alpha") == 1
        conn = connect({"prefix": d.prefix, "passwords": d.passwords, "vhost": d.vhost}, "epu-decision")
        try:
            _method, _props, body = next(conn.channel().consume("epu.decision.snapshot.alpha",
                                                               inactivity_timeout=10))
        finally:
            conn.close()
        assert msgpack.unpackb(body)["body"]["taken_at"] == 4.0, "only the newest is kept"
        assert queue_depth(admin, "epu.dead") == 0, "replaced snapshots are not dead letters"
        # dead letters expire after dead_letter_days (2 s here)
        admin_pub = Publisher(admin, "test")
        admin_pub.publish_raw(b"dead", exchange="epu.dlx", routing_key="epu.sensor.alpha", mandatory=True)
        admin_pub.close()
        assert queue_depth(admin, "epu.dead") == 1
        deadline = time.monotonic() + 15
        while queue_depth(admin, "epu.dead") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert queue_depth(admin, "epu.dead") == 0, "the dead letter expired"
