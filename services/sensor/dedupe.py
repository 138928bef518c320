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


_FIELDS = tuple(NodeCommandResult.model_fields)


class MemoryCommandLog:
    """The log in memory: ``get`` gives a result equal to the one ``put`` stored (its fields and
    which of them were set), as a new object.

    Why not the objects themselves: the simulator's sensor stores every command's result for the
    whole run (``epu simulate``'s NASA month: 196,365 of them), and a model object costs ~1.2 KB,
    half of it its set of set fields; kept as a tuple of its field values and one shared frozenset
    per combination of set fields, a result costs ~0.2 KB, and the rare duplicate pays for
    rebuilding its answer. ``tests/sensor/test_dedupe.py`` checks the answer against the stored
    object."""

    def __init__(self) -> None:
        self._results: dict[str, tuple[tuple[object, ...], frozenset[str]]] = {}
        self._sets: dict[frozenset[str], frozenset[str]] = {}

    def get(self, command_id: str) -> NodeCommandResult | None:
        kept = self._results.get(command_id)
        if kept is None:
            return None
        values, fields_set = kept
        return NodeCommandResult.model_construct(set(fields_set), **dict(zip(_FIELDS, values, strict=True)))

    def put(self, result: NodeCommandResult) -> None:
        fields_set = frozenset(result.model_fields_set)
        fields_set = self._sets.setdefault(fields_set, fields_set)
        self._results[result.command_id] = (tuple(result.__dict__[f] for f in _FIELDS), fields_set)


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
