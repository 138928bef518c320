"""One SQL layer for SQLite and PostgreSQL (SQLAlchemy Core).

SQLite is the single-host default: WAL mode so readers never block the writer, a busy
timeout so two processes on one file wait instead of failing, foreign keys on. PostgreSQL
(``postgresql+psycopg://...``) is for several hosts. Services define their own tables.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine, create_engine


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
