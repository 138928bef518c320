"""The service runtime against the real RabbitMQ: confirms, acks, dead-lettering, retries,
broker loss and graceful shutdown. Every test uses names unique to it (``broker`` fixture)."""

from __future__ import annotations

import json
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import msgpack
import pytest
from epu.common.broker import Broker, Publisher
from epu.common.messages import Envelope, PolicyChange, SensorSnapshot
from epu.common.runtime import Reject, RuntimeSettings, Service, run_in_thread
from epu.common.testing import queue_depth, wait_for

from tests.conftest import rabbitmqctl
from tests.support.dead import DeadLetters, Letter

pytestmark = pytest.mark.rabbitmq


def change(i: int, domain: str = "alpha") -> PolicyChange:
    return PolicyChange(change_id=f"c{i}", domain=domain, min_nodes=i)


class Recorder:
    def __init__(self) -> None:
        self.items: list[PolicyChange] = []
        self.lock = threading.Lock()

    def __call__(self, msg: PolicyChange, env: Envelope) -> None:
        with self.lock:
            self.items.append(msg)

    def ids(self) -> set[str]:
        with self.lock:
            return {m.change_id for m in self.items}


def start(service: Service) -> threading.Thread:
    thread = run_in_thread(service)
    assert service.wait_ready(15), "service did not connect"
    return thread


def stop(service: Service, thread: threading.Thread) -> None:
    service.stop()
    thread.join(15)
    assert not thread.is_alive()


def test_publish_with_confirms_consume_and_ack(broker: Broker) -> None:
    rec = Recorder()
    svc = Service("decision", broker)
    svc.consume(broker.topology.decision_control_spec(), rec, types={"policy.change"})
    t = start(svc)
    try:
        for i in range(100):
            svc.publish(change(i))
        wait_for(lambda: len(rec.ids()) == 100, 15, message="100 messages handled")
        assert [m.min_nodes for m in rec.items] == list(range(100)), "order kept on one queue"
    finally:
        stop(svc, t)
    # everything was acked: nothing left on the queue
    assert queue_depth(broker, broker.topology.n("epu.decision.control")) == 0


def _raw_publish(pub: Publisher, broker: Broker, body: bytes | dict, routing_key: str = "decision.control") -> None:
    pub.publish_raw(body, exchange=broker.topology.commands_exchange.name, routing_key=routing_key,
                    content_type="application/x-msgpack")


def test_bad_messages_are_dead_lettered_with_a_reason_and_the_consumer_keeps_serving(broker: Broker) -> None:
    rec = Recorder()
    svc = Service("decision", broker)
    svc.consume(broker.topology.decision_control_spec(), rec, types={"policy.change"})
    t = start(svc)
    good = Envelope.wrap(change(1), "test").model_dump()
    wrong_type = Envelope.wrap(SensorSnapshot(domain="alpha", backend="x", taken_at=1.0), "test").model_dump()
    missing = {**good, "body": {"domain": "alpha"}}
    future = {**good, "schema_version": "9.0"}
    pub = Publisher(broker, "test")
    try:
        _raw_publish(pub, broker, b"\xc1 this is not msgpack")
        _raw_publish(pub, broker, msgpack.packb(wrong_type))
        _raw_publish(pub, broker, msgpack.packb(future))
        _raw_publish(pub, broker, msgpack.packb(missing))
        svc.publish(change(2))
        wait_for(lambda: rec.ids() == {"c2"}, 10, message="the good message after the bad ones")
        dead = wait_for(lambda: _dead(broker, 4), 10, message="4 dead-lettered messages")
    finally:
        stop(svc, t)
        pub.close()
    reasons = sorted(m.reason for m in dead)
    assert any("not msgpack" in r for r in reasons)
    assert any("unexpected message type 'sensor.snapshot'" in r for r in reasons)
    assert any("unsupported schema major version 9.0" in r for r in reasons)
    assert any("change_id: Field required" in r for r in reasons)
    assert all(m.queue == broker.topology.n("epu.decision.control") for m in dead)  # the broker's record
    assert not any(k.startswith("x-epu-") for m in dead for k in m.headers), "the runtime writes no letter"
    # the dead-lettered bodies are kept byte for byte
    assert any(m.body == b"\xc1 this is not msgpack" for m in dead)


