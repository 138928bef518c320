"""Policy registry: name → (parameter schema, pure ``decide``).

Find a policy's arithmetic in its own module here; nothing in this package does I/O.
"""

from __future__ import annotations

from typing import Any

from epu.services.decision.policies import fixed, load, queue_demand, spare, start_time, threshold
from epu.services.decision.policies.base import Params, Policy
from pydantic import ValidationError

POLICIES: dict[str, Policy] = {p.name: p for p in (queue_demand.POLICY, threshold.POLICY, spare.POLICY,
                                                    load.POLICY, fixed.POLICY, start_time.POLICY)}


class PolicyError(ValueError):
    """A policy name or parameters that cannot be used; the message says why."""


def get_policy(name: str) -> Policy:
    try:
        return POLICIES[name]
    except KeyError:
        raise PolicyError(f"unknown policy {name!r} (known: {', '.join(sorted(POLICIES))})") from None


def validate_params(name: str, params: dict[str, Any]) -> Params:
    policy = get_policy(name)
    try:
        return policy.params.model_validate(params)
    except ValidationError as exc:
        parts = []
        for err in exc.errors():
            key = ".".join(str(p) for p in err["loc"]) or "params"
            msg = "unknown parameter" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
            parts.append(f"{name}.{key}: {msg}")
        raise PolicyError("; ".join(parts)) from None


DEMAND_SENSITIVE = frozenset({"start-time"})
"""Policies whose decision moves with time while jobs wait (start-time compares the running
jobs' expected ends with now + a boot time): no duration of theirs says when it turns, so while
their domain has queued demand the engine's next deadline is now (``Engine.next_deadlines``)."""


def durations(params: Params) -> list[float]:
    """Every positive duration among a policy's parameters (a name ending in ``_seconds`` or
    ``_s``): the spans the policy compares ``now - t`` with, found by name so that a new policy's
    timer is not forgotten by whoever asks when an iteration may decide differently."""
    out = []
    for k, v in params.model_dump().items():
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 and (
                k.endswith("_seconds") or k.endswith("_s")):
            out.append(float(v))
    return out


__all__ = ["DEMAND_SENSITIVE", "POLICIES", "Params", "Policy", "PolicyError", "durations", "get_policy", "validate_params"]
