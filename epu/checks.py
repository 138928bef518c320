"""The services' own config checks, registered with ``epu.common.config.check_config``.

``common`` imports no service, so the knowledge only a service has (the decision engine's
policy names and each policy's parameters; which arguments a site's libcloud driver and its
``create_node`` take) is plugged in here, in the composition layer, where ``epu config check``
and ``epu run`` both find it. Each check calls the service's own validation (``validate_params``,
``check_site``): one implementation, whoever asks.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from epu.common.config import register_check


def domain_policies(config: Any) -> Iterable[tuple[str, str]]:
    from epu.services.decision.policies import POLICIES, PolicyError, validate_params

    for name, d in config.domains.items():
        if d.policy not in POLICIES:
            yield f"domains.{name}.policy", f"unknown policy {d.policy!r} (known: {', '.join(sorted(POLICIES))})"
            continue
        try:
            validate_params(d.policy, d.params)
        except PolicyError as exc:
            known = ", ".join(sorted(POLICIES[d.policy].params.model_fields))
            for part in str(exc).split("; "):
                param, _, msg = part.partition(": ")
                key = param.split(".", 1)[1] if "." in param else param
                yield f"domains.{name}.params.{key}", f"{msg} ({d.policy} takes: {known})"


register_check({"decision"}, domain_policies)


def domain_ceilings(config: Any) -> Iterable[tuple[str, str]]:
    """A domain's ``max_nodes`` within the bound a run-time change must respect (the engine's
    own ``nodes_ceiling``): before, ``max_nodes = 1000000`` passed here and ``epu policy set``
    refused the same number."""
    from epu.services.decision.changes import nodes_ceiling

    quotas = {name: site.quota for name, site in config.sites.items()}
    for name, d in config.domains.items():
        if any(s not in quotas for s in d.sites):
            continue  # an undefined site is reported by domain_sites
        ceiling, where = nodes_ceiling(None if d.max_nodes_ceiling is None else d, d.sites, quotas)
        if quotas and ceiling is not None and d.max_nodes > ceiling:
            yield f"domains.{name}.max_nodes", f"{d.max_nodes} is above the ceiling {ceiling} ({where})"


register_check({"decision"}, domain_ceilings)


def spend_caps(config: Any) -> Iterable[tuple[str, str]]:
    """Each spend cap over the types it judges, by the rule ``epu policy set`` applies too
    (``budget.cap_problems``): no unpriced type under a cap (issue 33: a 1.0/h cap let 40
    launches of an unpriced type through), no cap below the cheapest instance (issue 34)."""
    from epu.common.config.catalogue import site_types
    from epu.services.decision.budget import cap_problems, domain_cap_problems

    types = {name: site_types(name, site) for name, site in config.sites.items()}
    for name, d in config.domains.items():
        if any(s not in config.sites for s in d.sites):
            continue  # an undefined site is reported by domain_sites
        for problem in domain_cap_problems(d, types):
            yield f"domains.{name}.budget_per_hour", problem
    for name, site in config.sites.items():
        if site.budget_per_hour is not None:
            for problem in cap_problems(site.budget_per_hour, types[name]):
                yield f"sites.{name}.budget_per_hour", problem


register_check({"decision"}, spend_caps)


def provisioner_sites(config: Any) -> Iterable[tuple[str, str]]:
    try:
        from epu.services.provisioner.cloud import check_site
        from epu.services.provisioner.drivers import SiteConfigError
    except ModuleNotFoundError as exc:  # a host without the 'control' extra runs no provisioner
        yield "sites", f"cannot check the sites here: {exc.name} is not installed (the 'control' extra)"
        return
    for name, site in config.sites.items():
        try:
            check_site(name, site)
        except SiteConfigError as exc:
            yield f"sites.{name}", str(exc)


register_check({"provisioner"}, provisioner_sites)