_dead_seen: dict[str, DeadLetters] = {}


def _dead(broker: Broker, n: int) -> list[Letter] | None:
    return _dead_seen.setdefault(broker.topology.prefix, DeadLetters(broker)).take(n)


def test_reject_dead_letters_at_once_and_transient_errors_retry_then_dead_letter(broker: Broker) -> None:
    calls: dict[str, int] = {}

    def handler(msg: PolicyChange, env: Envelope) -> None:
        calls[msg.change_id] = calls.get(msg.change_id, 0) + 1
        if msg.change_id == "reject":
            raise Reject("policy 'nope' does not exist")
        if msg.change_id == "flaky" and calls["flaky"] < 3:
            raise ConnectionResetError("database went away")
        if msg.change_id == "broken":
            raise RuntimeError("always fails")

    svc = Service("decision", broker, settings=RuntimeSettings(max_attempts=3, retry_base_seconds=0.01))
    svc.consume(broker.topology.decision_control_spec(), handler)
    t = start(svc)
    try:
        for cid in ("reject", "flaky", "broken", "fine"):
            svc.publish(PolicyChange(change_id=cid, domain="alpha"))
        wait_for(lambda: calls.get("fine") == 1, 10, message="last message handled")
        dead = wait_for(lambda: _dead(broker, 2), 10, message="2 dead-lettered")
    finally:
        stop(svc, t)
    assert calls == {"reject": 1, "flaky": 3, "broken": 3, "fine": 1}
    reasons = {msgpack.unpackb(m.body)["body"]["change_id"]: m.reason for m in dead}
    assert reasons["reject"] == "rejected by decision: policy 'nope' does not exist"
    assert reasons["broken"].startswith("handler failed after 3 attempts: RuntimeError: always fails")
    assert svc.metrics.dead_lettered.labels(broker.topology.n("epu.decision.control"))._value.get() == 2


def _close_connections(vhost: str) -> int:
    out = rabbitmqctl("list_connections", "-q", "--no-table-headers", "pid", "vhost").stdout
    pids = [line.split()[0] for line in out.splitlines() if line.strip().endswith(vhost)]
    for pid in pids:
        rabbitmqctl("close_connection", pid, "test: forced close", check=False)
    return len(pids)


def test_broker_connection_force_closed_mid_stream_loses_nothing(broker: Broker, rabbit_vhost: str) -> None:
    rec = Recorder()
    svc = Service("decision", broker, settings=RuntimeSettings(reconnect_initial=0.2, reconnect_max=1.0))
    svc.consume(broker.topology.decision_control_spec(), rec, prefetch=5)
    t = start(svc)
    pub = Publisher(broker, "test-publisher")
    confirmed: list[str] = []
    total = 400
    try:
        def producer() -> None:
            for i in range(total):
                pub.publish(change(i))  # returns only once the broker confirmed it
                confirmed.append(f"c{i}")

        p = threading.Thread(target=producer)
        p.start()
        wait_for(lambda: len(rec.ids()) > 50, 20, message="consumption under way")
        closed = _close_connections(rabbit_vhost)
        assert closed >= 2, "consumer and publisher connections were force-closed"
        p.join(60)
        assert not p.is_alive()
        wait_for(lambda: set(confirmed) <= rec.ids(), 30,
                 message="every confirmed message consumed after reconnect")
        assert svc.metrics.reconnects._value.get() >= 1
    finally:
        stop(svc, t)
        pub.close()
    assert len(confirmed) == total


