"""Which failures no retry cures (issue 26, defect 9), judged on real errors: SQLite and
PostgreSQL (through SQLAlchemy, as the stores meet them) and the operating system. Was: every
``OSError`` and every ``sqlite3.OperationalError`` counted as "the infrastructure is away", so a
schema that does not match the code after an upgrade was retried forever, silently."""

from __future__ import annotations

import socket
import sqlite3
from pathlib import Path

import pytest
from epu.common.failures import classify, describe
from epu.services.decision.lease import StaleWrite
from sqlalchemy import create_engine, text


def _raised(fn) -> BaseException:  # noqa: ANN001
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - the error is what the test looks at
        return exc
    raise AssertionError("expected an error")


def _upgraded_sqlite(tmp_path: Path) -> str:
    """A database an older release made: the code of this one reads a column it lacks."""
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE instances (instance_id TEXT PRIMARY KEY, state TEXT)")
    return str(path)


def test_a_schema_that_does_not_match_the_code_is_permanent_on_sqlite(tmp_path: Path) -> None:
    path = _upgraded_sqlite(tmp_path)
    raw = _raised(lambda: sqlite3.connect(path).execute("SELECT removed FROM instances").fetchall())
    assert isinstance(raw, sqlite3.OperationalError) and classify(raw) == "permanent"
    engine = create_engine(f"sqlite:///{path}")
    with engine.connect() as conn:
        wrapped = _raised(lambda: conn.execute(text("SELECT removed FROM instances")).all())
        assert classify(wrapped) == "permanent" and "no such column: removed" in describe(wrapped)
        missing = _raised(lambda: conn.execute(text("SELECT 1 FROM decision_leases")).all())
        assert classify(missing) == "permanent"
    engine.dispose()


def test_a_locked_sqlite_database_is_transient(tmp_path: Path) -> None:
    path = _upgraded_sqlite(tmp_path)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        other = sqlite3.connect(path, timeout=0.0)
        locked = _raised(lambda: other.execute("INSERT INTO instances VALUES ('i', 'pending')"))
        assert "locked" in str(locked) and classify(locked) == "transient"
        other.close()
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_a_read_only_sqlite_database_is_permanent(tmp_path: Path) -> None:
    path = _upgraded_sqlite(tmp_path)
    ro = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    refused = _raised(lambda: ro.execute("INSERT INTO instances VALUES ('i', 'pending')"))
    assert classify(refused) == "permanent"
    ro.close()


@pytest.mark.postgres
def test_postgresql_schema_errors_are_permanent_and_a_lost_server_transient(pg_url: str) -> None:
    engine = create_engine(pg_url)
    with engine.connect() as conn:
        conn.execute(text("CREATE TABLE instances (instance_id TEXT PRIMARY KEY)"))
        conn.commit()
        column = _raised(lambda: conn.execute(text("SELECT removed FROM instances")).all())
        assert classify(column) == "permanent" and "removed" in describe(column)
        conn.rollback()
        table = _raised(lambda: conn.execute(text("SELECT 1 FROM no_such_table")).all())
        assert classify(table) == "permanent"
        conn.rollback()
        dup = _raised(lambda: [conn.execute(text("INSERT INTO instances VALUES ('a')")) for _ in range(2)])
        assert classify(dup) is None  # a constraint: this message's, not the infrastructure's
        conn.rollback()
    engine.dispose()
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    gone = create_engine(f"postgresql+psycopg://postgres@127.0.0.1:{port}/test")
    refused = _raised(lambda: gone.connect())
    assert classify(refused) == "transient"
    gone.dispose()
    base, _, _db = pg_url.rpartition("/")
    nodb = create_engine(f"{base}/epu_no_such_database")
    missing = _raised(lambda: nodb.connect())
    assert classify(missing) == "permanent", describe(missing)
    nodb.dispose()


@pytest.mark.postgres
def test_postgresql_failover_answers_are_transient(pg_url: str) -> None:
    """Issue 33, defect 7: what a session meets during a failover — a server that answers writes
    read-only (25006: a standby, the demoted primary) and a transaction an earlier failure aborted
    (25P02) — passes once the pool reaches the new primary: transient, not the message's."""
    engine = create_engine(pg_url)
    with engine.connect() as conn:
        conn.execute(text("CREATE TABLE changes (change_id TEXT PRIMARY KEY)"))
        conn.commit()
        conn.execute(text("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY"))
        conn.commit()
        read_only = _raised(lambda: conn.execute(text("INSERT INTO changes VALUES ('c1')")))
        assert read_only.orig.sqlstate == "25006" and classify(read_only) == "transient", describe(read_only)
        assert classify(read_only.orig) == "transient"  # the driver's own error too
        conn.rollback()
    with engine.connect() as conn:
        raw = conn.connection.driver_connection
        _raised(lambda: raw.execute("SELECT 1/0"))  # the statement before failed...
        aborted = _raised(lambda: conn.execute(text("INSERT INTO changes VALUES ('c1')")))
        assert aborted.orig.sqlstate == "25P02" and classify(aborted) == "transient", describe(aborted)
        conn.rollback()
    engine.dispose()


def test_operating_system_errors_by_errno(tmp_path: Path) -> None:
    assert classify(_raised(lambda: open(tmp_path / "missing"))) == "permanent"  # noqa: SIM115
    (tmp_path / "dir").mkdir()
    wrong_kind = _raised(lambda: open(tmp_path / "dir", "w"))  # noqa: SIM115
    assert isinstance(wrong_kind, IsADirectoryError) and classify(wrong_kind) == "permanent"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    refused = _raised(lambda: socket.create_connection(("127.0.0.1", port), timeout=2))
    assert isinstance(refused, ConnectionRefusedError) and classify(refused) == "transient"


def test_what_the_raiser_says_wins_and_other_errors_are_the_messages() -> None:
    assert classify(StaleWrite("another engine wrote")) == "transient"
    assert classify(RuntimeError("a bug")) is None
    assert classify(ValueError("bad value")) is None
