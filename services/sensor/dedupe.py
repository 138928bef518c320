"""The sensor's memory of commands it already executed (design rule 3: the receiver dedupes).

Why durable: the decision engine re-sends a command until it sees the result, and RabbitMQ
redelivers an unacked one after a crash. Either way the same ``command_id`` must not run
twice (a second ``remove`` could hit a node re-added since), so its stored result is sent
again instead, marked ``duplicate``. A small SQLite file survives a restart; the in-memory
variant is for the simulated backend, whose cluster dies with the process anyway.
Only definitive results are stored — a transient failure (batch system unreachable) is not,
so a re-send runs the command again.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Protocol

from epu.common.messages import NodeCommandResult


class CommandLog(Protocol):
    def get(self, command_id: str) -> NodeCommandResult | None: ...
    def put(self, result: NodeCommandResult) -> None: ...


class MemoryCommandLog:
    def __init__(self) -> None:
        self._results: dict[str, NodeCommandResult] = {}

    def get(self, command_id: str) -> NodeCommandResult | None:
        return self._results.get(command_id)

    def put(self, result: NodeCommandResult) -> None:
        self._results[result.command_id] = result


class SqliteCommandLog:
    """One row per executed command: id → result JSON. Old rows are pruned after ``keep_days``."""

    def __init__(self, path: str | Path, keep_days: float = 7.0) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=FULL")
        self._conn.execute("CREATE TABLE IF NOT EXISTS sensor_commands ("
                           "command_id TEXT PRIMARY KEY, result TEXT NOT NULL, stored_at REAL NOT NULL)")
        self._conn.execute("DELETE FROM sensor_commands WHERE stored_at < ?", (time.time() - keep_days * 86400,))

    def get(self, command_id: str) -> NodeCommandResult | None:
        with self._lock:
            row = self._conn.execute("SELECT result FROM sensor_commands WHERE command_id = ?",
                                     (command_id,)).fetchone()
        return NodeCommandResult.model_validate_json(row[0]) if row else None

    def put(self, result: NodeCommandResult) -> None:
        with self._lock:
            self._conn.execute("INSERT OR REPLACE INTO sensor_commands VALUES (?, ?, ?)",
                               (result.command_id, result.model_dump_json(), time.time()))

    def close(self) -> None:
        with self._lock:
            self._conn.close()
