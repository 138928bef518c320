"""The report a failed connect to the machine's RabbitMQ carries (tests/support/brokerdiag.py):
it must say what the broker answered, and the hook must attach it to the failing test."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from epu.common.broker import BrokerUnavailable

from tests.conftest import RABBIT_HOST, _host_port
from tests.support.brokerdiag import amqp_greeting, broker_diagnosis, is_unreachable_broker

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.rabbitmq
def test_the_live_broker_is_reported_greeting_without_alarms_with_its_descriptors() -> None:
    report = broker_diagnosis(*_host_port(RABBIT_HOST))
    assert "== AMQP greeting\nConnection.Start frame after" in report
    assert "no alarms" in report
    assert "File Descriptors" in report and "Sockets:" in report
    # RabbitMQ's count, reservations of quorum queues included: what ran out in issue 34
    assert "== file-handle budget\nfile handles " in report and " in use, sockets " in report
    assert "== busiest processes\nPID" in report


def test_a_listener_that_never_greets_is_a_timeout_and_a_closed_port_a_refusal() -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)  # the kernel completes the connect; nobody ever answers
        assert amqp_greeting("127.0.0.1", silent.getsockname()[1], timeout=0.3).startswith("TimeoutError after")
        port = silent.getsockname()[1]
    assert amqp_greeting("127.0.0.1", port, timeout=0.3).startswith("ConnectionRefusedError after")


def test_only_an_unreachable_broker_asks_for_the_report() -> None:
    assert is_unreachable_broker(BrokerUnavailable("cannot reach the broker: amqp://x: TimeoutError"))
    assert not is_unreachable_broker(TimeoutError("a wait_for on something else"))


@pytest.mark.rabbitmq
def test_the_first_test_that_cannot_reach_the_broker_carries_the_report(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text("from tests.conftest import pytest_runtest_makereport  # noqa: F401\n")
    (tmp_path / "test_two_failures.py").write_text(
        "from epu.common.broker import BrokerUnavailable\n"
        "def test_one():\n    raise BrokerUnavailable('cannot reach the broker: amqp://h: TimeoutError')\n"
        "def test_two():\n    raise BrokerUnavailable('cannot reach the broker: amqp://h: TimeoutError')\n"
        "def test_other():\n    assert False, 'not about the broker'\n")
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "3 failed" in res.stdout, res.stdout[-3000:]
    assert res.stdout.count("RabbitMQ when the broker could not be reached") == 1  # once per session
    one = res.stdout.index("_ test_one _")
    two = res.stdout.index("_ test_two _")
    assert one < res.stdout.index("== AMQP greeting") < two
