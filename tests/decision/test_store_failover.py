"""A PostgreSQL failover loses no operator change (issue 33, defect 7), on the real RabbitMQ and
the real PostgreSQL.

A failover leaves the engine's pool pointing at a server that answers writes with SQLSTATE
25006 (``read_only_sql_transaction``: the old primary demoted, or a standby) until it reconnects
to the new primary. That code was classified neither transient nor permanent, so the runtime
blamed the message: an operator's policy change was dead-lettered after three tries in 0.6 s.
Here the engine's database is made read-only the way a failover makes it — every session cut,
every new one read-only — while a change is in flight; the change must wait in place and be
applied once the database takes writes again."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from epu.common.broker import Publisher
from epu.common.config import load_config
from epu.common.messages import PolicyChange
from epu.common.runtime import run_in_thread
from epu.common.testing import wait_for
from epu.services.decision.app import build_service

from tests.conftest import PG_BASE_URL
from tests.decision.busutil import Tap

CONFIG = """
[broker]
url = "{url}"
prefix = "{prefix}"
[decision]
store_url = "{store}"
iteration_seconds = 0.2
[domains.d]
max_nodes = 10
sites = ["s1"]
[sites.s1]
driver = "epu-sim"
quota = 20
"""


def _failover(database: str, read_only: bool) -> None:
    """What a failover does to a client: every session of ``database`` is cut, and the server the
    pool reconnects to takes writes (``read_only`` False) or answers them with 25006."""
    with psycopg.connect(f"{PG_BASE_URL}/postgres", autocommit=True) as admin:
        setting = "SET default_transaction_read_only = on" if read_only else "RESET default_transaction_read_only"
        admin.execute(f'ALTER DATABASE "{database}" {setting}')
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s "
                      "AND pid <> pg_backend_pid()", (database,))


@pytest.fixture
def service_on_pg(tmp_path, pg_url: str, rabbit_url: str, prefix: str, broker) -> Iterator:  # noqa: ANN001
    path = tmp_path / "epu.toml"
    path.write_text(CONFIG.format(url=rabbit_url, prefix=prefix, store=pg_url))
    service = build_service(load_config(path, environ={}))
    thread = run_in_thread(service)
    assert service.wait_ready(20)
    tap = Tap(broker, "policy.outcome.#")
    pub = Publisher(broker, source="test")
    try:
        yield service, tap, pub, pg_url.rsplit("/", 1)[1]
    finally:
        service.stop()
        thread.join(20)
        tap.close()
        pub.close()


def _dead_lettered(service) -> float:  # noqa: ANN001
    """Messages the service sent to the dead-letter queue, every queue."""
    return sum(s.value for m in service.metrics.dead_lettered.collect() for s in m.samples
               if s.name.endswith("_total"))


def _outcome(tap: Tap, change_id: str) -> list:
    return [o for o in tap.of("policy.outcome") if o.change_id == change_id]


@pytest.mark.postgres
def test_a_change_sent_during_a_failover_is_applied_once_the_database_takes_writes(service_on_pg) -> None:
    service, tap, pub, database = service_on_pg
    pub.publish(PolicyChange(change_id="before", domain="d", max_nodes=8, operator="t"))
    (before,) = wait_for(lambda: _outcome(tap, "before"), 20, message="outcome of the change before the failover")
    assert before.applied and before.version == 2

    _failover(database, read_only=True)
    pub.publish(PolicyChange(change_id="during", domain="d", max_nodes=5, operator="t"))

    def retried_past_the_attempts_or_dead() -> bool:
        retrying = service.health().get("retrying") or {}
        return _dead_lettered(service) > 0 or (retrying.get("id") is not None and retrying.get("attempts", 0) > 3)

    wait_for(retried_past_the_attempts_or_dead, 30, message="the change retried past max_attempts, or dead-lettered")
    assert _dead_lettered(service) == 0, "the operator's change was dead-lettered"
    retrying = service.health()["retrying"]
    assert retrying["transient"] and "ReadOnlySqlTransaction" in retrying["error"], retrying
    assert not _outcome(tap, "during")  # nothing answered while nothing could be stored

    _failover(database, read_only=False)
    (during,) = wait_for(lambda: _outcome(tap, "during"), 30, message="outcome of the change after the failover")
    assert during.applied and during.version == 3 and during.config["max_nodes"] == 5
    assert service.engine.store.current_config("d")[1].max_nodes == 5
    assert _dead_lettered(service) == 0
