"""What the suite asks of the shared RabbitMQ (issue 34; tests/conftest.py): a vhost per module,
gone as soon as the module is done; classic queues unless a test is marked ``quorum``; and a
broker that stops completing handshakes stops the suite with one line, at its start or between
modules, instead of failing every later test on its own timeout.

Each test runs a small pytest session of its own (the suite's conftest as a plugin) on the real
broker, or on the real broker behind a proxy that stops greeting new connections — what a
RabbitMQ out of file handles does."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from epu.common.testing import wait_for

from tests.conftest import RABBIT_HOST, rabbitmqctl
from tests.support.tcpproxy import TcpProxy

pytestmark = pytest.mark.rabbitmq
ROOT = Path(__file__).resolve().parents[2]
HOST, PORT = RABBIT_HOST.rsplit(":", 1)[0], int(RABBIT_HOST.rsplit(":", 1)[1])

MODULE_A = '''
import os
from pathlib import Path

import pytest
from tests.conftest import rabbitmqctl

OUT = Path(os.environ["INNER_OUT"])


def queue_types(vhost):
    rows = rabbitmqctl("list_queues", "-q", "-p", vhost, "name", "type").stdout.splitlines()
    return {name: kind for name, kind in (r.split("\\t") for r in rows if "\\t" in r and r != "name\\ttype")}


def declare(broker):
    with broker.connection() as conn:
        broker.topology.declare(conn.channel(), [broker.topology.provisioner_spec()])
    return {broker.topology.n("epu.provisioner"), broker.topology.n("epu.dead")}


def test_classic_by_default(broker, rabbit_vhost):
    names = declare(broker)
    assert {n: t for n, t in queue_types(rabbit_vhost).items() if n in names} == dict.fromkeys(names, "classic")
    (OUT / "a").write_text(rabbit_vhost)


@pytest.mark.quorum
def test_quorum_when_marked(broker, rabbit_vhost):
    names = declare(broker)
    assert {n: t for n, t in queue_types(rabbit_vhost).items() if n in names} == dict.fromkeys(names, "quorum")
'''

MODULE_B = '''
import os
from pathlib import Path

from epu.common.testing import wait_for
from tests.conftest import rabbitmqctl

OUT = Path(os.environ["INNER_OUT"])


def test_the_previous_modules_vhost_is_gone(rabbit_vhost):
    before = (OUT / "a").read_text()
    assert rabbit_vhost != before
    wait_for(lambda: before not in rabbitmqctl("list_vhosts", "-q").stdout.split(), 60, interval=0.5,
             message="the first module's vhost deleted")
    (OUT / "b").write_text(rabbit_vhost)
'''

STALL_A = '''
import os
import time
from pathlib import Path


def test_uses_the_broker(broker):
    with broker.connection() as conn:
        broker.topology.declare(conn.channel(), [])
    out = Path(os.environ["INNER_OUT"])
    (out / "stall").write_text("now")  # the broker stalls between this module and the next
    deadline = time.monotonic() + 30
    while not (out / "stalled").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
'''

STALL_B = '''
def test_one(broker):
    raise AssertionError("must not run: the suite stopped before this module")


def test_two(broker):
    raise AssertionError("must not run")
'''


def inner_session(tmp_path: Path, modules: dict[str, str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    for name, text in modules.items():
        (tmp_path / name).write_text(text)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider", "-q", "--rootdir",
         str(tmp_path), *(str(tmp_path / n) for n in sorted(modules))],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT), "INNER_OUT": str(tmp_path), **env})


def test_each_module_has_a_vhost_of_its_own_gone_when_it_ends_with_classic_queues_unless_marked(
        tmp_path: Path) -> None:
    res = inner_session(tmp_path, {"test_a.py": MODULE_A, "test_b.py": MODULE_B}, {})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "3 passed" in res.stdout
    vhosts = rabbitmqctl("list_vhosts", "-q").stdout.split()
    made = [(tmp_path / m).read_text() for m in ("a", "b")]
    assert not set(made) & set(vhosts), "the session left its modules' vhosts behind"


def one_line(output: str, port: int) -> list[str]:
    return [line for line in output.splitlines()
            if f"RabbitMQ at 127.0.0.1:{port} did not complete an AMQP handshake" in line]


def test_a_broker_that_never_greets_stops_the_suite_at_its_start_with_one_line(tmp_path: Path) -> None:
    with TcpProxy(HOST, PORT, amqp=True) as proxy:
        proxy.hold_replies(greetings=True)
        started = time.monotonic()
        res = inner_session(tmp_path, {"test_b.py": STALL_B},
                            {"EPU_TEST_RABBIT_HOST": f"127.0.0.1:{proxy.port}", "EPU_TEST_BROKER_CHECK_SECONDS": "2"})
    assert res.returncode == 3, res.stdout[-3000:] + res.stderr[-2000:]
    lines = one_line(res.stdout + res.stderr, proxy.port)
    assert len(lines) == 1 and "at the start of the suite" in lines[0], res.stdout[-3000:]
    assert "must not run" not in res.stdout and " failed" not in res.stdout and " error" not in res.stdout
    assert time.monotonic() - started < 60


def test_a_broker_that_stops_greeting_between_modules_stops_the_suite_there(tmp_path: Path) -> None:
    with TcpProxy(HOST, PORT, amqp=True) as proxy:
        def stall() -> None:
            wait_for(lambda: (tmp_path / "stall").exists(), 240, interval=0.05, message="the first module's test")
            proxy.hold_replies(greetings=True)
            (tmp_path / "stalled").write_text("yes")

        watcher = threading.Thread(target=stall, daemon=True)
        watcher.start()
        res = inner_session(tmp_path, {"test_a.py": STALL_A, "test_b.py": STALL_B},
                            {"EPU_TEST_RABBIT_HOST": f"127.0.0.1:{proxy.port}", "EPU_TEST_BROKER_CHECK_SECONDS": "2"})
        proxy.release_replies()
    assert res.returncode == 3, res.stdout[-3000:] + res.stderr[-2000:]
    lines = one_line(res.stdout + res.stderr, proxy.port)
    assert len(lines) == 1 and "before test_b.py" in lines[0], res.stdout[-3000:]
    assert "1 passed" in res.stdout and "must not run" not in res.stdout and " failed" not in res.stdout
