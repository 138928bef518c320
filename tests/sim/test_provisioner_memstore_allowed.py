"""``MemoryStore.advance`` asks a remembered ``_allowed`` instead of ``check_transition``: for every
pair of states (and unknown ones), in random order and asked again, it answers ``.allowed``."""

from __future__ import annotations

import random
from collections.abc import Callable

from epu.services.provisioner.states import INSTANCE_STATE_ORDER, check_transition

from epu.sim import provisioner_memstore as memstore


def test_allowed_is_check_transition() -> None:
    states = [*INSTANCE_STATE_ORDER, "bogus", ""]
    pairs = [(a, b) for a in states for b in states] * 3
    random.Random(0).shuffle(pairs)
    for a, b in pairs:
        assert _outcome(memstore._allowed, a, b) == _outcome(lambda x, y: check_transition(x, y).allowed, a, b)


def _outcome(fn: Callable[[str, str], bool], a: str, b: str) -> object:
    """The answer, or the type of the error raised (an unknown current state: ``KeyError``)."""
    try:
        return fn(a, b)
    except Exception as exc:
        return type(exc)
