"""Replay captured Torque outputs as if the commands ran (stdout, stderr and exit code)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from epu.services.sensor.runner import CommandResult

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "torque"
RAW = FIXTURES / "raw"


def stdout(name: str) -> str:
    return (RAW / f"{name}.stdout").read_text()


def captured(name: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of capture ``name`` (exit code from the annotated copy's header
    when present, else from the README convention: 0)."""
    out = (RAW / f"{name}.stdout").read_text()
    err = (RAW / f"{name}.stderr").read_text()
    code = 0
    header = FIXTURES / f"{name}.txt"
    if header.exists():
        m = re.search(r"^# exit_code: (\d+)", header.read_text(), re.M)
        code = int(m.group(1)) if m else 0
    return code, out, err


class ReplayRunner:
    """``run(argv)`` answers from a table: (program, *args) → capture name or (code, out, err)."""

    def __init__(self, table: dict[tuple[str, ...], str | tuple[int, str, str]], codes: dict[str, int] | None = None):
        self.table = table
        self.codes = codes or {}
        self.calls: list[tuple[str, ...]] = []

    def run(self, argv: Sequence[str], timeout: float | None = None) -> CommandResult:
        key = (Path(argv[0]).name, *argv[1:])
        self.calls.append(key)
        if key not in self.table:
            raise AssertionError(f"unexpected command {key}")
        entry = self.table[key]
        if isinstance(entry, str):
            code, out, err = captured(entry)
            code = self.codes.get(entry, code)
        else:
            code, out, err = entry
        return CommandResult(tuple(argv), code, out, err)
