"""The sensor's command logs (services/sensor/dedupe.py): a stored result is answered as it was."""

from __future__ import annotations

from pathlib import Path

import pytest
from epu.common.messages import NodeCommandResult
from epu.services.sensor.dedupe import MemoryCommandLog, SqliteCommandLog


def results() -> list[NodeCommandResult]:
    return [NodeCommandResult(command_id="a" * 32, domain="alpha", action="add", node="w1", ok=True),
            NodeCommandResult(command_id="b" * 32, domain="alpha", action="remove", node="w2", ok=False,
                              error="busy", output="2 jobs"),
            NodeCommandResult(command_id="c" * 32, domain="beta", action="offline", node="w3", ok=True, output="",
                              duplicate=False)]


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_stored_result_is_answered_equal_to_itself(kind: str, tmp_path: Path) -> None:
    log = MemoryCommandLog() if kind == "memory" else SqliteCommandLog(tmp_path / "commands.db")
    assert log.get("a" * 32) is None
    for r in results():
        log.put(r)
    for r in results():
        got = log.get(r.command_id)
        assert got == r and got.model_dump() == r.model_dump()
        assert got.model_copy(update={"duplicate": True}).duplicate is True
        if kind == "memory":  # the plain definition: the very fields, and which were set
            assert got is not r and got.model_fields_set == r.model_fields_set
            assert got.model_dump(exclude_unset=True) == r.model_dump(exclude_unset=True)
    log.put(results()[1].model_copy(update={"ok": True}))  # a later result of the same id replaces it
    assert log.get("b" * 32).ok is True  # type: ignore[union-attr]
