"""One process, one fate (issue 12: "the context broker goes half-dead").

Before: when the AMQP consumer's thread ended (a connection error it did not survive, a poison
message), the HTTPS server kept the process up and its /healthz said ok, while terminated
instances piled up unread and gone nodes never left their contexts. Now /healthz follows the
consumer, and a consumer that ends under the server stops the whole process with a non-zero
status, for systemd to restart it whole."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import pytest
from epu.common.broker import Broker
from epu.common.runtime import Service
from epu.common.testing import wait_for
from epu.common.topology import Topology
from epu.services.ctxbroker.app import CtxBrokerService
from epu.services.ctxbroker.server import BrokerServer, ServerSettings

from tests.ctxbroker.conftest import ADMIN_TOKEN


def _service(broker: Broker, sqlite_url: str, tls_files: tuple[str, str]) -> CtxBrokerService:
    server = BrokerServer(ServerSettings("127.0.0.1", 0, tls_files[0], tls_files[1], ADMIN_TOKEN, sqlite_url))
    return CtxBrokerService(server, Service("ctxbroker", broker))


def _health(svc: CtxBrokerService, ca: str) -> httpx.Response:
    return httpx.get(f"{svc.server.public_url}/healthz", verify=__import__("ssl").create_default_context(cafile=ca))


@pytest.fixture
def running(broker: Broker, sqlite_url: str, tls_files: tuple[str, str]) -> Iterator[CtxBrokerService]:
    svc = _service(broker, sqlite_url, tls_files)
    svc.start_in_thread()
    yield svc
    svc.close()


def test_healthz_is_ok_only_while_the_consumer_consumes(running: CtxBrokerService,
                                                        tls_files: tuple[str, str]) -> None:
    assert running.service.wait_ready(15)
    r = wait_for(lambda: (resp := _health(running, tls_files[0])).status_code == 200 and resp,
                 message="healthz 200 once consuming")
    doc = r.json()
    assert doc["ok"] is True and doc["amqp"]["connected"] is True


def test_healthz_is_503_while_the_consumer_cannot_reach_rabbitmq(sqlite_url: str, tls_files: tuple[str, str],
                                                                 prefix: str) -> None:
    nowhere = Broker("amqp://guest:guest@127.0.0.1:1//", Topology(prefix=prefix))
    svc = _service(nowhere, sqlite_url, tls_files)
    svc.start_in_thread()
    try:
        r = _health(svc, tls_files[0])
        assert r.status_code == 503
        assert r.json()["ok"] is False and r.json()["amqp"]["connected"] is False
    finally:
        svc.close()


@pytest.mark.parametrize("how", ["raises", "returns"])
def test_a_consumer_that_dies_takes_the_process_down_with_status_1(
        how: str, broker: Broker, sqlite_url: str, tls_files: tuple[str, str]) -> None:
    """Whatever ends the runtime's loop under the server (a fault it does not survive, or a
    return while nobody asked it to stop), the whole process stops with status 1."""
    svc = _service(broker, sqlite_url, tls_files)
    calls = {"n": 0}

    def run_then_end() -> None:
        calls["n"] += 1
        def answering() -> bool:
            try:
                return _health(svc, tls_files[0]).status_code in (200, 503)
            except (httpx.HTTPError, RuntimeError):  # not listening yet (or no port chosen yet)
                return False

        wait_for(answering, 15, interval=0.05, message="the HTTPS server up: it must be stopped, not never started")
        if how == "raises":
            raise RuntimeError("a fault the runtime does not survive")

    svc.service.run = run_then_end  # type: ignore[method-assign]
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            svc.run()
            outcome["exit"] = 0
        except SystemExit as exc:
            outcome["exit"] = exc.code

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive(), "the broker kept serving after its consumer died"
    assert outcome["exit"] == 1 and calls["n"] == 1
    assert svc.consumer_failure and ("RuntimeError" in svc.consumer_failure if how == "raises"
                                     else "stopped by itself" in svc.consumer_failure)
