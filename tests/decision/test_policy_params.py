"""``PolicyParams`` (the last validation per policy, reused) against ``validate_params``."""

from __future__ import annotations

import copy
import random
from typing import Any

from epu.services.decision.policies import PolicyError, durations, validate_params
from epu.services.decision.policy_params import PolicyParams, same_params

_VALUES: dict[str, list[Any]] = {
    "idle_seconds": [0, 0.0, 1, 1.0, 30, True, -1, "x"],
    "stall_seconds": [600, 600.0, 1, 2.5, 0],
    "gang_deadline_seconds": [None, 5, 5.0],
    "spare": [1],
}


def test_kept_validation_equals_validating_again() -> None:
    kept = PolicyParams()
    rng = random.Random(31)
    params: dict[str, Any] = {}
    for _ in range(2000):
        roll = rng.random()
        if roll < 0.4:  # changed in place (the same dict object)
            key = rng.choice(list(_VALUES))
            if key in params and rng.random() < 0.3:
                del params[key]
            else:
                params[key] = rng.choice(_VALUES[key])
        elif roll < 0.6:  # an equal copy
            params = copy.deepcopy(params)
        try:
            want: Any = validate_params("queue-demand", params)
        except PolicyError as exc:
            want = str(exc)
        try:
            got: Any = kept.get("queue-demand", params)
        except PolicyError as exc:
            got = str(exc)
        assert got == want and type(got) is type(want), params
        if not isinstance(got, str):
            assert got.model_dump() == want.model_dump() and all(
                type(getattr(got, k)) is type(getattr(want, k)) for k in type(got).model_fields)
            assert kept.durations("queue-demand", params) == durations(want)


def test_same_params_tells_types_apart() -> None:
    assert same_params({"a": [1, {"b": 2.0}]}, {"a": [1, {"b": 2.0}]})
    assert not same_params({"a": 1}, {"a": 1.0})
    assert not same_params({"a": 1}, {"a": True})
    assert not same_params({"a": [1]}, {"a": (1,)})
    assert not same_params({"a": 1}, {"a": 1, "b": 2})
