"""Cost accounting: who paid node-second went to whom. Pure: no I/O, no clock.

One rule, used by ``epu cost`` (from the services' stores, ``epu.cost_sources``) and by
``epu simulate``'s report:

* an instance is **paid** from its launch until it is ``terminated`` or ``failed`` (or the end of
  the period), at the price its record kept from its launch (else the catalogue's);
* at every moment, the paid time of an instance is shared **equally among the jobs running on
  its node** then, each share going to the job's (account, user, partition);
* time with no job on the node (booting, idle, draining, shutting down) goes to the account
  ``(idle)`` — it is the price of elasticity, reported apart rather than spread over the jobs.

So the sum over accounts (``(idle)`` included) is the total cost, by construction. **An unknown
price is never 0**: the node-seconds of an instance nobody priced are counted apart
(``Usage.unpriced_seconds``) and the cost says it is incomplete.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

IDLE = "(idle)"
DIMENSIONS = ("domain", "site", "type", "account", "user", "partition")


@dataclass
class Life:
    """One instance's paid life."""

    instance_id: str
    domain: str
    site: str
    instance_type: str
    start: float
    end: float | None = None
    """None: still live."""
    node_name: str = ""
    seq: int = -1
    price: float | None = None
    """$/h as recorded at its launch (None: take the prices table's)."""


@dataclass(frozen=True)
class Occupancy:
    """A job on an instance's node from ``start`` to ``end``."""

    instance_id: str
    start: float
    end: float
    job_id: str


@dataclass
class Usage:
    node_seconds: float = 0.0
    cost: float = 0.0
    unpriced_seconds: float = 0.0
    """Node-seconds whose price nobody knows: in ``node_seconds``, not in ``cost``."""

    def add(self, seconds: float, price: float | None) -> None:
        self.node_seconds += seconds
        if price is None:
            self.unpriced_seconds += seconds
        else:
            self.cost += seconds / 3600.0 * price

    def merge(self, other: Usage) -> None:
        self.node_seconds += other.node_seconds
        self.cost += other.cost
        self.unpriced_seconds += other.unpriced_seconds


Key = tuple[str, str, str, str, str, str]
"""(domain, site, type, account, user, partition)."""


def life_price(life: Life, prices: dict[tuple[str, str], float | None]) -> float | None:
    """The price one hour of ``life`` is billed at: its own, else its type's, else its site's
    (None: unknown — never 0)."""
    if life.price is not None:
        return life.price
    if (life.site, life.instance_type) in prices:
        return prices[(life.site, life.instance_type)]
    return prices.get((life.site, ""))


def attribute(lives: Iterable[Life], occupancy: Iterable[Occupancy], owners: dict[str, tuple[str, str, str]],
              prices: dict[tuple[str, str], float | None], since: float, until: float) -> dict[Key, Usage]:
    """Node-seconds and cost per key over [since, until) (the module's rule)."""
    by_inst: dict[str, list[Occupancy]] = {}
    for o in occupancy:
        by_inst.setdefault(o.instance_id, []).append(o)
    out: dict[Key, Usage] = {}
    for life in lives:
        a, b = max(life.start, since), min(life.end if life.end is not None else until, until)
        if b <= a:
            continue
        price = life_price(life, prices)
        base = (life.domain, life.site, life.instance_type)
        spans = [(max(o.start, a), min(o.end, b), o.job_id) for o in by_inst.get(life.instance_id, ())]
        spans = [s for s in spans if s[1] > s[0]]
        cuts = sorted({a, b, *(s[0] for s in spans), *(s[1] for s in spans)})
        for lo, hi in zip(cuts, cuts[1:], strict=False):
            jobs = sorted({j for s, e, j in spans if s <= lo and e >= hi})
            if not jobs:
                out.setdefault((*base, IDLE, IDLE, IDLE), Usage()).add(hi - lo, price)
                continue
            share = (hi - lo) / len(jobs)
            for j in jobs:
                acct, user, part = owners.get(j, ("", "", ""))
                out.setdefault((*base, acct, user, part), Usage()).add(share, price)
    return out


def group(usage: dict[Key, Usage], by: list[str]) -> list[tuple[tuple[str, ...], Usage]]:
    """``usage`` summed over the dimensions not in ``by`` (names of ``DIMENSIONS``), sorted by cost."""
    idx = [DIMENSIONS.index(d) for d in by]
    out: dict[tuple[str, ...], Usage] = {}
    for key, u in usage.items():
        out.setdefault(tuple(key[i] for i in idx), Usage()).merge(u)
    return sorted(out.items(), key=lambda kv: (-kv[1].cost, kv[0]))


def total(usage: dict[Key, Usage]) -> Usage:
    t = Usage()
    for u in usage.values():
        t.merge(u)
    return t
