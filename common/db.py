"""One SQL layer for SQLite and PostgreSQL (SQLAlchemy Core).

SQLite is the single-host default: WAL mode so readers never block the writer, a busy
timeout so two processes on one file wait instead of failing, foreign keys on. PostgreSQL
(``postgresql+psycopg://...``) is for several hosts. Services define their own tables.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from sqlalchemy import MetaData, event
from sqlalchemy.engine import Engine, create_engine
from sqlalchemy.exc import DBAPIError


def make_engine(url: str, **kwargs: Any) -> Engine:
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://"):]
    if url.startswith("sqlite"):
        path = url.split("///", 1)[1] if "///" in url else ""
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        if not path or path == ":memory:":
            # one shared in-memory database, not a new empty one per connection
            from sqlalchemy.pool import StaticPool

            kwargs.setdefault("poolclass", StaticPool)
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False}, **kwargs)

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return engine
    return create_engine(url, pool_pre_ping=True, **kwargs)


def create_schema(engine: Engine, metadata: MetaData, attempts: int = 5) -> None:
    """Create the tables that are missing.

    Why the retry: two processes on one empty database — an engine and its standby, two
    context-broker replicas, started together by systemd — race between "does the table
    exist?" and ``CREATE TABLE``; the loser's CREATE fails with "already exists" and a second
    look finds the tables made."""
    for attempt in range(1, attempts + 1):
        try:
            metadata.create_all(engine)
            return
        except DBAPIError:
            if attempt == attempts:
                raise
            time.sleep(0.05 * attempt)