SHUTDOWN_SCRIPT = r"""
import sys, time, json
from epu.common.broker import Broker
from epu.common.topology import Topology
from epu.common.runtime import Service
url, prefix, out = sys.argv[1:4]
broker = Broker(url, Topology(prefix=prefix))
svc = Service("decision", broker)
def handler(msg, env):
    with open(out, "a") as f:
        f.write(json.dumps({"start": msg.change_id}) + "\n")
    time.sleep(0.6)  # the message in hand when SIGTERM arrives
    with open(out, "a") as f:
        f.write(json.dumps({"done": msg.change_id}) + "\n")
svc.consume(broker.topology.decision_control_spec(), handler, prefetch=10)
svc.install_signal_handlers()
svc.on_start.append(lambda: open(out + ".ready", "w").close())
svc.run()
"""


def test_graceful_shutdown_finishes_the_message_in_hand_and_loses_nothing(broker: Broker, rabbit_url: str,
                                                                          tmp_path: Path) -> None:
    out = tmp_path / "handled.jsonl"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    pub = Publisher(broker, "test")
    # declare the queue first so the published messages wait there
    declarer = Service("declarer", broker)
    declarer.declare(broker.topology.decision_control_spec())
    t = start(declarer)
    stop(declarer, t)
    for i in range(10):
        pub.publish(change(i))
    proc = subprocess.Popen([sys.executable, "-c", SHUTDOWN_SCRIPT, rabbit_url, broker.topology.prefix, str(out)],
                            env=env)
    try:
        wait_for(lambda: out.exists() and '"start"' in out.read_text(), 20, message="first message in hand")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    events = [json.loads(line) for line in out.read_text().splitlines()]
    started = [e["start"] for e in events if "start" in e]
    done = [e["done"] for e in events if "done" in e]
    assert started == done, "every message started was finished before exit"
    # the rest are still in the queue, none lost: a new consumer gets exactly the remainder
    rec = Recorder()
    svc = Service("decision", broker)
    svc.consume(broker.topology.decision_control_spec(), rec)
    t = start(svc)
    try:
        wait_for(lambda: rec.ids() | set(done) == {f"c{i}" for i in range(10)}, 15,
                 message="remaining messages delivered to the next consumer")
    finally:
        stop(svc, t)
        pub.close()
    assert not rec.ids() & set(done), "acked messages are not redelivered"


def test_metrics_and_health_endpoint(broker: Broker) -> None:
    svc = Service("decision", broker, settings=RuntimeSettings(metrics_port=0))
    rec = Recorder()
    svc.consume(broker.topology.decision_control_spec(), rec)
    t = start(svc)
    try:
        port = svc._health_server.port
        svc.publish(change(1))
        wait_for(lambda: rec.ids(), 10)
        health = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5).read())
        assert health["healthy"] is True and health["connected"] is True
        assert "guest:***@" in health["broker"]
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert 'epu_messages_consumed_total{outcome="ok"' in metrics or "epu_messages_consumed_total{" in metrics
        assert "epu_broker_connected 1.0" in metrics
    finally:
        stop(svc, t)


def _old_store(tmp_path: Path) -> Path:
    """A database an older release made: this release's code reads a column it lacks."""
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE instances (instance_id TEXT PRIMARY KEY, state TEXT)")
    return path


