"""Shared fixtures: isolated RabbitMQ vhost and names, PostgreSQL database, temp dirs.

Isolation: one vhost per test module (tests/support/vhosts.py: deleted with every queue in it as
soon as the module is done), and a unique name prefix per test inside it, so tests run in
parallel (pytest-xdist) without seeing each other. Nothing is skipped when a service is missing:
``make test`` provides the services (scripts/ensure-services.sh), and a missing one is a failure,
not a skip.

What the suite asks of the shared RabbitMQ is bounded (issue 34: a broker out of file handles
answered nothing for 12 minutes in the middle of ``make test``):

* queues are classic (``EPU_TEST_CLASSIC_QUEUES=1``, ``common.topology``): a quorum queue holds
  three of the broker's file handles for as long as it exists. A test whose subject is quorum
  semantics (replication, delivery limits, the committed definitions) is marked ``quorum`` and
  declares quorum queues as production does; ``tests/cluster`` is, as a whole;
* a module's queues go with its vhost when the module ends;
* at its start and before each module that needs RabbitMQ, the suite checks that the broker
  completes an AMQP handshake within ``EPU_TEST_BROKER_CHECK_SECONDS`` (15); if it does not, the
  suite stops with one line saying so (tests/support/brokercheck.py), instead of failing every
  test after it on its own timeout.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from epu.common.broker import Broker
from epu.common.topology import CLASSIC_QUEUES_FOR_TESTS, Topology

from tests.support.brokercheck import handshake_problem, stop_line
from tests.support.brokerdiag import broker_diagnosis, is_unreachable_broker
from tests.support.vhosts import VhostPool

RABBIT_HOST = os.environ.get("EPU_TEST_RABBIT_HOST", "127.0.0.1:5672")
RABBIT_ADMIN = os.environ.get("EPU_TEST_RABBIT_ADMIN", "guest:guest")
PG_BASE_URL = os.environ.get("EPU_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432")


# classic queues unless a test is marked ``quorum`` (set here, so subprocesses inherit it too);
# EPU_TEST_CLASSIC_QUEUES=0 in the environment runs every test on quorum queues
os.environ.setdefault(CLASSIC_QUEUES_FOR_TESTS, "1")


def rabbitmqctl(*args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("rabbitmqctl") or "/usr/sbin/rabbitmqctl"
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=60, check=check, input=stdin)


_broker_diagnosed = False

OFFLINE = os.environ.get("EPU_TEST_OFFLINE") == "1"
"""Set by ``make test-fast``: the run must not reach RabbitMQ or PostgreSQL. A test that asks for
them anyway fails at once and says so (its marker is missing), rather than quietly passing
because the machine happens to run the services."""

_SERVICE_FIXTURES = {"rabbit_vhost": "rabbitmq", "rabbit_url": "rabbitmq", "broker": "rabbitmq", "pg_url": "postgres"}
_SERVICE_DIRS = {"e2e": "e2e", "cluster": "cluster"}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "quorum: declares quorum queues, as production does (quorum semantics "
                                       "under test); the suite's other tests declare classic ones")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark what needs a system service from what the test asks for, so ``-m "not rabbitmq and
    not postgres and not slurm"`` (``make test-fast``) leaves out exactly those: a test using the
    broker or PostgreSQL fixtures, a test parametrized over a PostgreSQL back end (the store
    fixtures take ``pg_url`` by name at run time), and the e2e and cluster directories."""
    for item in items:
        wanted = {_SERVICE_FIXTURES[f] for f in getattr(item, "fixturenames", ()) if f in _SERVICE_FIXTURES}
        callspec = getattr(item, "callspec", None)
        if callspec is not None and "postgres" in callspec.id:
            wanted.add("postgres")
        parts = item.path.relative_to(Path(__file__).parent).parts if item.path.is_relative_to(Path(__file__).parent) else ()
        if parts and parts[0] in _SERVICE_DIRS:
            wanted.add(_SERVICE_DIRS[parts[0]])
        if parts and parts[0] == "cluster":
            wanted.add("quorum")  # a cluster's failover is quorum queues replicated on its nodes
        for name in sorted(wanted - {m.name for m in item.iter_markers()}):
            item.add_marker(getattr(pytest.mark, name))


def _needs_system_broker(item: pytest.Item) -> bool:
    """The test talks to the machine's RabbitMQ (tests/cluster start nodes of their own)."""
    return item.get_closest_marker("rabbitmq") is not None and item.get_closest_marker("cluster") is None


_checked_module: list[Path] = []


