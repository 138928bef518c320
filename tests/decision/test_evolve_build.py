"""``view.evolve`` (an ``Instance`` built with its slots' own descriptors, ``view._BUILD``)
against ``dataclasses.replace``, the generic path it stands for."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest
from epu.services.decision.view import Instance, evolve

_CHOICES: dict[str, list[Any]] = {
    "instance_id": ["i-1", "i-2", "i-3"], "domain": ["d", "e"], "site": ["s1", "s2"], "node_name": ["n1", "n2"],
    "cores": [1, 2, 8], "state": ["requested", "started", "joined", "draining", "terminated"],
    "launched_at": [0.0, 1.5], "state_at": [2.0, 3.25], "seq": [-1, 0, 7], "ip": [None, "10.0.0.1"],
    "joined_at": [None, 4.0], "idle_since": [None, 5.0], "drain_at": [None, 6.0], "add_sent_at": [None, 7.0],
    "removed": [False, True], "terminate_sent": [False, True], "reason": ["", "why"],
    "missing_since": [None, 8.0], "seen_at": [None, 9.0], "retire": ["", "scale-down"],
    "instance_type": ["", "m1"], "gang": ["", "g:2"], "reopened_seq": [None, 3],
}


def test_every_field_covered() -> None:
    assert set(_CHOICES) == {f.name for f in dataclasses.fields(Instance)}


def test_evolve_equals_replace() -> None:
    rng = random.Random(23)
    for _ in range(3000):
        inst = Instance(**{k: rng.choice(v) for k, v in _CHOICES.items()})
        changes = {k: rng.choice(_CHOICES[k]) for k in rng.sample(list(_CHOICES), rng.randint(0, 5))}
        got, want = evolve(inst, **changes), dataclasses.replace(inst, **changes)
        assert type(got) is Instance and got == want and hash(got) == hash(want)
        assert all(getattr(got, k) == getattr(want, k) for k in _CHOICES)
        assert repr(got) == repr(want)


def test_evolved_instance_stays_frozen() -> None:
    got = evolve(Instance("i", "d", "s", "n", 1, "joined", 0.0, 0.0), state="draining")
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.state = "joined"  # type: ignore[misc]
