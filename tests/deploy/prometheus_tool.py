"""promtool, or a failure that says how to get it (never a skip: ``make test`` installs it)."""

from __future__ import annotations

import shutil

import pytest


def promtool_path() -> str:
    exe = shutil.which("promtool")
    if exe is None:
        pytest.fail("promtool is missing: `make test` installs it (scripts/ensure-promtool.sh), or "
                    "`sudo apt-get install -y prometheus`")
    return exe
