"""``check_node_name`` with its memo of accepted names answers as the check from nothing, over
random names (valid and hostile, repeated, beyond the memo's bound)."""

from __future__ import annotations

import random

import pytest
from epu.common.messages import is_valid_hostname
from epu.services.sensor import backend
from epu.services.sensor.backend import InvalidNodeName, check_node_name


def accepted(name: object) -> bool:
    try:
        check_node_name(name)  # type: ignore[arg-type]
    except InvalidNodeName:
        return False
    return True


@pytest.mark.parametrize("seed", range(4))
def test_the_memo_of_accepted_names_changes_no_answer(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backend, "_ACCEPTED_MAX", 50)  # so the bound is crossed many times
    monkeypatch.setattr(backend, "_ACCEPTED", set())
    rng = random.Random(seed)
    alphabet = "ab-.1 ;$/"
    names = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6))) for _ in range(300)]
    names += ["n" * 254, "-x", 7, None]  # type: ignore[list-item]
    for _ in range(3000):
        name = rng.choice(names)
        want = isinstance(name, str) and bool(name) and is_valid_hostname(name)
        assert accepted(name) == want, name
    assert len(backend._ACCEPTED) <= 50
