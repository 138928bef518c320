"""Broker loss, at start and any number of times later, with a TCP proxy the test controls between
the service and the real RabbitMQ: the service stays up, says so on /healthz (503 with a JSON
body), reconnects, fails over across a URL list, and loses nothing that was confirmed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from epu.common.broker import Broker, Publisher
from epu.common.messages import Envelope, PolicyChange
from epu.common.runtime import RuntimeSettings, Service, run_in_thread
from epu.common.testing import wait_for
from epu.common.topology import Topology

from tests.conftest import RABBIT_ADMIN, RABBIT_HOST
from tests.support.tcpproxy import TcpProxy

pytestmark = pytest.mark.rabbitmq
ROOT = Path(__file__).resolve().parents[2]


def health(port: int) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def proxy_url(proxy: TcpProxy, vhost: str) -> str:
    return f"amqp://{RABBIT_ADMIN}@127.0.0.1:{proxy.port}/{vhost}"


@pytest.fixture
def proxy():
    host, port = RABBIT_HOST.split(":")
    p = TcpProxy(host, int(port))
    yield p
    p.stop()


class Seen:
    def __init__(self) -> None:
        self.ids: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, msg: PolicyChange, env: Envelope) -> None:
        with self.lock:
            self.ids.append(msg.change_id)

    def set(self) -> set[str]:
        with self.lock:
            return set(self.ids)


def test_service_starts_without_broker_waits_and_survives_repeated_losses(broker: Broker, rabbit_vhost: str,
                                                                         proxy: TcpProxy) -> None:
    via_proxy = Broker(proxy_url(proxy, rabbit_vhost), broker.topology, heartbeat=2)
    seen = Seen()
    svc = Service("decision", via_proxy, settings=RuntimeSettings(metrics_port=0, reconnect_initial=0.1,
                                                                  reconnect_max=0.5))
    svc.consume(broker.topology.decision_control_spec(), seen, prefetch=5)
    thread = run_in_thread(svc)
    direct = Publisher(broker, "test")
    try:
        port = wait_for(lambda: svc._health_server and svc._health_server.port, 5, message="health endpoint")
        code, doc = wait_for(lambda: (h := health(port))[1].get("last_error") and h, 10,
                             message="a failed attempt to connect")
        assert doc["status"] == "waiting for broker"
        assert code == 503 and doc["healthy"] is False and doc["connected"] is False
        assert "cannot reach the broker" in doc["last_error"] and "guest:***@" in doc["last_error"]
        assert thread.is_alive()

        proxy.start()  # the broker appears
        assert svc.wait_ready(15)
        code, doc = wait_for(lambda: (h := health(port))[0] == 200 and h, 10, message="healthy")
        assert doc["consumers"] == {broker.topology.n("epu.decision.control"): "consuming"}

        sent: list[str] = []
        for loss in range(5):  # lose the broker five times, with messages in flight
            for i in range(20):
                cid = f"c{loss}-{i}"
                direct.publish(PolicyChange(change_id=cid, domain="alpha"))  # confirmed, not via the proxy
                sent.append(cid)
            proxy.stop()
            code, doc = wait_for(lambda: (h := health(port))[0] == 503 and h, 10, message="unhealthy after loss")
            assert doc["status"] in ("reconnecting", "serving")
            proxy.start()
            wait_for(lambda n=loss: svc.reconnect_count == n + 1 and svc.connected, 20,
                     message=f"reconnect #{loss + 1}")
        wait_for(lambda: set(sent) <= seen.set(), 30, message="every confirmed message consumed")
        assert thread.is_alive()
        code, doc = health(port)
        assert code == 200 and doc["reconnects"] == 5
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert "epu_broker_reconnects_total 5.0" in metrics
        assert "epu_broker_connection_losses_total 5.0" in metrics
        assert 'epu_consumer_up{queue="' in metrics
    finally:
        svc.stop()
        thread.join(15)
        direct.close()
    assert not thread.is_alive()


def test_failover_to_the_next_url_when_a_node_goes(broker: Broker, rabbit_vhost: str) -> None:
    host, port = RABBIT_HOST.split(":")
    a, b = TcpProxy(host, int(port)).start(), TcpProxy(host, int(port)).start()
    dead = TcpProxy(host, int(port))  # never started: connection refused
    urls = (proxy_url(dead, rabbit_vhost), proxy_url(a, rabbit_vhost), proxy_url(b, rabbit_vhost))
    multi = Broker(urls, broker.topology)
    seen = Seen()
    svc = Service("decision", multi, settings=RuntimeSettings(reconnect_initial=0.1, reconnect_max=0.5))
    svc.consume(broker.topology.decision_control_spec(), seen)
    thread = run_in_thread(svc)
    pub = Publisher(multi, "test")
    try:
        assert svc.wait_ready(15)
        assert multi.current_url.endswith(f":{a.port}/{rabbit_vhost}"), "the dead first URL was skipped"
        pub.publish(PolicyChange(change_id="before", domain="alpha"))
        a.stop()  # the node everyone is connected to goes away
        wait_for(lambda: svc.reconnect_count == 1 and svc.connected, 15, message="failed over")
        assert multi.current_url.endswith(f":{b.port}/{rabbit_vhost}")
        pub.publish(PolicyChange(change_id="after", domain="alpha"))  # the publisher fails over too
        wait_for(lambda: seen.set() == {"before", "after"}, 15, message="both messages consumed")
        assert svc.metrics.reconnect_seconds._value.get() < 5
    finally:
        svc.stop()
        thread.join(15)
        pub.close()
        a.stop()
        b.stop()


CONFIGS = {
    "decision": """
