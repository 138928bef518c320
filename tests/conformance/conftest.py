"""Every store implementation behind the services' ports, one fixture per port.

The decision engine's port (``services/decision/ports.py``) and the provisioner's
(``services/provisioner/ports.py``) each have an SQL implementation — run here on SQLite and on
the real PostgreSQL server — and the simulator's in-memory one (``epu.sim``). Each case of this
package runs on all three: the simulator judges the engine and the provisioner on its own store,
so its store must answer as production's does."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from epu.sim.decision_memstore import MemoryDecisionDatabase

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres), "memory"]


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str | MemoryDecisionDatabase]:
    """The decision engine's shared store: an SQL URL, or the simulator's in-memory database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'decision.db'}"
    elif request.param == "memory":
        yield MemoryDecisionDatabase()
    else:
        yield request.getfixturevalue("pg_url")
