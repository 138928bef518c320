"""Shared fixtures: isolated RabbitMQ vhost and names, PostgreSQL database, temp dirs.

Isolation: one vhost per test session (created with rabbitmqctl, deleted at the end), and a
unique name prefix per test inside it, so tests run in parallel (pytest-xdist) without
seeing each other. Nothing is skipped when a service is missing: ``make test`` provides
the services (scripts/ensure-services.sh), and a missing one is a failure, not a skip.
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
from epu.common.topology import Topology

from tests.support.brokerdiag import broker_diagnosis, is_unreachable_broker

RABBIT_HOST = os.environ.get("EPU_TEST_RABBIT_HOST", "127.0.0.1:5672")
RABBIT_ADMIN = os.environ.get("EPU_TEST_RABBIT_ADMIN", "guest:guest")
PG_BASE_URL = os.environ.get("EPU_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432")


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
        for name in sorted(wanted - {m.name for m in item.iter_markers()}):
            item.add_marker(getattr(pytest.mark, name))


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
def rabbit_vhost() -> Iterator[str]:
    """A fresh vhost for this test session (per xdist worker), with guest allowed in."""
    _refuse_offline("RabbitMQ")
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    vhost = f"epu-test-{worker}-{uuid.uuid4().hex[:8]}"
    rabbitmqctl("add_vhost", vhost)
    user = RABBIT_ADMIN.split(":")[0]
    rabbitmqctl("set_permissions", "-p", vhost, user, ".*", ".*", ".*")
    yield vhost
    rabbitmqctl("delete_vhost", vhost, check=False)


@pytest.fixture(scope="session")
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
    return Broker(rabbit_url, Topology(prefix=prefix, quorum=True), connect_timeout=20.0)


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
