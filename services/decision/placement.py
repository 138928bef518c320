"""Where launches go: site selection, separate from the policy. Pure.

Strategies over the domain's sites (in the operator's rank order):

* ``rank`` — fill the first site up to its quota, then overflow to the next;
* ``cheapest`` — lowest ``price_per_hour`` first (rank breaks ties), overflow the same way;
* ``spread`` — each launch to the eligible site with the fewest live instances.

A site is *eligible* when it has quota left and is not backing off. Failures (API errors,
boots that stall) back a site off exponentially — ``initial`` (5 min) doubling to ``maximum``
(30 min) — and a success resets it. When the pause is over the site is on *probation*: one
launch at a time until one joins, so a site that keeps eating boots is taken out again after
each failure instead of swallowing every launch (no black hole). A capacity error backs the
site off too, and the engine re-places the launch on the next eligible site at once.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class SiteInfo:
    name: str
    quota: int = 20
    price_per_hour: float = 0.0
    cores: int = 1


@dataclass(frozen=True)
class SiteHealth:
    """Durable per-site failure record (the ``sites`` table)."""

    name: str
    failures: int = 0
    backoff_until: float = 0.0
    last_error: str = ""
    stalls: int = 0

    def backing_off(self, now: float) -> bool:
        return now < self.backoff_until

    @property
    def on_probation(self) -> bool:
        return self.failures > 0


def record_failure(h: SiteHealth, now: float, error: str, *, initial: float = 300.0,
                   maximum: float = 1800.0, stalled: bool = False) -> SiteHealth:
    failures = h.failures + 1
    pause = min(maximum, initial * 2 ** (failures - 1))
    return replace(h, failures=failures, backoff_until=now + pause, last_error=error,
                   stalls=h.stalls + (1 if stalled else 0))


def record_success(h: SiteHealth) -> SiteHealth:
    return replace(h, failures=0, backoff_until=0.0, last_error="")


@dataclass
class Placement:
    sites: list[str]
    """One site per placed launch, in launch order."""
    unplaced: int
    why: list[str]


def place(count: int, order: list[str], strategy: str, infos: dict[str, SiteInfo],
          health: dict[str, SiteHealth], live: dict[str, int], unproven: dict[str, int],
          now: float, exclude: frozenset[str] = frozenset()) -> Placement:
    """Choose a site for each of ``count`` launches.

    ``live``: live instances per site (all domains: the quota is the site's);
    ``unproven``: launches at that site not joined yet (limits a site on probation to one)."""
    live = dict(live)
    unproven = dict(unproven)
    why: list[str] = []
    candidates = []
    for name in order:
        h = health.get(name, SiteHealth(name))
        if name in exclude:
            why.append(f"{name}: excluded (just failed)")
        elif name not in infos:
            why.append(f"{name}: not a configured site")
        elif h.backing_off(now):
            why.append(f"{name}: backing off for {h.backoff_until - now:.0f}s after {h.failures} failure(s)"
                       + (f" ({h.last_error})" if h.last_error else ""))
        else:
            candidates.append(name)
    if strategy == "cheapest":
        rank = {n: i for i, n in enumerate(order)}
        candidates.sort(key=lambda n: (infos[n].price_per_hour, rank[n]))

    def room(name: str) -> int:
        left = infos[name].quota - live.get(name, 0)
        if health.get(name, SiteHealth(name)).on_probation:
            left = min(left, 1 - unproven.get(name, 0))
        return max(0, left)

    chosen: list[str] = []
    if strategy == "spread":
        for _ in range(count):
            open_sites = [n for n in candidates if room(n) > 0]
            if not open_sites:
                break
            site = min(open_sites, key=lambda n: live.get(n, 0))
            chosen.append(site)
            live[site] = live.get(site, 0) + 1
            unproven[site] = unproven.get(site, 0) + 1
    else:  # rank / cheapest: overflow down the ordered list
        for site in candidates:
            take = min(room(site), count - len(chosen))
            chosen += [site] * take
            live[site] = live.get(site, 0) + take
            unproven[site] = unproven.get(site, 0) + take
    unplaced = count - len(chosen)
    if unplaced:
        full = [n for n in candidates if room(n) == 0]
        if full:
            why.append("at quota or on probation: " + ", ".join(full))
        why.append(f"{unplaced} launch(es) could not be placed")
    return Placement(chosen, unplaced, why)
