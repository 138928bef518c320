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

**An unknown price is never 0** (issue 33, defect 4: a 1.0/h cap let 40 launches of an unpriced
type through). Under a cap, a launch of a type nobody priced (no ``price_per_hour``, a driver
size with ``price=None``) is held with a reason naming the type, and a live instance of such a
type makes the spend it is part of unknown: the launches that cap judges are held until it ends
or gets a price. ``epu config check`` and ``epu policy set`` refuse a cap over unpriced types
(``cap_problems``); this is what holds when the catalogue changes at run time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

PAID_STATES = frozenset({"requested", "pending", "started", "joined", "draining", "terminating"})
"""States in which an instance costs money (asked for, up, or not over yet)."""

EPSILON = 1e-9

Prices = Mapping[tuple[str, str], float | None]
"""(site, instance type) → $/h; (site, "") is the site's own price; None: unpriced."""


@dataclass(frozen=True)
class Budget:
    """What the planner needs to hold launches: caps, current rates, and prices."""

    domain_cap: float | None = None
    domain_spend: float = 0.0
    """The domain's spend rate now ($/h of its paid, priced instances)."""
    site_caps: dict[str, float] = field(default_factory=dict)
    site_spend: dict[str, float] = field(default_factory=dict)
    """Each site's spend rate now, over every domain (this iteration's earlier launches included)."""
    prices: Prices = field(default_factory=dict)
    domain_unpriced: tuple[str, ...] = ()
    """``site/type`` of the domain's paid instances whose price is unknown (its spend is unknown)."""
    site_unpriced: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Capped site → ``site/type`` of its paid instances (any domain) whose price is unknown."""

    @property
    def capped(self) -> bool:
        return self.domain_cap is not None or bool(self.site_caps)


def price(prices: Prices, site: str, instance_type: str) -> float | None:
    """The hourly price of one instance: its type's, else its site's; None when unknown (a type
    or site nobody priced) — never 0 for want of a price."""
    if (site, instance_type) in prices:
        return prices[(site, instance_type)]
    return prices.get((site, ""))


def ref(site: str, instance_type: str) -> str:
    """How a reason names an offering: ``site/type`` (``site`` alone for an untyped launch)."""
    return f"{site}/{instance_type}" if instance_type else site


def spend_rate(instances: Iterable[tuple[str, str, str]], prices: Prices) -> float:
    """$/h of ``instances`` given as (site, instance type, state): the paid, priced ones only
    (``unpriced`` names the others)."""
    total = 0.0
    for site, typ, state in instances:
        if state in PAID_STATES:
            p = price(prices, site, typ)
            if p is not None:
                total += p
    return total


def unpriced(instances: Iterable[tuple[str, str, str]], prices: Prices) -> tuple[str, ...]:
    """``site/type`` of the paid ``instances`` whose price is unknown, sorted, once each."""
    return tuple(sorted({ref(site, typ) for site, typ, state in instances
                         if state in PAID_STATES and price(prices, site, typ) is None}))


@dataclass
class Admission:
    keep: list[bool]
    """Per launch, in order: admitted (True) or held by a cap."""
    held: int = 0
    why: str = ""
    """Why launches were held ("" = none was): the first reason of each kind (a cap with its
    numbers, each unpriced offering by name), up to three."""


def admit(launches: list[tuple[str, str]], budget: Budget) -> Admission:
    """Which of ``launches`` ((site, instance type) each, in planning order) fit under the caps."""
    out = Admission([True] * len(launches))
    if not budget.capped:
        return out
    domain = budget.domain_spend
    sites = dict(budget.site_spend)
    reasons: dict[str, str] = {}  # the first reason of each kind, in order
    for k, (site, typ) in enumerate(launches):
        held = _held(site, typ, budget, domain, sites)
        if held is not None:
            out.keep[k] = False
            reasons.setdefault(*held)
            continue
        cost = price(budget.prices, site, typ) or 0.0  # admitted: priced, or no cap judges it
        domain += cost
        sites[site] = sites.get(site, 0.0) + cost
    out.held = out.keep.count(False)
    if out.held:
        out.why = f"spend cap: {out.held} launch(es) held: {'; '.join(list(reasons.values())[:3])}"
    return out


def _held(site: str, typ: str, budget: Budget, domain: float, sites: dict[str, float]) -> tuple[str, str] | None:
    """Why one launch does not fit, as (its kind, the reason), given the rates with the launches
    admitted so far; None: it fits. Each unpriced offering is a kind of its own, so the reason
    names every type held for want of a price, not only the first cap that held something."""
    cost = price(budget.prices, site, typ)
    cap = budget.site_caps.get(site)
    if budget.domain_cap is not None:
        if cost is None:
            return (f"unpriced {ref(site, typ)}", f"{ref(site, typ)} has no price: the domain's budget_per_hour "
                    f"{budget.domain_cap:.2f} cannot count it (give the type a price_per_hour)")
        if budget.domain_unpriced:
            return ("domain unknown", f"domain spend unknown: live instance(s) of unpriced "
                    f"{', '.join(budget.domain_unpriced)} (budget_per_hour {budget.domain_cap:.2f})")
        if domain + cost > budget.domain_cap + EPSILON:
            return ("domain", f"domain spend {domain:.2f}/h + {cost:.2f}/h would exceed budget_per_hour "
                    f"{budget.domain_cap:.2f}")
    if cap is not None:
        if cost is None:
            return (f"unpriced {ref(site, typ)}", f"{ref(site, typ)} has no price: site {site}'s budget_per_hour "
                    f"{cap:.2f} cannot count it (give the type a price_per_hour)")
        if budget.site_unpriced.get(site):
            return (f"site {site} unknown", f"site {site} spend unknown: live instance(s) of unpriced "
                    f"{', '.join(budget.site_unpriced[site])} (its budget_per_hour {cap:.2f})")
        if sites.get(site, 0.0) + cost > cap + EPSILON:
            return (f"site {site}", f"site {site} spend {sites.get(site, 0.0):.2f}/h + {cost:.2f}/h would exceed "
                    f"its budget_per_hour {cap:.2f}")
    return None


def site_prices(sites: Mapping[str, Any]) -> dict[str, float | None]:
    """Site → its own ``price_per_hour`` (``SiteConfig``s; None: unpriced)."""
    return {name: s.price_per_hour for name, s in sites.items()}


def price_table(site_prices: Mapping[str, float | None],
                types: Mapping[str, Iterable[Any]]) -> dict[tuple[str, str], float | None]:
    """(site, type) → $/h (None: unpriced) from each site's own price and its catalogue
    (``InstanceType``s)."""
    out: dict[tuple[str, str], float | None] = {(site, ""): p for site, p in site_prices.items()}
    for site, ts in types.items():
        for t in ts:
            out[(site, t.name)] = float(t.price_per_hour) if t.priced else None
    return out


def budget_for(domain_cap: float | None, site_caps: dict[str, float], domain_instances: Iterable[object],
               live_per_type: dict[tuple[str, str], int], prices: Prices) -> Budget | None:
    """The planner's ``Budget`` for one domain's iteration (None when nothing is capped):
    ``domain_instances`` are the domain's ``view.Instance``s, ``live_per_type`` the live
    instances per (site, type) over every domain."""
    if domain_cap is None and not site_caps:
        return None
    mine = [(i.site, i.instance_type, i.state) for i in domain_instances]  # type: ignore[attr-defined]
    per_site: dict[str, float] = {}
    site_unknown: dict[str, set[str]] = {}
    for (site, typ), n in live_per_type.items():
        if site in site_caps and n > 0:
            p = price(prices, site, typ)
            if p is None:
                site_unknown.setdefault(site, set()).add(ref(site, typ))
            else:
                per_site[site] = per_site.get(site, 0.0) + n * p
    return Budget(domain_cap, spend_rate(mine, prices), dict(site_caps), per_site, prices,
                  unpriced(mine, prices) if domain_cap is not None else (),
                  {s: tuple(sorted(r)) for s, r in site_unknown.items()})


UNPRICED_RANK = 1e6
"""$/h the packer ranks an unpriced type at under a cap that judges it: after every priced one."""


def rank_unpriced_last(types: list[Any], domain_cap: float | None, site_caps: Mapping[str, float]) -> list[Any]:
    """``types`` (``InstanceType``s) as the packer of a capped domain should see them: an unpriced
    type a cap judges ranked dearer than any priced one. Unpriced, it would sort as free and be
    planned first — then held, every iteration, while a priced type could have served the same
    jobs. Planned anyway (nothing priced fits), it is held with the reason (``admit``)."""
    if not any(not t.priced and (domain_cap is not None or t.site in site_caps) for t in types):
        return types
    return [replace(t, price_per_hour=UNPRICED_RANK)
            if not t.priced and (domain_cap is not None or t.site in site_caps) else t for t in types]


# --------------------------------------------------------------------------- configuration checks
def cap_problems(cap: float, types: Iterable[Any]) -> list[str]:
    """What is wrong with a spend cap ``cap`` over the instance types it judges (``types``:
    ``InstanceType``s), one line each (the caller names the key). One rule for
    ``epu config check`` (the file) and ``epu policy set`` (a run-time change):

    * a type without a price: the cap could not count it (issue 33, defect 4);
    * a cap below the cheapest instance: no launch would ever fit (issue 34).
    """
    types = list(types)
    out = []
    unpriced_refs = sorted(t.ref for t in types if not t.priced)
    if unpriced_refs:
        out.append(f"{cap:g} is set but {', '.join(unpriced_refs)} has no price_per_hour: the cap "
                   "cannot count what it does not know (give each type a price_per_hour)")
    priced = [t for t in types if t.priced]
    if priced:
        cheapest = min(priced, key=lambda t: (t.price_per_hour, t.ref))
        if cap + EPSILON < cheapest.price_per_hour:
            out.append(f"{cap:g} is below the price of one instance of the cheapest type it may launch "
                       f"({cheapest.ref} at {cheapest.price_per_hour:g}/h): no launch would ever fit")
    return out


def domain_cap_problems(domain: Any, types: Mapping[str, Iterable[Any]]) -> list[str]:
    """``cap_problems`` for a domain's ``budget_per_hour`` (``domain``: a ``DomainConfig``) over
    the types it may launch: those of the sites it uses (``types``: site → ``InstanceType``s)
    that its partition map and ``allow_spot`` let it launch (``offers.domain_offers``)."""
    from epu.services.decision.offers import domain_offers

    if domain.budget_per_hour is None:
        return []
    names = list(domain.sites) or list(types)
    candidates = [t for n in names for t in types.get(n, ())]
    allowed = {(o.site, o.type) for o in domain_offers(candidates, domain)}
    return cap_problems(domain.budget_per_hour, [t for t in candidates if (t.site, t.name) in allowed])
