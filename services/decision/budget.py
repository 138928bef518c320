"""The spend cap: which planned launches fit under a domain's and a site's ``budget_per_hour``. Pure.

Spend is a *rate*: the hourly prices of the live instances (every state from ``requested`` to
``terminating``: an instance costs from the moment it is asked for until it is over) summed per
domain and per site. A launch is admitted only if, with it, neither its domain's nor its site's
rate goes above the cap; launches are taken in the planner's order (cheapest placement first
when the domain places ``cheapest``), and one that does not fit is held, not moved to another
site (the next iteration places it again with the room there is then). Only launches are
judged: drains, removals and terminates are never held, so a domain over its cap (the cap was
lowered) always can shrink.

Prices are the catalogue's (``common/config/catalogue.py``): the type's ``price_per_hour``, or
the site's for an instance launched without a type; a site that discovers its sizes prices them
as the driver reported them (``Catalogues.apply_offered`` refreshes the catalogue).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

PAID_STATES = frozenset({"requested", "pending", "started", "joined", "draining", "terminating"})
"""States in which an instance costs money (asked for, up, or not over yet)."""

EPSILON = 1e-9


@dataclass(frozen=True)
class Budget:
    """What the planner needs to hold launches: caps, current rates, and prices."""

    domain_cap: float | None = None
    domain_spend: float = 0.0
    """The domain's spend rate now ($/h of its paid instances)."""
    site_caps: dict[str, float] = field(default_factory=dict)
    site_spend: dict[str, float] = field(default_factory=dict)
    """Each site's spend rate now, over every domain (this iteration's earlier launches included)."""
    prices: dict[tuple[str, str], float] = field(default_factory=dict)
    """(site, instance type) → $/h; (site, "") is the site's own price."""

    @property
    def capped(self) -> bool:
        return self.domain_cap is not None or bool(self.site_caps)


def price(prices: dict[tuple[str, str], float], site: str, instance_type: str) -> float:
    """The hourly price of one instance: its type's, else its site's, else 0 (unknown)."""
    got = prices.get((site, instance_type))
    if got is None:
        got = prices.get((site, ""), 0.0)
    return got


def spend_rate(instances: Iterable[tuple[str, str, str]], prices: dict[tuple[str, str], float]) -> float:
    """$/h of ``instances`` given as (site, instance type, state): the paid ones only."""
    return sum(price(prices, site, typ) for site, typ, state in instances if state in PAID_STATES)


@dataclass
class Admission:
    keep: list[bool]
    """Per launch, in order: admitted (True) or held by a cap."""
    held: int = 0
    why: str = ""
    """Why launches were held ("" = none was): the first cap that held one, with the numbers."""


def admit(launches: list[tuple[str, str]], budget: Budget) -> Admission:
    """Which of ``launches`` ((site, instance type) each, in planning order) fit under the caps."""
    out = Admission([True] * len(launches))
    if not budget.capped:
        return out
    domain = budget.domain_spend
    sites = dict(budget.site_spend)
    for k, (site, typ) in enumerate(launches):
        cost = price(budget.prices, site, typ)
        cap = budget.site_caps.get(site)
        if budget.domain_cap is not None and domain + cost > budget.domain_cap + EPSILON:
            out.keep[k] = False
            out.why = out.why or (f"domain spend {domain:.2f}/h + {cost:.2f}/h would exceed budget_per_hour "
                                  f"{budget.domain_cap:.2f}")
            continue
        if cap is not None and sites.get(site, 0.0) + cost > cap + EPSILON:
            out.keep[k] = False
            out.why = out.why or (f"site {site} spend {sites.get(site, 0.0):.2f}/h + {cost:.2f}/h would exceed "
                                  f"its budget_per_hour {cap:.2f}")
            continue
        domain += cost
        sites[site] = sites.get(site, 0.0) + cost
    out.held = out.keep.count(False)
    if out.held:
        out.why = f"spend cap: {out.held} launch(es) held: {out.why}"
    return out


def price_table(site_prices: dict[str, float], types: dict[str, list]) -> dict[tuple[str, str], float]:  # type: ignore[type-arg]
    """(site, type) → $/h from each site's own price and its catalogue (``InstanceType``s)."""
    out = {(site, ""): p for site, p in site_prices.items()}
    for site, ts in types.items():
        for t in ts:
            out[(site, t.name)] = float(t.price_per_hour)
    return out


def budget_for(domain_cap: float | None, site_caps: dict[str, float], domain_instances: Iterable[object],
               live_per_type: dict[tuple[str, str], int], prices: dict[tuple[str, str], float]) -> Budget | None:
    """The planner's ``Budget`` for one domain's iteration (None when nothing is capped):
    ``domain_instances`` are the domain's ``view.Instance``s, ``live_per_type`` the live
    instances per (site, type) over every domain."""
    if domain_cap is None and not site_caps:
        return None
    spend = spend_rate(((i.site, i.instance_type, i.state) for i in domain_instances), prices)  # type: ignore[attr-defined]
    per_site: dict[str, float] = {}
    for (site, typ), n in live_per_type.items():
        if site in site_caps:
            per_site[site] = per_site.get(site, 0.0) + n * price(prices, site, typ)
    return Budget(domain_cap, spend, dict(site_caps), per_site, prices)
