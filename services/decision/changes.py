"""Operator policy changes: validate a PolicyChange against the current config. Pure.

A change is all-or-nothing: the new config must validate as a whole (policy known, its
parameters valid for its schema, min ≤ max, sites configured, placement known) or nothing
changes and the operator gets the reason.

Parameters merge into the current ones when the policy stays the same; a new policy starts
from its own defaults plus the parameters given (old parameters would not fit its schema).
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from common.config.decision import DomainConfig
from common.messages import PolicyChange
from services.decision.policies import PolicyError, validate_params


class ChangeRejected(ValueError):
    """The change cannot be applied; the message is the reason sent back to the operator."""


def apply_change(current: DomainConfig, change: PolicyChange, known_sites: list[str]) -> DomainConfig:
    data: dict[str, Any] = current.model_dump()
    if change.policy is not None and change.policy != current.policy:
        data["policy"] = change.policy
        data["params"] = dict(change.params)
    else:
        data["params"] = {**current.params, **change.params}
    for key in ("min_nodes", "max_nodes", "sites", "paused", "placement"):
        value = getattr(change, key)
        if value is not None:
            data[key] = value
    if change.sites is not None:
        unknown = [s for s in change.sites if s not in known_sites]
        if unknown:
            raise ChangeRejected(f"unknown site(s) {', '.join(unknown)} (configured: {', '.join(known_sites) or 'none'})")
        if len(set(change.sites)) != len(change.sites):
            raise ChangeRejected("sites: a site is listed twice")
    try:
        new = DomainConfig.model_validate(data)
        validate_params(new.policy, new.params)
    except PolicyError as exc:
        raise ChangeRejected(str(exc)) from None
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"]) or "config"
        raise ChangeRejected(f"{key}: {err['msg'].removeprefix('Value error, ')}") from None
    return new
