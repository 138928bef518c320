"""Exhaustive reference for the packer (services/decision/packing.py), for small cases only.

``feasible`` decides exactly whether jobs fit on bins (each job's N chunks on N distinct bins that
serve its partition and features and have the resources free); ``optimum`` tries every launch
vector within the rooms, cheapest first, and returns the first that holds every servable job.
Written independently of the packer (no shared code but the input types), so a bug in one is not
hidden by the other.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cache

from epu.common.messages import JobShape
from epu.services.decision.packing import MICRO, Bin, Offer


@dataclass(frozen=True)
class Cap:
    cores: int
    memory: int | None
    gpus: int
    features: frozenset[str]
    partitions: frozenset[str] | None


@dataclass(frozen=True)
class Job:
    nodes: int
    cores: int
    memory: int
    gpus: int
    features: frozenset[str]
    partitions: frozenset[str]


def job_of(s: JobShape, default: str = "") -> Job:
    parts = frozenset(p for p in s.partition.split(",") if p) or (frozenset({default}) if default else frozenset())
    return Job(s.nodes, s.cores, s.memory_mb, s.gpus, frozenset(s.features), parts)


def cap_of(x: Bin | Offer) -> Cap:
    return Cap(x.cores, x.memory_mb, x.gpus, x.features, x.partitions)


def _holds(c: Cap, j: Job) -> bool:
    return ((c.partitions is None or not j.partitions or bool(c.partitions & j.partitions))
            and j.features <= c.features and c.cores >= j.cores and c.gpus >= j.gpus
            and (c.memory is None or not j.memory or c.memory >= j.memory))


def _minus(c: Cap, j: Job) -> Cap:
    return Cap(c.cores - j.cores, None if c.memory is None else c.memory - (j.memory or 0), c.gpus - j.gpus,
               c.features, c.partitions)


def _key(c: Cap) -> tuple:
    return (c.cores, -1 if c.memory is None else c.memory, c.gpus, tuple(sorted(c.features)),
            c.partitions is None, tuple(sorted(c.partitions or ())))


def feasible(jobs: list[Job], bins: list[Cap]) -> bool:
    """Exact: can every job get ``nodes`` distinct bins that hold one chunk each?"""
    order = tuple(sorted(jobs, key=lambda j: (-j.nodes, -j.cores, -j.memory, -j.gpus)))

    @cache
    def go(k: int, state: tuple[Cap, ...]) -> bool:
        if k == len(order):
            return True
        j = order[k]
        fit = [i for i, c in enumerate(state) if _holds(c, j)]
        seen = set()
        for chosen in itertools.combinations(fit, j.nodes):
            sig = tuple(sorted(_key(state[i]) for i in chosen))
            if sig in seen:  # the same choice up to identical bins
                continue
            seen.add(sig)
            nxt = list(state)
            for i in chosen:
                nxt[i] = _minus(state[i], j)
            if go(k + 1, tuple(sorted(nxt, key=_key))):
                return True
        return False

    return go(0, tuple(sorted(bins, key=_key)))


def servable(j: Job, offers: list[Offer]) -> bool:
    return any(_holds(cap_of(o), j) for o in offers)


def optimum(shapes: list[JobShape], supply: list[Bin], offers: list[Offer],
            site_room: dict[str, int] | None = None) -> tuple[int, int] | None:
    """(price in micro-units per hour, instances) of the cheapest launch vector that holds every
    servable demand job, or ``None`` if the rooms allow none."""
    site_room = site_room or {}
    jobs = [job_of(s) for s in shapes if s.demand for _ in range(s.count)]
    jobs = [j for j in jobs if servable(j, offers)]
    base = [cap_of(b) for b in supply]
    vectors = []
    for ts in itertools.product(*[range(o.room + 1) for o in offers]):
        per_site: dict[str, int] = {}
        for o, t in zip(offers, ts, strict=True):
            per_site[o.site] = per_site.get(o.site, 0) + t
        if any(n > site_room.get(s, n) for s, n in per_site.items()):
            continue
        price = sum(t * round(o.price_per_hour * MICRO) for o, t in zip(offers, ts, strict=True))
        vectors.append((price, sum(ts), ts))
    for price, count, ts in sorted(vectors):
        bins = base + [cap_of(o) for o, t in zip(offers, ts, strict=True) for _ in range(t)]
        if feasible(jobs, bins):
            return price, count
    return None
