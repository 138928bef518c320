"""Fixtures shared by the decision engine's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from epu.sim.decision_memstore import MemoryDecisionDatabase


@pytest.fixture(params=["sqlite", "postgres", "memory"])
def store_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str | MemoryDecisionDatabase]:
    """The shared store: an SQL URL, or the simulators' in-memory database (``memstore``)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'decision.db'}"
    elif request.param == "memory":
        yield MemoryDecisionDatabase()
    else:
        yield request.getfixturevalue("pg_url")
