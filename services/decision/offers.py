"""From the configured catalogues to the packer's offers for one domain. Pure.

A domain may launch every type of the sites it uses, restricted by its partition map: with
``partitions`` set, a type serves exactly the partitions that list it (by ``TYPE`` or
``SITE/TYPE``) and a type no partition lists is not offered; without it, every type serves every
partition. Spot types are offered only when the domain has ``allow_spot``. An offer's room is its
type quota minus the instances of that type live at that site (all domains); each site's room
(its quota minus everything live there) is passed to the packer separately, shared by its types.

Between equal offers (the same type spec and price at several sites: one ``LaunchLine``) the
domain's placement strategy decides, with the sites' backoff and probation (``place_line``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from epu.common.config.catalogue import InstanceType
from epu.common.messages import OfferedType
from epu.services.decision.packing import LaunchLine, Offer
from epu.services.decision.placement import Placement, SiteHealth, SiteInfo, place


def domain_offers(types: Iterable[InstanceType], domain: Any, live: Mapping[tuple[str, str], int] | None = None,
                  *, legacy_cores: int = 1, excluded: frozenset[tuple[str, str]] = frozenset()) -> list[Offer]:
    """Offers of ``types`` (the catalogues of the domain's sites, in rank order) for ``domain`` (a
    ``DomainConfig``). ``live``: (site, type) → live instances; ``excluded``: (site, type)
    offerings out for now (a capacity-error cooldown); ``legacy_cores``: the domain's
    ``cores_per_node``, which a legacy single-type site without ``cores`` has always been
    launched with."""
    live = live or {}
    serves: dict[tuple[str, str], set[str]] = {}
    by_name: dict[str, set[str]] = {}
    for part, refs in domain.partitions.items():
        for ref in refs:
            site, _, name = ref.rpartition("/")
            if site:
                serves.setdefault((site, name), set()).add(part)
            else:
                by_name.setdefault(name, set()).add(part)
    out: list[Offer] = []
    for t in types:
        if t.spot and not domain.allow_spot:
            continue
        if domain.partitions:
            parts = serves.get((t.site, t.name), set()) | by_name.get(t.name, set())
            if not parts:
                continue
            partitions: frozenset[str] | None = frozenset(parts)
        else:
            partitions = None
        cores = max(t.cores, legacy_cores) if t.legacy else t.cores
        room = 0 if (t.site, t.name) in excluded else max(0, t.quota - live.get((t.site, t.name), 0))
        out.append(Offer(t.site, t.name, cores, t.memory_mb or None, t.gpus, frozenset(t.features), partitions,
                         t.price_per_hour, t.spot, room))
    return out


def from_offered(site: str, offered: Iterable[OfferedType]) -> list[InstanceType]:
    """A site's instance types as the provisioner discovered them (``instance.report``'s
    ``offered``: the driver's sizes with the config's overrides), cheapest first like
    ``site_types``; a type offered without a price is unpriced (``InstanceType.priced``)."""
    types = [InstanceType(site, o.name, o.size, o.cores, o.memory_mb, o.gpus, tuple(sorted(o.features)),
                          o.price_per_hour, o.spot, o.quota, o.image, priced=o.priced)
             for o in offered]
    return sorted(types, key=lambda t: (t.price_per_hour, t.name))


def place_line(line: LaunchLine, strategy: str, infos: Mapping[str, SiteInfo], health: Mapping[str, SiteHealth],
               live: Mapping[str, int], unproven: Mapping[str, int], now: float,
               exclude: frozenset[str] = frozenset()) -> tuple[list[tuple[str, str]], Placement]:
    """Break the tie between a line's equal offers with the domain's placement strategy (rank,
    cheapest, spread; backoff and probation): ``placement.place`` over the line's sites, each site
    allowed no more than its own quota (``infos``) and the room of the line's types there.
    Returns (site, type) per placed launch, and the placement (for its ``why``)."""
    rooms: dict[str, list[list]] = {}
    order: list[str] = []
    for o in line.offers:
        if o.site not in order:
            order.append(o.site)
        rooms.setdefault(o.site, []).append([o.type, o.room])
    capped = {}
    for site in order:
        info = infos.get(site, SiteInfo(site))
        type_room = sum(r for _t, r in rooms[site])
        capped[site] = replace(info, quota=min(info.quota, live.get(site, 0) + type_room),
                               price_per_hour=line.price_per_hour)
    placed = place(line.count, order, strategy, capped, dict(health), dict(live), dict(unproven), now, exclude)
    out: list[tuple[str, str]] = []
    for site in placed.sites:
        slot = next(r for r in rooms[site] if r[1] > 0)
        slot[1] -= 1
        out.append((site, slot[0]))
    return out, placed
