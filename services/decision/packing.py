"""Cheapest fit: which new instances let every pending job start, at the lowest price. Pure.

Inputs: the demand *shapes* (``JobShape``, only ``demand=True`` ones count), the *supply* — bins of
capacity that exist or are on their way (the free part of live nodes, pending instances) — and the
*offers*: instance types of the domain's sites (cores, memory, GPUs, features, partitions they may
serve, price, room left under quotas). Output: a ``Plan`` — launch lines per offer, the new
instances with the jobs each will hold, the gangs of multi-node jobs, the jobs no type can ever
serve (with the constraint that rules them out) and the jobs quotas leave without room.

**The model.** A job of N nodes needs N *distinct* nodes, each with its per-node request (cores,
memory, GPUs, required features, partition) free: N *chunks*. Per shape, chunks are handed to
jobs round-robin (chunk c belongs to job c mod k), so a bin that takes x ≤ k chunks of a shape
holds one chunk of x different jobs, and what is left of a shape is a count of chunks spread as
evenly as possible over its jobs. A job starts once all its chunks are placed.

**The fill.** Bins are visited in a canonical order (existing ones first; see ``Bin.rank``). Each
bin has a fixed *sequence* of entries: every shape it is eligible for (partition, features) and
that fits it, largest shapes first, repeated as many times as it could hold chunks of that shape
(at most the shape's job count). A bin takes its entries in order, skipping shapes with nothing
left, and stops at the first entry that does not fit (*prefix with cut-off*). That rule is what
makes the fill monotone: if demand R ≤ R' (chunk counts per shape), the entries of R are a
subsequence of those of R', so wherever R was cut off R' is cut off no later, and what R leaves
is ≤ what R' leaves, shape by shape. By induction over the bins, adding a bin anywhere in the
order (a free node, a pending instance) leaves ≤ chunks for every later bin. (Greedier rules —
skip the entry that does not fit and go on — are not monotone; an example is in the tests.)

**The choice of new instances.** What the supply leaves is served by new instances. Shapes and
offers split into independent *components* (shapes linked by offers that can serve them). For
each component, offers are tried in a fixed order (several orders are tried, the cheapest plan
wins): offer i takes t of its instances, filled as above, and the rest goes down the chain. T is
the number that absorbs all it can (or its room); t ranges over {0, T−1, T} for the first
``WINDOW_LEVELS`` offers of the chain and is T after. The result is the exact minimum over that
fixed family of plans, scored (jobs left without room, price, instances), lexicographically.
Around it all, the global shape order itself is varied (``ORDERS``) and the best solution wins.

**Monotonicity** (more supply never costs more): the family is fixed by the shapes and offers,
not by the supply; each plan's cost is monotone in the demand it receives (induction along the
chain: if t' was optimal for R' and t' ≥ T(R), take T(R) for R — what it leaves is what t'
leaves of R' or less; if t' < T(R), t' ≥ T(R') − 1 ≥ T(R) − 1 is in R's window; the skip option
is in both), and the supply only lowers the demand. So the chosen plan's score never rises when a
bin is added; with one offer and nothing left without room that is "never more nodes". A
minimum over shape orders keeps it: each order is such a solution. The guarantee holds while no *site*
quota shared by several types (nor ``max_new``) is what binds: those couple the components and are
enforced exactly, but outside the argument. Growing a bin in place (a node freeing cores) is not
covered either: its sequence changes with what fits it.

**Never launched for.** A shape that no offer can ever serve — partition with no types, missing
feature, too many GPUs, too much memory or cores per node — is reported as unsatisfiable with the
constraint and never packed (not even on existing supply: it must not make a node look useful).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from epu.common.messages import JobShape, NodeInfo

WINDOW_LEVELS = 4
"""Offers at the head of a chain whose count may be T−1 or 0 as well as T (3 branches each)."""
MAX_CHAIN = 8
"""Offers kept per component (the most relevant ones for its shapes)."""
MICRO = 1_000_000
"""Prices are compared in micro-units per hour (exact integers: no float ties or drift)."""


@dataclass(frozen=True)
class Bin:
    """Capacity that exists or is on its way: the free part of a live node, or a pending instance."""

    name: str
    cores: int
    memory_mb: int | None = None
    """Free memory, MB; ``None`` = unknown (memory requests are not checked against it)."""
    gpus: int = 0
    features: frozenset[str] = frozenset()
    partitions: frozenset[str] | None = None
    """Partitions the node serves; ``None`` = any."""
    rank: int = 0
    """Visit order class: 0 busy nodes with spare room, 1 idle nodes, 2 pending instances."""
    price_per_hour: float = 0.0
    """What keeping it costs: among equals, cheaper bins are filled first, so the expensive idle
    ones are those left unused (and drained)."""


@dataclass(frozen=True)
class Offer:
    """One instance type at one site, as a domain may launch it."""

    site: str
    type: str
    cores: int
    memory_mb: int | None = None
    """``None`` = unknown (not a constraint)."""
    gpus: int = 0
    features: frozenset[str] = frozenset()
    partitions: frozenset[str] | None = None
    """Partitions it may serve; ``None`` = any."""
    price_per_hour: float = 0.0
    spot: bool = False
    room: int = 0
    """Instances of this type that may still be launched at this site (type quota − live)."""

    @property
    def spec(self) -> tuple:
        return (self.cores, self.memory_mb, self.gpus, self.features, self.partitions,
                round(self.price_per_hour * MICRO), self.spot)


@dataclass(frozen=True)
class LaunchLine:
    """New instances of equal offers (same resources, features, partitions, price, spot). Which
    of the offers' sites gets each is placement's business (rank/cheapest/spread, backoff):
    ``allocation`` is one choice within every quota, ``offers`` all the candidates."""

    offers: tuple[Offer, ...]
    count: int
    allocation: tuple[tuple[str, str, int], ...]
    """(site, type, count) within type and site quotas."""

    @property
    def price_per_hour(self) -> float:
        return self.offers[0].price_per_hour

    @property
    def type(self) -> str:
        return self.offers[0].type


@dataclass(frozen=True)
class NewInstance:
    line: int
    """Index into ``Plan.lines``."""
    site: str
    type: str
    holds: tuple[tuple[int, int], ...]
    """(shape index into ``Plan.shapes``, chunks) this instance is planned to run."""


@dataclass(frozen=True)
class Gang:
    """New instances that must all come up for ``jobs`` multi-node jobs of one shape to start."""

    shape: int
    jobs: int
    instances: tuple[int, ...]
    """Indices into ``Plan.instances``."""
    on_supply: int = 0
    """Nodes of each such job placed on existing supply (the rest are the new instances)."""


@dataclass(frozen=True)
class Unsatisfiable:
    shape: JobShape
    jobs: int
    constraint: str
    """partition, feature, gpus, memory, cores or combination (a metric label)."""
    reason: str


@dataclass(frozen=True)
class Unplaced:
    shape: JobShape
    jobs: int
    reason: str


@dataclass
class Plan:
    shapes: list[JobShape]
    """The packed requests (demand shapes with the same request merged), indexed by the rest."""
    lines: list[LaunchLine] = field(default_factory=list)
    runs: list[tuple[int, str, str, tuple[tuple[int, int], ...], int]] = field(default_factory=list)
    """New instances, run-length encoded in launch order: (line, site, type, holds, how many)."""
    gangs: list[Gang] = field(default_factory=list)
    unsatisfiable: list[Unsatisfiable] = field(default_factory=list)
    unplaced: list[Unplaced] = field(default_factory=list)
    supply_holds: dict[str, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    """Bins the plan puts pending jobs on → (shape index, chunks) each is planned to run."""
    unused_supply: frozenset[str] = frozenset()
    """Bins no pending (satisfiable) job could use: removing them changes nothing in the plan."""
    jobs_on_supply: int = 0
    """Jobs that start on existing supply alone."""

    @property
    def used_supply(self) -> frozenset[str]:
        return frozenset(self.supply_holds)

    @property
    def new_instances(self) -> int:
        return sum(line.count for line in self.lines)

    @cached_property
    def instances(self) -> list[NewInstance]:
        """One entry per new instance (``Gang.instances`` index this list)."""
        return [NewInstance(line, site, typ, held) for line, site, typ, held, n in self.runs for _ in range(n)]

    @property
    def cost_per_hour(self) -> float:
        return sum(line.count * line.price_per_hour for line in self.lines)

    def by_type(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for line in self.lines:
            out[line.type] = out.get(line.type, 0) + line.count
        return out


# ------------------------------------------------------------------------------------------ shapes


@dataclass
class _Shape:
    """A packed request: demand shapes with the same per-node request, merged."""

    cores: int
    memory_mb: int
    gpus: int
    features: frozenset[str]
    partitions: frozenset[str]
    """Empty = any partition."""
    nodes: int
    jobs: int
    source: JobShape

    @property
    def chunks(self) -> int:
        return self.nodes * self.jobs


def _partitions(shape: JobShape, default: str) -> frozenset[str]:
    names = frozenset(p.strip() for p in shape.partition.split(",") if p.strip())
    return names or (frozenset({default}) if default else frozenset())


def _requests(shapes: Iterable[JobShape], default_partition: str) -> list[_Shape]:
    merged: dict[tuple, _Shape] = {}
    for s in shapes:
        if not s.demand:
            continue
        parts = _partitions(s, default_partition)
        key = (s.nodes, s.cores, s.memory_mb, s.gpus, tuple(sorted(s.features)), tuple(sorted(parts)))
        m = merged.get(key)
        if m is None:
            merged[key] = _Shape(s.cores, s.memory_mb, s.gpus, frozenset(s.features), parts, s.nodes, s.count,
                                 s.model_copy(update={"count": s.count, "reason": s.reason}))
        else:
            m.jobs += s.count
            m.source = m.source.model_copy(update={"count": m.jobs, "max_wait_s": max(m.source.max_wait_s,
                                                                                     s.max_wait_s)})
    return list(merged.values())


def _chunk_price(s: _Shape, offers: Sequence[Offer]) -> float:
    """The least a chunk of ``s`` costs on new instances (price / chunks one instance holds)."""
    best = math.inf
    for o in offers:
        if _serves(s, o.features, o.partitions):
            q = min(_fits(s, o.cores, o.memory_mb, o.gpus), s.jobs)
            if q:
                best = min(best, o.price_per_hour / q)
    return best


def _order(shapes: list[_Shape], offers: Sequence[Offer], order: str) -> list[_Shape]:
    """The global shape order (see ``ORDERS``). Fixed by the shapes and offers, never by the
    supply: the monotonicity argument needs one order for every supply."""
    cmax = max((s.cores for s in shapes), default=1) or 1
    mmax = max((s.memory_mb for s in shapes), default=1) or 1
    price = {id(s): _chunk_price(s, offers) for s in shapes}

    def size(s: _Shape) -> float:
        return s.cores / cmax + s.memory_mb / mmax

    def rest(s: _Shape) -> tuple:
        return (-s.nodes, -s.cores, -s.memory_mb, sorted(s.features), sorted(s.partitions))

    keys = {
        "size": lambda s: (-s.gpus, -size(s), *rest(s)),
        "price": lambda s: (-price[id(s)], -size(s), *rest(s)),
        "specific": lambda s: (-s.gpus, -len(s.features) - bool(s.partitions), -size(s), *rest(s)),
    }
    return sorted(shapes, key=keys[order])


def _serves(s: _Shape, features: frozenset[str], partitions: frozenset[str] | None) -> bool:
    return (partitions is None or not s.partitions or bool(s.partitions & partitions)) and s.features <= features


def _fits(s: _Shape, cores: int, memory: int | None, gpus: int) -> int:
    """How many chunks of ``s`` fit in that capacity."""
    q = cores // s.cores
    if s.memory_mb and memory is not None:
        q = min(q, memory // s.memory_mb)
    if s.gpus:
        q = min(q, gpus // s.gpus)
    return max(q, 0)


def why_unservable(s: _Shape, offers: Sequence[Offer]) -> tuple[str, str] | None:
    """(constraint, reason) when no offer can ever hold one chunk of ``s``; ``None`` otherwise."""
    if not offers:
        return "partition", "no instance types are configured for this domain"
    where = f"partition {'/'.join(sorted(s.partitions))}" if s.partitions else "any partition"
    cands = [o for o in offers if o.partitions is None or not s.partitions or s.partitions & o.partitions]
    if not cands:
        return "partition", f"{where} has no instance types"
    feats = [o for o in cands if s.features <= o.features]
    if not feats:
        return "feature", (f"no instance type for {where} provides feature(s) "
                           f"{', '.join(sorted(s.features))}")
    checks: list[tuple[str, Any, str]] = [
        ("gpus", lambda o: o.gpus >= s.gpus, f"{s.gpus} GPU(s) per node; the most any type for {where} has is "
         f"{max(o.gpus for o in feats)}"),
        ("memory", lambda o: o.memory_mb is None or not s.memory_mb or o.memory_mb >= s.memory_mb,
         f"{s.memory_mb} MB per node; the most any type for {where} has is "
         f"{max((o.memory_mb or 0) for o in feats)} MB"),
        ("cores", lambda o: o.cores >= s.cores, f"{s.cores} cores per node; the most any type for {where} has is "
         f"{max(o.cores for o in feats)}"),
    ]
    for constraint, ok, text in checks:
        if not any(ok(o) for o in feats):
            return constraint, f"needs {text}"
    if not any(_fits(s, o.cores, o.memory_mb, o.gpus) for o in feats):
        return "combination", (f"no type for {where} has {s.cores} cores, {s.memory_mb} MB and {s.gpus} GPU(s) "
                               "per node together")
    return None


def can_serve(shape: JobShape, offer: Offer, default_partition: str = "") -> bool:
    """Could one instance of ``offer`` hold one node of a ``shape`` job (partition, features,
    cores, memory, GPUs)?"""
    return all(why_unservable(s, [offer]) is None for s in _requests([shape.model_copy(update={"demand": True})],
                                                                     default_partition))


# ------------------------------------------------------------------------------------------ the fill


class _Seq:
    """A bin spec's entry sequence: (shape index, entries) in the global shape order."""

    __slots__ = ("entries", "cores", "memory", "gpus")

    def __init__(self, entries: list[tuple[int, int]], cores: int, memory: int | None, gpus: int) -> None:
        self.entries = entries
        self.cores = cores
        self.memory = memory
        self.gpus = gpus


