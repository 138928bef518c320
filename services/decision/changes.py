"""Operator policy changes: validate a PolicyChange against the current config. Pure.

A change is all-or-nothing: the new config must validate as a whole (policy known, its
parameters valid for its schema, min ≤ max, sites configured, placement known) or nothing
changes and the operator gets the reason.

Parameters merge into the current ones when the policy stays the same; a new policy starts
from its own defaults plus the parameters given (old parameters would not fit its schema).
"""

from __future__ import annotations

from typing import Any

from epu.common.config.decision import DomainConfig
from epu.common.messages import PolicyChange
from epu.services.decision.policies import PolicyError, validate_params
from pydantic import ValidationError


class ChangeRejected(ValueError):
    """The change cannot be applied; the message is the reason sent back to the operator."""


def apply_change(current: DomainConfig, change: PolicyChange, known_sites: list[str]) -> DomainConfig:
    data: dict[str, Any] = current.model_dump()
    if change.policy is not None and change.policy != current.policy:
        data["policy"] = change.policy
        data["params"] = dict(change.params)
    else:
        data["params"] = {**current.params, **change.params}
    for key in ("min_nodes", "max_nodes", "sites", "paused", "placement", "mode"):
        value = getattr(change, key)
        if value is not None:
            data[key] = value
    if change.clear_budget and change.budget_per_hour is not None:
        raise ChangeRejected("budget_per_hour: a new cap and clear_budget together (give one)")
    if change.clear_budget:
        data["budget_per_hour"] = None
    elif change.budget_per_hour is not None:
        if change.budget_per_hour <= 0:  # the file refuses 0 too: it is not a way to say "no cap"
            raise ChangeRejected("budget_per_hour: must be greater than 0 (to remove the cap: "
                                 "epu policy set DOMAIN budget_per_hour=none)")
        data["budget_per_hour"] = change.budget_per_hour
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


def nodes_ceiling(file_config: DomainConfig | None, sites: list[str] | None,
                  site_quotas: dict[str, int]) -> tuple[int | None, str]:
    """The most ``max_nodes`` (hence ``min_nodes``) may be, and where that bound comes from.

    One rule for the file and for run-time changes, so a value ``epu config check`` accepts is
    one ``epu policy set`` accepts: the domain's ``max_nodes_ceiling`` from the file when set,
    else the sum of the quotas of the sites the domain may use (``sites``, or every configured
    site). With no site configured at all (a config that runs no provisioner) the file's own
    ``max_nodes`` is the only bound known (None: none)."""
    if file_config is not None and file_config.max_nodes_ceiling is not None:
        return file_config.max_nodes_ceiling, "max_nodes_ceiling in the configuration file"
    if not site_quotas:
        return (file_config.max_nodes if file_config is not None else None), "the file's max_nodes (no site configured)"
    used = list(sites or site_quotas)
    return (sum(site_quotas.get(s, 0) for s in used),
            f"the sum of the quotas of sites {', '.join(used) or '(none)'}; raise a quota or set max_nodes_ceiling")


def check_ceiling(new: DomainConfig, file_config: DomainConfig | None, site_quotas: dict[str, int]) -> None:
    """Bounds from configuration, checked on every change (``nodes_ceiling``)."""
    ceiling, where = nodes_ceiling(file_config, new.sites, site_quotas)
    if ceiling is not None and file_config is not None and file_config.max_nodes > ceiling:
        # a file `epu config check` (and `epu run`) refuses, loaded without them (tests, the
        # simulator's scenarios of demand beyond quota): its own bound stays allowed
        ceiling, where = file_config.max_nodes, "the file's max_nodes"
    if ceiling is not None and new.max_nodes > ceiling:
        raise ChangeRejected(f"max_nodes {new.max_nodes} is above the ceiling {ceiling} ({where})")
