"""Each policy's parameters, validated once and reused while they stay the same.

Why: the engine needs a domain's validated parameters at every iteration (to decide) and for
every deadline it names (the policy's durations); a pydantic validation each time was ~1 % of
the engine's work. The last validation per policy is kept and returned while a config's
parameters equal the copy it was made on — compared with their types too (``1 == 1.0 == True``
would not do: validation may tell them apart). ``tests/decision/test_policy_params.py`` checks it
against validating again."""

from __future__ import annotations

import copy
from typing import Any

from epu.services.decision.policies import Params, durations, validate_params


class PolicyParams:
    """``validate_params`` with its last answer per policy kept."""

    def __init__(self) -> None:
        self._params: dict[str, tuple[str, dict[str, Any], Params, list[float]]] = {}
        """Per policy name: (the name, a copy of the parameters it validated, the result, its
        ``durations``)."""

    def get(self, name: str, params: dict[str, Any]) -> Params:
        """``validate_params(name, params)``, validated again only when the parameters differ
        from the last ones validated for ``name``; the result is frozen, so it is shared safely.
        Raises ``PolicyError`` as ``validate_params`` does."""
        return self._kept(name, params)[2]

    def durations(self, name: str, params: dict[str, Any]) -> list[float]:
        """``durations(validate_params(name, params))``, kept with the validation (the engine's
        ``next_deadlines`` asks for them per domain at every answer)."""
        return self._kept(name, params)[3]

    def _kept(self, name: str, params: dict[str, Any]) -> tuple[str, dict[str, Any], Params, list[float]]:
        hit = self._params.get(name)
        if hit is not None and same_params(hit[1], params):
            return hit
        out = validate_params(name, params)
        hit = self._params[name] = (name, copy.deepcopy(params), out, durations(out))
        return hit


def same_params(a: Any, b: Any) -> bool:
    """Equal and of the same types throughout (dicts, lists, tuples walked; other values by
    type and ``==``)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_params(v, b[k]) for k, v in a.items())
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(map(same_params, a, b))
    return bool(a == b)