def _sequence(shapes: list[_Shape], cores: int, memory: int | None, gpus: int,
              features: frozenset[str], partitions: frozenset[str] | None) -> _Seq:
    entries = []
    for i, s in enumerate(shapes):
        if _serves(s, features, partitions):
            q = _fits(s, cores, memory, gpus)
            if q:
                entries.append((i, min(q, s.jobs)))
    return _Seq(entries, cores, memory, gpus)


def _one_bin(seq: _Seq, shapes: list[_Shape], rho: list[int]) -> list[tuple[int, int]]:
    """What one bin of ``seq`` takes from ``rho`` (prefix with cut-off). Does not change ``rho``."""
    c, m, g = seq.cores, seq.memory, seq.gpus
    took: list[tuple[int, int]] = []
    for i, cnt in seq.entries:
        left = rho[i]
        if not left:
            continue
        avail = cnt if cnt < left else left
        s = shapes[i]
        x = c // s.cores
        if s.memory_mb and m is not None:
            x = min(x, m // s.memory_mb)
        if s.gpus:
            x = min(x, g // s.gpus)
        if x > avail:
            x = avail
        if x > 0:
            took.append((i, x))
            c -= x * s.cores
            if s.memory_mb and m is not None:
                m -= x * s.memory_mb
            g -= x * s.gpus
        if x < avail:
            break  # the cut-off: the next entry does not fit
    return took


def _fill(seq: _Seq, shapes: list[_Shape], rho: list[int], bins: int | None) -> list[tuple[list[tuple[int, int]], int]]:
    """Fill up to ``bins`` identical bins of ``seq`` (``None``: as many as take something) one
    after the other; update ``rho``; return the patterns as (taken, how many bins in a row).

    Identical bins take the same pattern while no shape's available entries change, so runs are
    applied at once: a shape whose remaining chunks stay at or above its entry count keeps its
    entries for ``(left − entries) // taken + 1`` bins."""
    out: list[tuple[list[tuple[int, int]], int]] = []
    left_bins = math.inf if bins is None else bins
    cnt_of = dict(seq.entries)
    while left_bins > 0:
        took = _one_bin(seq, shapes, rho)
        if not took:
            break
        run = left_bins
        for i, x in took:
            cnt = cnt_of[i]
            r = rho[i]
            run = min(run, (r - cnt) // x + 1 if r >= cnt else 1)
        for i, x in took:
            rho[i] -= run * x
        out.append((took, int(run)))
        left_bins -= run
    return out


# ------------------------------------------------------------------------------------------ the chain


@dataclass
class _Class:
    """Equal offers, in rank order."""

    offers: list[Offer]
    seq: _Seq
    price: int
    """Micro-units per hour."""

    @property
    def head(self) -> Offer:
        return self.offers[0]


def _room(cls: _Class, used: dict[str, int], site_room: Mapping[str, int], max_new: int | None) -> int:
    total = sum(n for _o, n in _allocate(cls, None, used, site_room))
    if max_new is not None:
        total = min(total, max(0, max_new - used.get("", 0)))
    return total


def _allocate(cls: _Class, t: int | None, used: dict[str, int],
              site_room: Mapping[str, int]) -> list[tuple[Offer, int]]:
    """Up to ``t`` (``None``: as many as allowed) instances over the class's offers in rank order,
    within each type's room and each site's room (shared by its types)."""
    out = []
    taken: dict[str, int] = {}
    for o in cls.offers:
        if t is not None and t <= 0:
            break
        site_left = site_room.get(o.site, math.inf) - used.get(o.site, 0) - taken.get(o.site, 0)
        take = max(0, min(o.room, site_left))
        if t is not None:
            take = min(take, t)
            t -= take
        if take:
            out.append((o, int(take)))
            taken[o.site] = taken.get(o.site, 0) + int(take)
    return out


Score = tuple[int, int, int]
"""(jobs left without room, price in micro-units per hour, instances)."""


class _Chain:
    """The exact minimum over the fixed family of plans of one component (see the module doc)."""

    def __init__(self, shapes: list[_Shape], members: list[int], classes: list[_Class], order: list[int],
                 site_room: Mapping[str, int], max_new: int | None) -> None:
        self.shapes = shapes
        self.members = members
        self.classes = classes
        self.order = order
        self.site_room = site_room
        self.max_new = max_new
        self.memo: dict[tuple, tuple[Score, tuple[int, ...]]] = {}

    def left_jobs(self, rho: list[int]) -> int:
        return sum(min(self.shapes[i].jobs, rho[i]) for i in self.members if rho[i])

    def best(self, level: int, rho: list[int], used: dict[str, int]) -> tuple[Score, tuple[int, ...]]:
        """(score, counts per level) of the cheapest plan for ``rho`` from ``level`` on."""
        if level == len(self.order) or not any(rho[i] for i in self.members):
            return (self.left_jobs(rho), 0, 0), ()
        key = (level, tuple(rho[i] for i in self.members), tuple(sorted(used.items())))
        hit = self.memo.get(key)
        if hit is not None:
            return hit
        cls = self.classes[self.order[level]]
        room = _room(cls, used, self.site_room, self.max_new)
        after = list(rho)
        runs = _fill(cls.seq, self.shapes, after, room)
        t_full = sum(n for _p, n in runs)
        options: list[tuple[int, list[int]]] = [(t_full, after)]
        if level < WINDOW_LEVELS and t_full > 0:
            options.append((0, rho))
            if t_full > 1:
                before_last = list(after)
                for i, x in runs[-1][0]:
                    before_last[i] += x
                options.append((t_full - 1, before_last))
        best: tuple[Score, tuple[int, ...]] | None = None
        for t, rest in options:
            nused = dict(used)
            for o, n in _allocate(cls, t, used, self.site_room):
                nused[o.site] = nused.get(o.site, 0) + n
            nused[""] = nused.get("", 0) + t
            (left, price, count), tail = self.best(level + 1, rest, nused)
            cand = ((left, price + t * cls.price, count + t), (t, *tail))
            if best is None or cand[0] < best[0]:
                best = cand
        assert best is not None
        self.memo[key] = best
        return best


def _orders(classes: list[_Class], idx: list[int]) -> list[list[int]]:
    """The chain orders tried: cheapest instance first; cheapest per core first; cheapest per
    unit of size (cores, memory and GPUs relative to the largest offer) first."""
    cmax = max(classes[i].head.cores for i in idx) or 1
    mmax = max((classes[i].head.memory_mb or 0) for i in idx) or 1
    gmax = max(classes[i].head.gpus for i in idx) or 1

    def size(i: int) -> float:
        h = classes[i].head
        return h.cores / cmax + (h.memory_mb or 0) / mmax + h.gpus / gmax

    out: list[list[int]] = []
    for key in (lambda i: (classes[i].price, i),
                lambda i: (classes[i].price / classes[i].head.cores, classes[i].price, i),
                lambda i: (classes[i].price / size(i), classes[i].price, i)):
        o = sorted(idx, key=key)
        if o not in out:
            out.append(o)
    return out


def _relevant(shapes: list[_Shape], members: list[int], classes: list[_Class], idx: list[int]) -> list[int]:
    """At most ``MAX_CHAIN`` offers for a component: for each shape, the cheapest per chunk when
    full, the cheapest that holds one chunk, and the cheapest to hold all of the shape alone;
    then the cheapest others. Fixed by the shapes and offers (not by the supply)."""
    if len(idx) <= MAX_CHAIN:
        return idx
    keep: list[int] = []

    def add(i: int | None) -> None:
        if i is not None and i not in keep:
            keep.append(i)

    for m in members:
        s = shapes[m]
        cap = {i: min(_fits(s, classes[i].head.cores, classes[i].head.memory_mb, classes[i].head.gpus), s.jobs)
               for i in idx if _serves(s, classes[i].head.features, classes[i].head.partitions)}
        cap = {i: q for i, q in cap.items() if q > 0}
        if not cap:
            continue
        add(min(cap, key=lambda i: (classes[i].price / cap[i], i)))
        add(min(cap, key=lambda i: (classes[i].price, i)))
        add(min(cap, key=lambda i: (classes[i].price * -(-s.chunks // cap[i]), i)))
        if len(keep) >= MAX_CHAIN:
            break
    for i in sorted(idx, key=lambda i: (classes[i].price, i)):
        if len(keep) >= MAX_CHAIN:
            break
        add(i)
    return sorted(keep[:MAX_CHAIN])


# ------------------------------------------------------------------------------------------ pack


ORDERS = ("size", "price")
"""Shape orders tried (each a whole solution; the best wins — a minimum of monotone solutions
is monotone): ``size`` largest request first (GPUs, then cores and memory); ``price`` the shapes
dearest to launch for first (what existing capacity saves most on)."""


@dataclass
class _Solution:
    score: Score
    ordered: list[_Shape]
    classes: list[_Class]
    counts: list[tuple[_Chain, tuple[int, ...]]]
    rho: list[int]
    """Chunks left per shape after the existing supply."""
    holds: dict[str, tuple[tuple[int, int], ...]]
    unused_bins: list[str]


def pack(shapes: Iterable[JobShape], supply: Sequence[Bin], offers: Sequence[Offer], *,
         site_room: Mapping[str, int] | None = None, max_new: int | None = None,
         default_partition: str = "", orders: Sequence[str] = ORDERS) -> Plan:
    """The cheapest set of new instances that, with ``supply``, lets every satisfiable demand job
    start (see the module doc). ``site_room``: instances each site may still take (all types);
    ``max_new``: new instances the domain may still take; ``default_partition``: the partition of
    a job that names none."""
    site_room = dict(site_room or {})
    servable, unsatisfiable = _split(_requests(shapes, default_partition), offers)
    bins = sorted(supply, key=lambda b: (b.rank, round(b.price_per_hour * MICRO), b.cores, b.memory_mb or 0, b.gpus,
                                         sorted(b.features), sorted(b.partitions or ()), b.partitions is None,
                                         b.name))
    best: _Solution | None = None
    for order in orders:
        sol = _solve(_order(servable, offers, order), bins, offers, site_room, max_new)
        if best is None or sol.score < best.score:
            best = sol
    assert best is not None
    plan = Plan(shapes=[s.source for s in best.ordered], unsatisfiable=unsatisfiable,
                supply_holds=best.holds, unused_supply=frozenset(best.unused_bins))
    on_supply = [s.chunks - r for s, r in zip(best.ordered, best.rho, strict=True)]
    plan.jobs_on_supply = sum(_complete_jobs(s, placed) for s, placed in zip(best.ordered, on_supply, strict=True))
    _materialize(plan, best.ordered, best.classes, best.counts, list(best.rho), on_supply, site_room)
    return plan


def _split(requests: list[_Shape], offers: Sequence[Offer]) -> tuple[list[_Shape], list[Unsatisfiable]]:
    servable: list[_Shape] = []
    unsatisfiable: list[Unsatisfiable] = []
    for s in requests:
        why = why_unservable(s, offers)
        if why is None:
            servable.append(s)
        else:
            unsatisfiable.append(Unsatisfiable(s.source, s.jobs, why[0], why[1]))
    return servable, unsatisfiable


def unservable(shapes: Iterable[JobShape], offers: Sequence[Offer], default_partition: str = "") -> list[Unsatisfiable]:
    """The demand jobs no offer can ever serve, per merged shape, with the constraint (what ``pack``
    reports as ``unsatisfiable``, without packing anything)."""
    return _split(_requests(shapes, default_partition), offers)[1]


def _solve(ordered: list[_Shape], bins: list[Bin], offers: Sequence[Offer], site_room: Mapping[str, int],
           max_new: int | None) -> _Solution:
    rho = [s.chunks for s in ordered]
    # 1. existing supply, in canonical order; identical bins in a row are filled as one run
    seqs: dict[tuple, _Seq] = {}
    holds: dict[str, tuple[tuple[int, int], ...]] = {}
    unused_bins: list[str] = []
    k = 0
    while k < len(bins):
        b = bins[k]
        spec = (b.cores, b.memory_mb, b.gpus, b.features, b.partitions)
        j = k + 1
        while j < len(bins) and bins[j].rank == b.rank and bins[j].price_per_hour == b.price_per_hour and \
                (bins[j].cores, bins[j].memory_mb, bins[j].gpus, bins[j].features, bins[j].partitions) == spec:
            j += 1
        seq = seqs.get(spec)
        if seq is None:
            seq = seqs[spec] = _sequence(ordered, b.cores, b.memory_mb, b.gpus, b.features, b.partitions)
        at = k
        for pattern, n in _fill(seq, ordered, rho, j - k):
            held = tuple(pattern)
            for x in bins[at:at + n]:
                holds[x.name] = held
            at += n
        unused_bins += [x.name for x in bins[at:j]]
        k = j

    # 2. new instances, per component of shapes linked by the offers that serve them
    groups: dict[tuple, list[Offer]] = {}
    for o in offers:
        groups.setdefault(o.spec, []).append(o)
    classes = [_Class(g, _sequence(ordered, g[0].cores, g[0].memory_mb, g[0].gpus, g[0].features, g[0].partitions),
                      round(g[0].price_per_hour * MICRO)) for g in groups.values()]
    serving: list[list[int]] = [[] for _ in ordered]
    for ci, c in enumerate(classes):
        for si, _n in c.seq.entries:
            serving[si].append(ci)
    used: dict[str, int] = {}
    counts: list[tuple[_Chain, tuple[int, ...]]] = []
    total = (0, 0, 0)
    for members in _components([i for i in range(len(ordered)) if rho[i]], serving):
        idx = _relevant(ordered, members, classes, sorted({ci for m in members for ci in serving[m]}))
        best: tuple[Score, _Chain, tuple[int, ...]] | None = None
        for order in _orders(classes, idx):
            chain = _Chain(ordered, members, classes, order, site_room, max_new)
            score, ts = chain.best(0, list(rho), dict(used))
            if best is None or score < best[0]:
                best = (score, chain, ts)
        assert best is not None
        score, chain, ts = best
        total = (total[0] + score[0], total[1] + score[1], total[2] + score[2])
        counts.append((chain, ts))
        for level, t in enumerate(ts):  # the rooms this component's plan takes
            for o, n in _allocate(classes[chain.order[level]], t, used, site_room):
                used[o.site] = used.get(o.site, 0) + n
            used[""] = used.get("", 0) + t
    return _Solution(total, ordered, classes, counts, rho, holds, unused_bins)


def _components(active: list[int], serving: list[list[int]]) -> list[list[int]]:
    parent = {i: i for i in active}

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[int, int] = {}
    for i in active:
        for ci in serving[i]:
            if ci in owner:
                a, b = find(owner[ci]), find(i)
                if a != b:
                    parent[max(a, b)] = min(a, b)
            else:
                owner[ci] = i
    out: dict[int, list[int]] = {}
    for i in active:
        out.setdefault(find(i), []).append(i)
    return [out[r] for r in sorted(out)]


def _materialize(plan: Plan, shapes: list[_Shape], classes: list[_Class],
                 counts: list[tuple[_Chain, tuple[int, ...]]], rho: list[int], on_supply: list[int],
                 site_room: Mapping[str, int]) -> None:
    """Replay the chosen chains: launch lines, runs of identical instances, gangs, unplaced.
    Everything stays run-length encoded (36,000 new instances are a few hundred runs)."""
    used: dict[str, int] = {}
    pointer = list(on_supply)  # next chunk index per shape (chunk c belongs to job c mod jobs)
    slots: dict[int, list[tuple[int, int, int, int]]] = {}  # multi-node shape → (first chunk, x, bins, inst)
    inst = 0
    for chain, ts in counts:
        for level, t in enumerate(ts):
            if not t:
                continue
            cls = classes[chain.order[level]]
            alloc = _allocate(cls, t, used, site_room)
            for o, n in alloc:
                used[o.site] = used.get(o.site, 0) + n
            line = len(plan.lines)
            plan.lines.append(LaunchLine(tuple(cls.offers), t, tuple((o.site, o.type, n) for o, n in alloc)))
            sites = [[o.site, o.type, n] for o, n in alloc]
            at = 0
            for took, run in _fill(cls.seq, shapes, rho, t):
                held = tuple(took)
                for i, x in took:
                    if shapes[i].nodes > 1:
                        slots.setdefault(i, []).append((pointer[i], x, run, inst))
                    pointer[i] += x * run
                inst += run
                while run:  # split the run at the allocation's site boundaries
                    site = sites[at]
                    n = min(run, site[2])
                    plan.runs.append((line, site[0], site[1], held, n))
                    site[2] -= n
                    run -= n
                    if not site[2]:
                        at += 1
            assert at == len(sites), "a chosen count never exceeds what the offer absorbs"
    for i, s in enumerate(shapes):
        left = min(s.jobs, rho[i])
        if left:
            plan.unplaced.append(Unplaced(s.source, left, "no room left under the quotas (type, site or "
                                          "max_nodes) of the types that can serve it"))
        if i not in slots:
            continue
        jobs_gangs: dict[int, list[int]] = {}
        for first, x, bins, inst0 in slots[i]:
            for b in range(bins):
                for c in range(first + b * x, first + (b + 1) * x):
                    jobs_gangs.setdefault(c % s.jobs, []).append(inst0 + b)
        gangs: dict[tuple[int, ...], int] = {}
        for j, insts in jobs_gangs.items():
            if len(insts) + _chunks_of_job(s, on_supply[i], j) == s.nodes:
                key = tuple(insts)
                gangs[key] = gangs.get(key, 0) + 1
        for insts, jobs in sorted(gangs.items()):
            plan.gangs.append(Gang(i, jobs, insts, s.nodes - len(insts)))


def _chunks_of_job(s: _Shape, placed: int, job: int) -> int:
    """Chunks of job ``job`` among the first ``placed`` chunk indices (round-robin)."""
    return placed // s.jobs + (1 if job < placed % s.jobs else 0)


def _complete_jobs(s: _Shape, placed: int) -> int:
    """Jobs all of whose chunks are among the first ``placed`` (round-robin)."""
    if placed >= s.chunks:
        return s.jobs
    full, extra = divmod(placed, s.jobs)
    return extra if full == s.nodes - 1 else 0


# ------------------------------------------------------------------------------------------ scale-down


@dataclass
class DrainCheck:
    drain: list[str]
    """Candidates no pending demand job could use: the plan is the same without them."""
    keep: dict[str, str]
    """Candidate → why it stays (the pending jobs the plan puts there)."""


def drainable(plan: Plan, candidates: Iterable[str]) -> DrainCheck:
    """Scale-down by simulation: of the ``candidates`` (idle nodes of ours, by bin name), those the
    plan leaves unused may all be drained at once — removing bins that took nothing leaves every
    later bin the same demand, so the plan without them is the same plan (tested). A node only
    held, dependent, limit-blocked or unsatisfiable jobs could use is unused: those jobs are not
    in the plan. A candidate that is not in the supply at all is not drained (nothing says it is
    idle)."""
    drain: list[str] = []
    keep: dict[str, str] = {}
    for name in candidates:
        held = plan.supply_holds.get(name)
        if held is not None:
            jobs = ", ".join(f"{x} x {describe_shape(plan.shapes[i])}" for i, x in held)
            keep[name] = f"pending jobs would run there: {jobs}"
        elif name in plan.unused_supply:
            drain.append(name)
        else:
            keep[name] = "not in the supply (not free, or unknown)"
    return DrainCheck(drain, keep)


def describe_shape(s: JobShape) -> str:
    parts = [f"{s.nodes}x{s.cores}c" if s.nodes > 1 else f"{s.cores}c"]
    if s.memory_mb:
        parts.append(f"{s.memory_mb}MB")
    if s.gpus:
        parts.append(f"{s.gpus}gpu")
    if s.features:
        parts.append("+".join(s.features))
    if s.partition:
        parts.append(f"@{s.partition}")
    return " ".join(parts)


# ------------------------------------------------------------------------------------------ supply


def bins_from_nodes(nodes: Iterable[NodeInfo], *, now: float | None = None, boot_seconds: float = 0.0,
                    jobs_end_at: Mapping[str, float] | None = None,
                    prices: Mapping[str, float] | None = None) -> list[Bin]:
    """Supply from live batch nodes: the free part of every node that can take a job (free, or
    busy with room), as a bin. A busy node whose running jobs all end within ``boot_seconds`` of
    ``now`` (``jobs_end_at``: node → when its last running job ends, from the time limits) counts
    as wholly free: a replacement would not boot sooner, so it is not worth launching one."""
    ends = jobs_end_at or {}
    prices = prices or {}
    out = []
    for n in nodes:
        if n.state not in ("free", "busy"):
            continue
        soon = now is not None and n.name in ends and ends[n.name] - now <= boot_seconds
        cores = n.cores if soon else n.cores - n.cores_used
        memory = None if not n.memory_mb else (n.memory_mb if soon else max(0, n.memory_mb - n.memory_used_mb))
        gpus = n.gpus if soon else max(0, n.gpus - n.gpus_used)
        if cores <= 0:
            continue
        idle = n.state == "free" and not n.jobs and not n.cores_used
        out.append(Bin(n.name, cores, memory, gpus, frozenset(n.features),
                       frozenset(n.partitions) if n.partitions else None, rank=1 if idle else 0,
                       price_per_hour=prices.get(n.name, 0.0)))
    return out


def bin_of_offer(name: str, offer: Offer) -> Bin:
    """A pending instance of a known type: the whole type is on its way."""
    return Bin(name, offer.cores, offer.memory_mb, offer.gpus, offer.features, offer.partitions, rank=2,
               price_per_hour=offer.price_per_hour)