def _healthz(port: int) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_a_permanent_infrastructure_error_stops_the_consumer_with_one_line_and_an_unhealthy_healthz(
        broker: Broker, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 26, defect 9. Was: every ``sqlite3.OperationalError`` counted as "the database is
    away" and was retried in place forever — a schema older than the code ("no such column")
    blocked the queue behind it, with a warning per attempt and ``/healthz`` green. Now the
    message goes back to its queue (nothing lost), the consumer stops, one error line says why
    and ``/healthz`` answers 503 with the reason; the service's other work goes on."""
    path = _old_store(tmp_path)
    calls: list[str] = []
    ticks: list[float] = []

    def handler(msg: PolicyChange, env: Envelope) -> None:
        calls.append(msg.change_id)
        with sqlite3.connect(path) as conn:
            conn.execute("SELECT removed FROM instances").fetchall()

    svc = Service("decision", broker, settings=RuntimeSettings(metrics_port=0, retry_base_seconds=0.01,
                                                               retry_max_seconds=0.05))
    svc.consume(broker.topology.decision_control_spec(), handler, prefetch=5)
    svc.every(0.05, lambda: ticks.append(time.monotonic()), name="tick")
    queue = broker.topology.n("epu.decision.control")
    caplog.set_level(logging.WARNING, logger="epu.decision")
    t = start(svc)
    try:
        port = svc._health_server.port
        for i in range(3):
            svc.publish(change(i))
        status, health = wait_for(lambda: (h := _healthz(port))[0] == 503 and h, 15,
                                  message="/healthz unhealthy")
        assert health["status"] == "failed" and health["consumers"][queue] == "stopped"
        assert "no such column: removed" in health["stopped"][queue]
        wait_for(lambda: queue_depth(broker, queue) == 3, 15, message="every message back in its queue")
        assert calls == ["c0"], "tried once: no retry cures it"
        before = len(ticks)
        wait_for(lambda: len(ticks) > before + 3, 5, message="the service's timers go on")
    finally:
        stop(svc, t)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "no such column: removed" in errors[0].getMessage()
    assert not [r for r in caplog.records if "retrying" in r.getMessage()]


def test_a_periodic_task_failing_permanently_stops_and_fails_healthz(broker: Broker, tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    path = _old_store(tmp_path)
    runs: list[int] = []

    def iterate() -> None:
        runs.append(1)
        with sqlite3.connect(path) as conn:
            conn.execute("SELECT removed FROM instances").fetchall()

    svc = Service("decision", broker)
    svc.every(0.02, iterate, name="iterate")
    caplog.set_level(logging.WARNING, logger="epu.decision")
    t = start(svc)
    try:
        health = wait_for(lambda: svc.health().get("stopped"), 10, message="the task stopped")
        assert "no such column" in health["timer iterate"] and not svc.health()["healthy"]
        assert runs == [1]
    finally:
        stop(svc, t)
    assert len([r for r in caplog.records if r.levelno >= logging.ERROR]) == 1


def test_periodic_timers_fire_between_deliveries(broker: Broker) -> None:
    ticks: list[float] = []
    svc = Service("sensor", broker)
    svc.every(0.05, lambda: ticks.append(time.monotonic()), name="tick")
    t = start(svc)
    try:
        wait_for(lambda: len(ticks) >= 5, 5, message="5 timer runs")
    finally:
        stop(svc, t)


def test_single_active_consumer_delivers_to_one_engine_only(broker: Broker) -> None:
    a, b = Recorder(), Recorder()
    sa, sb = Service("decision-a", broker), Service("decision-b", broker)
    sa.consume(broker.topology.decision_control_spec(), a)
    sb.consume(broker.topology.decision_control_spec(), b)
    ta = start(sa)
    tb = start(sb)
    try:
        for i in range(20):
            sa.publish(change(i))
        wait_for(lambda: len(a.ids()) + len(b.ids()) == 20, 10)
        assert (len(a.ids()), len(b.ids())) in ((20, 0), (0, 20)), "only the active consumer receives"
        active, standby, s_active = (a, b, sa) if a.ids() else (b, a, sb)
        stop(s_active, ta if s_active is sa else tb)
        for i in range(20, 25):
            (sb if s_active is sa else sa).publish(change(i))
        wait_for(lambda: len(standby.ids()) == 5, 15, message="standby took over")
    finally:
        for s, t in ((sa, ta), (sb, tb)):
            if t.is_alive():
                stop(s, t)


def _connections(vhost: str) -> list[str]:
    out = rabbitmqctl("list_connections", "-q", "--no-table-headers", "peer_port", "vhost").stdout
    return sorted(line.split()[0] for line in out.splitlines() if line.strip().endswith(vhost))


def test_heartbeats_are_serviced_while_a_handler_and_a_timer_block(broker: Broker, rabbit_vhost: str) -> None:
    """A 2 s heartbeat; a handler that works 9 s (a node command) and a timer that works 7 s (a
    batch poll): the connection survives both, nothing is redelivered, nothing reconnects."""
    short = Broker(broker.url, broker.topology, heartbeat=2)
    calls: list[str] = []
    svc = Service("sensor", short)

    def handler(msg: PolicyChange, env: Envelope) -> None:
        calls.append(msg.change_id)
        if msg.change_id == "slow":
            time.sleep(9)  # the work itself: what the handler does, not a wait for a condition

    polls: list[float] = []

    def slow_poll() -> None:
        polls.append(time.monotonic())
        if len(polls) == 1:
            time.sleep(7)

    svc.consume(broker.topology.decision_control_spec(), handler, prefetch=5)
    svc.every(30, slow_poll, name="poll", initial_delay=0)
    t = start(svc)
    pub = Publisher(short, "test")
    try:
        before = _connections(rabbit_vhost)
        pub.publish(change(0).model_copy(update={"change_id": "slow"}))
        pub.publish(change(1))
        wait_for(lambda: calls == ["slow", "c1"], 40, message="both handled")
        wait_for(lambda: queue_depth(broker, broker.topology.n("epu.decision.control")) == 0, 10)
        assert svc.metrics.connection_losses._value.get() == 0, "no missed-heartbeat disconnect"
        assert svc.reconnect_count == 0 and len(polls) == 1
        assert set(before) <= set(_connections(rabbit_vhost)), "the same connections are still open"
    finally:
        stop(svc, t)
        pub.close()
    assert calls == ["slow", "c1"], "nothing was redelivered"


def test_an_idle_publisher_keeps_its_connection(broker: Broker, rabbit_vhost: str,
                                                caplog: pytest.LogCaptureFixture) -> None:
    """The publisher negotiates heartbeats: it must send them (and read the broker's) while idle."""
    short = Broker(broker.url, broker.topology, heartbeat=2)
    declarer = Service("declarer", broker)
    declarer.declare(broker.topology.decision_control_spec())
    stop(declarer, start(declarer))
    pub = Publisher(short, "test")
    try:
        pub.publish(change(1))
        conn_before = pub._conn
        ports = _connections(rabbit_vhost)
        time.sleep(8)  # the idle gap itself (4 heartbeat intervals) is the scenario
        assert _connections(rabbit_vhost) == ports, "the broker kept the idle publisher's connection"
        with caplog.at_level(logging.WARNING, logger="epu.broker"):
            pub.publish(change(2))
        assert pub._conn is conn_before
        assert not [r for r in caplog.records if "retrying" in r.getMessage()]
    finally:
        pub.close()


def test_store_errors_for_a_few_seconds_lose_nothing_and_keep_order(broker: Broker) -> None:
    """An infrastructure error (the database failing over) is retried in place until it passes:
    nothing dead-lettered, every message handled once, in order."""
    from sqlalchemy.exc import OperationalError

    handled: list[int] = []
    failing_until = [0.0]

    def handler(msg: PolicyChange, env: Envelope) -> None:
        if not failing_until[0]:
            failing_until[0] = time.monotonic() + 3.0
        if time.monotonic() < failing_until[0]:
            raise OperationalError("INSERT ...", {}, ConnectionRefusedError("server closed the connection"))
        handled.append(msg.min_nodes)

    svc = Service("decision", broker, settings=RuntimeSettings(max_attempts=3, retry_base_seconds=0.1,
                                                              retry_max_seconds=0.5))
    svc.consume(broker.topology.decision_control_spec(), handler, prefetch=10)
    t = start(svc)
    try:
        for i in range(40):
            svc.publish(change(i))
        wait_for(lambda: len(handled) == 40, 30, message="all 40 handled after the outage")
        assert svc.metrics.handler_retries.labels(broker.topology.n("epu.decision.control"),
                                                  "transient")._value.get() >= 5
    finally:
        stop(svc, t)
    assert handled == list(range(40))
    assert queue_depth(broker, broker.topology.n("epu.dead")) == 0