[decision]
store_url = "sqlite:///{tmp}/decision.db"
metrics_port = {metrics}
[domains.alpha]
max_nodes = 2
sites = ["s1"]
[sites.s1]
driver = "epu-sim"
""",
    "sensor": """
[sensor]
domain = "alpha"
backend = "simulated"
metrics_port = {metrics}
poll_seconds = 1
""",
    "provisioner": """
[provisioner]
store_url = "sqlite:///{tmp}/provisioner.db"
metrics_port = {metrics}
[sites.s1]
driver = "epu-sim"
[sites.s1.driver_args]
path = "{tmp}/cloud.db"
""",
}


@pytest.mark.parametrize("service", sorted(CONFIGS))
def test_epu_run_waits_for_the_broker_and_survives_its_loss(service: str, rabbit_vhost: str, prefix: str,
                                                            proxy: TcpProxy, tmp_path: Path) -> None:
    """The interface: ``epu run SERVICE`` with the broker unreachable stays up, /healthz 503
    "waiting for broker", until it connects; then a broker loss is survived too."""
    metrics = TcpProxy._free_port()
    cfg = tmp_path / "epu.toml"
    cfg.write_text(f'[broker]\nurl = "{proxy_url(proxy, rabbit_vhost)}"\nprefix = "{prefix}"\nheartbeat = 4\n'
                   + CONFIGS[service].format(tmp=tmp_path, metrics=metrics))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env = {k: v for k, v in env.items() if not k.startswith("EPU_")}
    log = open(tmp_path / "service.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([sys.executable, "-m", "epu", "run", service, "-c", str(cfg)], env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        code, doc = wait_for(lambda: _try_health(metrics), 30, message="health endpoint up")
        assert code == 503 and doc["status"] == "waiting for broker", doc
        assert proc.poll() is None
        proxy.start()
        wait_for(lambda: (_try_health(metrics) or (0,))[0] == 200, 30, message="connected and healthy")
        proxy.stop()
        code, doc = wait_for(lambda: (h := _try_health(metrics)) and h[0] == 503 and h, 20,
                             message="unhealthy after the loss")
        assert proc.poll() is None, "the service outlived its broker connection"
        proxy.start()
        code, doc = wait_for(lambda: (h := _try_health(metrics)) and h[0] == 200 and h, 30,
                             message="healthy again")
        assert doc["reconnects"] == 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        log.close()
    text = (tmp_path / "service.log").read_text()
    assert "Traceback" not in text, text[-3000:]


def _try_health(port: int) -> tuple[int, dict] | None:
    try:
        return health(port)
    except (OSError, ValueError):
        return None


def test_connection_errors_never_propagate_from_the_reconnect_loop(rabbit_vhost: str, prefix: str) -> None:
    """The exact failure of the issue: kombu's OperationalError out of ensure_connection ended
    run(). Here a URL that refuses, then one that times out (a blackhole), then a bad password:
    the service keeps waiting, with the reason in its health."""
    host, port = RABBIT_HOST.split(":")
    urls = [f"amqp://guest:guest@127.0.0.1:{TcpProxy._free_port()}/{rabbit_vhost}",
            f"amqp://guest:wrong-password@{host}:{port}/{rabbit_vhost}"]
    svc = Service("sensor", Broker(urls, Topology(prefix=prefix), connect_timeout=1),
                  settings=RuntimeSettings(reconnect_initial=0.05, reconnect_max=0.2))
    svc.every(0.1, lambda: None)
    thread = run_in_thread(svc)
    try:
        wait_for(lambda: svc.metrics.connect_failures._value.get() >= 3, 20, message="several failed attempts")
        doc = svc.health()
        assert thread.is_alive() and doc["status"] == "waiting for broker"
        assert "ConnectionRefusedError" in doc["last_error"] and "ACCESS_REFUSED" in doc["last_error"]
        assert "wrong-password" not in json.dumps(doc)
    finally:
        svc.stop()
        thread.join(10)
    assert not thread.is_alive()
