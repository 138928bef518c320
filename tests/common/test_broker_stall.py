"""A broker that keeps the connection open but stops answering (issue 34): the runtime does not
sit silent on it. Between the client and the real RabbitMQ, a proxy holds back what the broker
sends on its channels while passing its heartbeats — what a client sees of RabbitMQ out of file
handles, where a queue.declare never returns. Before the deadline (``common.stall``), the demo's
tap authenticated and then said nothing for 90 s, until the broker dropped it for missed
heartbeats, its /healthz saying only "waiting for broker"."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from epu.common.broker import Broker, Publisher
from epu.common.messages import Envelope, PolicyChange
from epu.common.observability import ServiceMetrics
from epu.common.runtime import RuntimeSettings, Service, run_in_thread
from epu.common.stall import BrokerStalled, bounded
from epu.common.tap import follow
from epu.common.testing import queue_depth, wait_for
from epu.common.topology import DECISION_CONTROL_QUEUE

from tests.conftest import RABBIT_ADMIN, RABBIT_HOST
from tests.support.tcpproxy import TcpProxy

pytestmark = pytest.mark.rabbitmq

DEADLINE = 2.0
"""The tests' call_timeout (production: 30 s): the broker's own heartbeat check (30 s heartbeats)
would drop a silent client only after 60-90 s, so noticing within seconds is the runtime's doing."""


@pytest.fixture
def proxy():
    host, port = RABBIT_HOST.split(":")
    p = TcpProxy(host, int(port), amqp=True).start()
    yield p
    p.stop()


def held(proxy: TcpProxy, broker: Broker, vhost: str) -> Broker:
    return Broker(f"amqp://{RABBIT_ADMIN}@127.0.0.1:{proxy.port}/{vhost}", broker.topology, call_timeout=DEADLINE)


def stalls(metrics: ServiceMetrics) -> float:
    return metrics.registry.get_sample_value("epu_broker_stalls_total") or 0.0


def test_a_service_whose_broker_stops_answering_says_so_and_comes_back(broker: Broker, rabbit_vhost: str,
                                                                        proxy: TcpProxy) -> None:
    proxy.hold_replies()  # the handshake (channel 0) completes; channel.open-ok never comes
    seen: list[str] = []
    svc = Service("decision", held(proxy, broker, rabbit_vhost),
                  settings=RuntimeSettings(reconnect_initial=0.1, reconnect_max=0.5))
    svc.consume(broker.topology.decision_control_spec(), lambda m, e: seen.append(m.change_id))
    thread = run_in_thread(svc)
    direct = Publisher(broker, "test")
    try:
        started = time.monotonic()
        doc = wait_for(lambda: "did not answer" in ((h := svc.health()).get("last_error") or "") and h,
                       DEADLINE + 8, message="the stall named on /healthz")
        assert time.monotonic() - started < DEADLINE + 8
        assert "channel.open" in doc["last_error"] and doc["healthy"] is False and doc["connected"] is False
        assert doc["error_kind"] == "transient"
        assert stalls(svc.metrics) >= 1
        assert thread.is_alive()

        proxy.release_replies()  # the broker answers again: the service connects and serves
        assert svc.wait_ready(20)
        direct.publish(PolicyChange(change_id="after-the-stall", domain="alpha"))
        wait_for(lambda: seen == ["after-the-stall"], 15, message="the message consumed")
    finally:
        svc.stop()
        thread.join(15)
        direct.close()
    assert not thread.is_alive()


def test_a_publish_on_a_stalled_broker_moves_to_a_new_connection_and_is_confirmed(
        broker: Broker, rabbit_vhost: str, proxy: TcpProxy) -> None:
    with broker.connection() as conn:
        broker.topology.declare(conn.channel(), [broker.topology.decision_control_spec()])
    metrics = ServiceMetrics("t")
    pub = Publisher(held(proxy, broker, rabbit_vhost), "test", metrics=metrics)
    proxy.hold_replies()
    done: dict[str, Envelope | BaseException] = {}

    def publish() -> None:
        try:
            done["env"] = pub.publish(PolicyChange(change_id="through-a-stall", domain="alpha"))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            done["env"] = exc

    t = threading.Thread(target=publish, daemon=True)
    t.start()
    try:
        wait_for(lambda: stalls(metrics) >= 1, DEADLINE + 8, message="the stalled channel.open given up")
        assert t.is_alive(), "still retrying on new connections, not failed"
        proxy.release_replies()
        t.join(30)
        assert isinstance(done.get("env"), Envelope), done
        assert queue_depth(broker, broker.topology.n(DECISION_CONTROL_QUEUE)) == 1, "confirmed once"
    finally:
        pub.close()


def test_a_tap_on_a_stalled_broker_fails_with_the_reason(broker: Broker, rabbit_vhost: str,
                                                          proxy: TcpProxy) -> None:
    proxy.hold_replies()
    started = time.monotonic()
    with pytest.raises(BrokerStalled, match="did not answer channel.open, queue.declare and basic.consume"):
        follow(held(proxy, broker, rabbit_vhost), "#", lambda *a: None, stop=lambda: False, seconds=60)
    assert time.monotonic() - started < DEADLINE + 8


def test_epu_tap_on_a_stalled_broker_exits_with_one_line(broker: Broker, rabbit_vhost: str, proxy: TcpProxy,
                                                        tmp_path: Path) -> None:
    config = tmp_path / "epu.toml"
    config.write_text(f'[broker]\nurl = "amqp://{RABBIT_ADMIN}@127.0.0.1:{proxy.port}/{rabbit_vhost}"\n'
                      f'prefix = "{broker.topology.prefix}"\ncall_timeout = {DEADLINE}\n')
    proxy.hold_replies()
    res = subprocess.run([sys.executable, "-m", "epu.cli", "tap", "-c", str(config), "--seconds", "60"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1, res.stderr
    assert res.stderr.strip().splitlines() == [
        f"epu: RabbitMQ at amqp://guest:***@127.0.0.1:{proxy.port}/{rabbit_vhost}: the broker did not answer "
        f"channel.open, queue.declare and basic.consume of the tap within {DEADLINE:g} s (connection open, no reply: "
        f"is it out of file handles? docs/deploy.md, 'The broker's file handles')"], res.stderr


def test_a_deadline_that_does_not_pass_changes_nothing(broker: Broker) -> None:
    fired: list[str] = []
    with broker.connection() as conn:
        with bounded(conn, 10.0, "a quick declare", fired.append):
            broker.topology.declare(conn.channel(), [])
        assert conn.connected and fired == []
    with bounded(Broker("memory://").connection(), 0.01, "memory://", fired.append):
        time.sleep(0.05)  # memory:// has no socket to watch: no deadline
    assert fired == []