def _check_broker(when: str) -> None:
    """Stop the suite with one line if the broker does not complete a handshake (see the docstring)."""
    host, port = _host_port(RABBIT_HOST)
    user, password = RABBIT_ADMIN.split(":", 1)
    problem = handshake_problem(host, port, user, password)
    if problem is not None:
        pytest.exit(stop_line(host, port, problem, when), returncode=3)


def pytest_collection_finish(session: pytest.Session) -> None:
    if not OFFLINE and not session.config.option.collectonly and any(map(_needs_system_broker, session.items)):
        _check_broker("at the start of the suite")


@pytest.hookimpl(tryfirst=True)  # before the fixtures are set up: a stalled broker would hang them
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before the first test of each module that needs the broker (a handshake takes milliseconds)."""
    if OFFLINE or not _needs_system_broker(item) or item.path in _checked_module:
        return
    _checked_module[:] = [item.path]
    _check_broker(f"before {item.path.name}")


@pytest.fixture(autouse=True)
def _queue_type(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test marked ``quorum`` declares quorum queues (and so do the processes it starts)."""
    if request.node.get_closest_marker("quorum") is not None:
        monkeypatch.setenv(CLASSIC_QUEUES_FOR_TESTS, "0")


def _refuse_offline(what: str) -> None:
    if OFFLINE:
        pytest.fail(f"EPU_TEST_OFFLINE=1 (make test-fast) but this test needs {what}: mark it "
                    f"(rabbitmq/postgres) or take the service's fixture, so the fast run leaves it out")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """The first test that cannot reach the machine's RabbitMQ carries a report of the broker's
    state (alarms, descriptors, disk, load): without it a CI log says only "timed out"."""
    global _broker_diagnosed
    outcome = yield
    report = outcome.get_result()
    if (report.failed and not _broker_diagnosed and call.excinfo is not None
            and is_unreachable_broker(call.excinfo.value)):
        _broker_diagnosed = True
        report.sections.append(("RabbitMQ when the broker could not be reached",
                                broker_diagnosis(*_host_port(RABBIT_HOST))))


def _host_port(hostport: str) -> tuple[str, int]:
    host, _, port = hostport.rpartition(":")
    return host, int(port)


@pytest.fixture(scope="session")
def _vhost_pool() -> Iterator[VhostPool]:
    """Where the modules' vhosts come from; at the session's end every one is gone."""
    _refuse_offline("RabbitMQ")
    host, port = _host_port(RABBIT_HOST)
    user, password = RABBIT_ADMIN.split(":", 1)
    pool = VhostPool(os.environ.get("PYTEST_XDIST_WORKER", "main"), host, port, user, password)
    yield pool
    left = pool.close()
    if left:
        print(f"\nRabbitMQ test vhosts not deleted: {', '.join(left)}")


@pytest.fixture(scope="module")
def rabbit_vhost(_vhost_pool: VhostPool) -> Iterator[str]:
    """A fresh vhost for this test module (per xdist worker), with guest allowed in; deleted, with
    every queue in it, as soon as the module is done."""
    vhost = _vhost_pool.take()
    yield vhost
    _vhost_pool.give_back(vhost)


@pytest.fixture(scope="module")
def rabbit_url(rabbit_vhost: str) -> str:
    return f"amqp://{RABBIT_ADMIN}@{RABBIT_HOST}/{rabbit_vhost}"


@pytest.fixture
def prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}."


@pytest.fixture
def broker(rabbit_url: str, prefix: str) -> Broker:
    """A Broker on the real RabbitMQ, with names unique to this test. The connect timeout is
    longer than production's 5 s: on the shared 2-core machine the AMQP handshake itself has taken
    over 5 s under load, and no test here is about how fast a connect to a live broker gives up."""
    return Broker(rabbit_url, Topology(prefix=prefix), connect_timeout=20.0)


@pytest.fixture
def memory_broker(prefix: str) -> Broker:
    return Broker("memory://", Topology(prefix=prefix, quorum=False))


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh PostgreSQL database for this test, dropped afterwards."""
    with fresh_pg_database() as url:
        yield url


@contextlib.contextmanager
def fresh_pg_database() -> Iterator[str]:
    """A new PostgreSQL database (a SQLAlchemy URL), dropped on exit even if the test failed."""
    import psycopg

    _refuse_offline("PostgreSQL")
    name = f"epu_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(f"{PG_BASE_URL}/postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql+psycopg://{PG_BASE_URL.split('://', 1)[1]}/{name}"
    finally:
        with psycopg.connect(f"{PG_BASE_URL}/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'epu.db'}"
