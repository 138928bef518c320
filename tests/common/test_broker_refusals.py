"""A service the broker refuses for good exits; one the broker cannot serve yet keeps trying (issue 27).

Before: a wrong password, a user without permission, a vhost that does not exist logged
"waiting for broker" forever, so under systemd the unit stayed active and ``Restart=`` never
fired, while ``epu run --help`` promised exit status 1. Against the real RabbitMQ.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from epu.common.broker import Broker, BrokerRefused, TlsSettings
from epu.common.runtime import RuntimeSettings, Service
from epu.common.testing import wait_for
from epu.common.topology import Topology

from tests.conftest import RABBIT_HOST, rabbitmqctl

pytestmark = pytest.mark.rabbitmq
ROOT = Path(__file__).resolve().parents[2]


def fast(attempts: int) -> RuntimeSettings:
    return RuntimeSettings(reconnect_initial=0.05, reconnect_max=0.2, permanent_attempts=attempts, permanent_seconds=0.5,
                           metrics_port=0)


@pytest.fixture
def user(rabbit_vhost: str) -> Iterator[tuple[str, str]]:
    """A RabbitMQ user of its own, with no permission anywhere yet."""
    name, password = f"ops-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    rabbitmqctl("add_user", name, password)
    yield name, password
    rabbitmqctl("delete_user", name, check=False)


def service(url: str, prefix: str, attempts: int, tls: TlsSettings | None = None) -> Service:
    svc = Service("refusal-test", Broker(url, Topology(prefix=prefix), tls=tls or TlsSettings(), connect_timeout=20),
                  settings=fast(attempts))
    svc.consume(svc.broker.topology.provisioner_spec(), lambda m, e: None)
    return svc


def refused_kind(svc: Service, timeout: float = 60) -> str:
    """Run ``svc`` to its end; the kind of refusal it gave up on."""
    out: list[BaseException] = []

    def go() -> None:
        try:
            svc.run()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out.append(exc)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        svc.stop()
        t.join(30)
        raise AssertionError(f"still retrying after {timeout}s: {svc.health()}")
    assert out and isinstance(out[0], BrokerRefused), out
    return out[0].kind


def test_a_wrong_password_is_given_up(rabbit_vhost: str, prefix: str) -> None:
    user, password = os.environ.get("EPU_TEST_RABBIT_ADMIN", "guest:guest").split(":")
    svc = service(f"amqp://{user}:wrong-{password}@{RABBIT_HOST}/{rabbit_vhost}", prefix, 3)
    assert refused_kind(svc) == "authentication"


def test_a_user_without_permission_on_the_vhost_is_given_up(user: tuple[str, str], rabbit_vhost: str,
                                                             prefix: str) -> None:
    name, password = user
    assert refused_kind(service(f"amqp://{name}:{password}@{RABBIT_HOST}/{rabbit_vhost}", prefix, 3)) == "permission"


def test_a_user_without_permission_on_its_queue_is_given_up(user: tuple[str, str], rabbit_vhost: str,
                                                            prefix: str) -> None:
    """In the vhost, but neither configure nor read on the queue: refused on declare/consume."""
    name, password = user
    rabbitmqctl("set_permissions", "-p", rabbit_vhost, name, "^$", "^$", "^$")
    assert refused_kind(service(f"amqp://{name}:{password}@{RABBIT_HOST}/{rabbit_vhost}", prefix, 3)) == "permission"


def test_a_vhost_that_does_not_exist_is_given_up(prefix: str) -> None:
    admin = os.environ.get("EPU_TEST_RABBIT_ADMIN", "guest:guest")
    svc = service(f"amqp://{admin}@{RABBIT_HOST}/no-such-vhost-{uuid.uuid4().hex[:6]}", prefix, 3)
    assert refused_kind(svc) == "vhost"


def test_an_unreadable_tls_certificate_is_given_up(tmp_path: Path, prefix: str) -> None:
    admin = os.environ.get("EPU_TEST_RABBIT_ADMIN", "guest:guest")
    svc = service(f"amqps://{admin}@{RABBIT_HOST}/", prefix, 3, TlsSettings(ca_file=str(tmp_path / "absent.pem")))
    assert refused_kind(svc) == "tls"
    assert "absent.pem" in svc.health()["last_error"], "the message names the file"


def test_healthz_says_permanent_while_it_retries_and_transient_for_an_unreachable_broker(
        rabbit_vhost: str, prefix: str) -> None:
    user, password = os.environ.get("EPU_TEST_RABBIT_ADMIN", "guest:guest").split(":")
    cases = ((f"amqp://{user}:wrong@{RABBIT_HOST}/{rabbit_vhost}", "permanent (authentication)"),
             (f"amqp://{user}:{password}@127.0.0.1:1/{rabbit_vhost}", "transient"))
    for url, kind in cases:
        svc = service(url, prefix, 10_000)
        t = threading.Thread(target=svc.run, daemon=True)
        t.start()
        try:
            port = wait_for(lambda s=svc: s._health_server and s._health_server.port, 10)

            def seen(port: int = port, kind: str = kind) -> dict | None:
                r = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
                doc = r.json()
                return doc if r.status_code == 503 and doc["error_kind"] == kind else None

            doc = wait_for(seen, 30, interval=0.1, message=f"/healthz error_kind {kind}")
            assert "wrong" not in doc["last_error"] and "wrong" not in str(doc["broker"]), "no password shown"
            # a transient failure never ends the service: it is still retrying after many attempts
            wait_for(lambda s=svc: s.metrics.connect_failures._value.get() >= 5, 30)
            assert t.is_alive()
        finally:
            svc.stop()
            t.join(30)
        assert not t.is_alive()


def test_epu_run_exits_1_with_one_line(tmp_path: Path, rabbit_vhost: str) -> None:
    """What systemd sees: the process ends, exit status 1, one line saying what to fix."""
    user, _ = os.environ.get("EPU_TEST_RABBIT_ADMIN", "guest:guest").split(":")
    cfg = tmp_path / "epu.toml"
    cfg.write_text(f'[broker]\nurl = "amqp://{user}:not-the-password@{RABBIT_HOST}/{rabbit_vhost}"\n'
                   f'[decision]\nstore_url = "sqlite:///{tmp_path}/d.db"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("EPU_")}
    env["PYTHONPATH"] = str(ROOT)
    res = subprocess.run([sys.executable, "-m", "epu", "run", "decision", "-c", str(cfg)], capture_output=True,
                         text=True, timeout=120, env=env, cwd=tmp_path)
    assert res.returncode == 1, res.stderr[-3000:]
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("epu: RabbitMQ at ") and re.search(r"refused this service \(authentication refused "
                                                              r"\d+ times in a row", last), last
    assert "check the user name and password" in last
    assert "not-the-password" not in res.stderr and "Traceback" not in res.stderr
