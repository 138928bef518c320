"""The provisioner's layers, checked on the source: the pure judgement of a listing imports no
database library."""

from __future__ import annotations

import subprocess
import sys


def test_the_pure_reconcile_imports_no_sqlalchemy() -> None:
    """``reconcile`` (and ``unstarted``, ``states``, the record types) are pure: importing them
    loads no database library (they used to import the SQL store for its record types)."""
    code = ("import sys; import epu.services.provisioner.reconcile, epu.services.provisioner.unstarted, "
            "epu.services.provisioner.records; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'sqlalchemy'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"
