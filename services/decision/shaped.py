"""Demand by shapes for one iteration of one domain: the packer run on the view. Pure.

A domain whose sites have instance-type catalogues (or whose partitions map to types) decides
with the packer (``packing.pack``, docs/demand.md) instead of the cores-only counter
(``demand.nodes_needed``): what to launch is the cheapest set of typed instances that lets every
satisfiable pending job start, and what to drain is what that plan leaves unused
(``packing.drainable``). A domain of single-type sites keeps the counter, exactly as before
(``Catalogue`` is then ``None`` on the view).

The supply the packer sees, in its visiting order: the free part of every live batch node (busy
ones with room, then idle ones, cheaper first so the dearer idle ones are those left to drain),
the nodes of ours drained for scale-down that could be put back online (reclaimed if the plan
uses them, instead of launching), and every pending instance as a whole bin of its type.

Policies take what they need from ``ShapedDemand``: queue-demand the plan's launches and drains;
threshold, spare and load their own counts, filled with the plan's launches first and then the
``filler`` type (the cheapest that holds every pending shape); fixed only the filler.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from epu.common.config.catalogue import InstanceType
from epu.common.retire import RetireReason
from epu.services.decision.actions import Launch
from epu.services.decision.offers import domain_offers
from epu.services.decision.packing import (
    Bin,
    Offer,
    Plan,
    Unsatisfiable,
    bin_of_offer,
    bins_from_nodes,
    can_serve,
    describe_shape,
    drainable,
    pack,
)
from epu.services.decision.view import DomainView, Instance


@dataclass(frozen=True)
class Catalogue:
    """What a domain may launch this iteration (built by the engine from the sites' catalogues)."""

    offers: tuple[Offer, ...]
    """The domain's offers with their room now (an offering in a capacity-error cooldown has 0)."""
    site_room: Mapping[str, int] = field(default_factory=dict)
    """Instances each site may still take, all types together (site quota − live)."""
    default_partition: str = ""
    known: Mapping[tuple[str, str], Offer] = field(default_factory=dict)
    """(site, type) → offer, including offers without room: pending instances become bins of
    their type, and our nodes are priced by it."""
    boot_seconds: float = 0.0
    """A busy node whose running jobs all end within this long counts as free (a replacement
    would not start the waiting jobs sooner). 0: off."""


@dataclass
class ShapedDemand:
    plan: Plan
    launches: list[Launch]
    """New instances of the plan, typed, in plan order (cheapest lines first)."""
    reclaim: list[Instance]
    """Our nodes drained for scale-down that the plan puts pending jobs on: back online."""
    filler: Launch | None
    """The cheapest type with room that holds every pending satisfiable shape (or, failing that,
    serves the default partition): what a policy's own counts launch beyond the plan."""
    node_of: dict[str, str]
    """Instance id → its bin name (node name, or the instance id for pending instances)."""
    notes: list[str]

    @property
    def unsatisfiable(self) -> list[Unsatisfiable]:
        return self.plan.unsatisfiable

    @property
    def satisfiable_jobs(self) -> int:
        """Pending demand jobs some type can serve (what a policy may count as waiting)."""
        return sum(s.count for s in self.plan.shapes)

    def drainable(self, idle: Sequence[Instance]) -> list[Instance]:
        """Of ``idle`` (in the policy's order), those no pending satisfiable job would use: the plan
        is the same without them (``packing.drainable``)."""
        names = {i.instance_id: self.node_of.get(i.instance_id, "") for i in idle}
        check = drainable(self.plan, [n for n in names.values() if n])
        ok = set(check.drain)
        for name, why in list(check.keep.items())[:3]:
            self.notes.append(f"kept {name}: {why}")
        return [i for i in idle if names[i.instance_id] in ok]

    def take(self, count: int, reason: str) -> list[Launch]:
        """``count`` launches for a policy's own number: the plan's first, then the filler."""
        out = list(self.launches[:count])
        if len(out) < count and self.filler is not None:
            out += [Launch(self.filler.cores, reason, offers=self.filler.offers)] * (count - len(out))
        return out


def of_cycle(cycle: Any) -> ShapedDemand:
    """``demand`` for a policy's ``lifecycle.Cycle``: stalled and released instances are no supply."""
    view = cycle.view
    return demand(view, view.catalogue, cycle.pending, cycle.active, [m for m, _why in cycle.released])


def demand(view: DomainView, catalogue: Catalogue, pending: Sequence[Instance], active: int,
           released: Sequence[Instance] = ()) -> ShapedDemand:
    """Pack the view's pending demand onto its supply and the catalogue's offers. ``pending``: the
    pending instances that still count as supply (stalled ones left out); ``active``: instances
    counting towards ``max_nodes`` (the plan launches no more than the room left); ``released``:
    members of incomplete gangs being given up (their nodes are no supply)."""
    known = catalogue.known
    gone = {n.name for n in (view.node_of(i) for i in released) if n is not None}
    ours = {}
    for inst in view.instances:
        node = view.node_of(inst)
        if node is not None:
            ours[inst.instance_id] = (inst, node)
    prices = {node.name: known[(i.site, i.instance_type)].price_per_hour
              for i, node in ours.values() if (i.site, i.instance_type) in known}
    ends = {n.name: max(n.job_ends) for n in view.nodes.values()
            if n.jobs and len(n.job_ends) == len(n.jobs) and all(e > 0 for e in n.job_ends)}
    supply: list[Bin] = bins_from_nodes((n for n in view.nodes.values() if n.name not in gone), now=view.now,
                                        boot_seconds=catalogue.boot_seconds, jobs_end_at=ends, prices=prices)
    reclaimable = {}
    for inst in view.draining:
        node = view.node_of(inst)
        if (inst.retire in ("", RetireReason.SCALE_DOWN) and not inst.removed and inst.state == "draining"
                and node is not None and node.state == "offline" and not view.breaker):
            as_free = node.model_copy(update={"state": "free"})
            supply += [_reclaim_bin(b) for b in bins_from_nodes([as_free], prices=prices)]
            reclaimable[node.name] = inst
    node_of = {iid: node.name for iid, (_i, node) in ours.items()}
    for inst in pending:
        offer = known.get((inst.site, inst.instance_type))
        supply.append(bin_of_offer(inst.instance_id, offer) if offer is not None
                      else Bin(inst.instance_id, inst.cores, rank=2))
        node_of.setdefault(inst.instance_id, inst.instance_id)
    room = max(0, view.max_nodes - active)
    plan = pack(view.demand.detail, supply, catalogue.offers, site_room=catalogue.site_room, max_new=room,
                default_partition=catalogue.default_partition)
    launches = []
    for line, _site, _type, holds, n in plan.runs:
        offers = plan.lines[line].offers
        why = "for " + ", ".join(f"{x} x {describe_shape(plan.shapes[i])}" for i, x in holds) if holds \
            else "cheapest fit"
        launches += [Launch(offers[0].cores, why, offers=offers)] * n
    for key, members in _groups(plan).items():
        for i in members:
            launches[i] = replace(launches[i], gang=f"{key}:{len(members)}")
    reclaim = [inst for name, inst in reclaimable.items() if name in plan.supply_holds]
    notes = [f"packed {sum(s.count for s in plan.shapes)} pending job(s) in {len(plan.shapes)} shape(s) on "
             f"{len(supply)} bin(s): {plan.jobs_on_supply} start on supply, {plan.new_instances} new "
             f"instance(s) {_by_type(plan)} at {plan.cost_per_hour:.2f}/h"
             + (f", {len(reclaim)} drained node(s) back" if reclaim else "")]
    for u in plan.unplaced:
        notes.append(f"no room for {u.jobs} x {describe_shape(u.shape)}: {u.reason}")
    for u in plan.unsatisfiable:
        notes.append(f"unsatisfiable ({u.constraint}): {u.jobs} x {describe_shape(u.shape)}: {u.reason}")
    return ShapedDemand(plan, launches, reclaim, _filler(plan, catalogue), node_of, notes)


def _groups(plan: Plan) -> dict[str, list[int]]:
    """The plan's gangs joined where they share instances (an instance holding nodes of several
    multi-node jobs ties their groups): group key → new instance indices. Groups of one instance
    are no group (nothing to wait for)."""
    parent: dict[int, int] = {}

    def find(i: int) -> int:
        while parent.setdefault(i, i) != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for g in plan.gangs:
        for i in g.instances[1:]:
            a, b = find(g.instances[0]), find(i)
            if a != b:
                parent[max(a, b)] = min(a, b)
        find(g.instances[0])
    out: dict[int, list[int]] = {}
    for i in parent:
        out.setdefault(find(i), []).append(i)
    return {f"g{root}": sorted(m) for root, m in sorted(out.items()) if len(m) > 1}


def _reclaim_bin(b: Bin) -> Bin:
    """A drained node is visited after the live ones and before pending instances: it is used
    only when what runs already does not suffice."""
    return Bin(b.name, b.cores, b.memory_mb, b.gpus, b.features, b.partitions, rank=1,
               price_per_hour=b.price_per_hour + 1e6)


def _by_type(plan: Plan) -> str:
    kinds = plan.by_type()
    return "(" + ", ".join(f"{n} {t}" for t, n in sorted(kinds.items())) + ")" if kinds else ""


def _filler(plan: Plan, catalogue: Catalogue) -> Launch | None:
    """The cheapest offer with room that could hold one chunk of every pending satisfiable shape;
    else the cheapest with room serving the default partition; else the cheapest with room."""
    with_room = [o for o in catalogue.offers if o.room > 0]
    if not with_room:
        return None
    default = catalogue.default_partition
    fits_all = [o for o in with_room if all(can_serve(s, o, default) for s in plan.shapes)]
    serves_default = [o for o in with_room if o.partitions is None or not default or default in o.partitions]
    pool = fits_all or serves_default or with_room
    best = min(pool, key=lambda o: (o.price_per_hour, o.cores, o.site, o.type))
    same = tuple(o for o in with_room if o.spec == best.spec)
    return Launch(best.cores, f"{best.type}: the cheapest type that fits", offers=same)


def uses_catalogue(domain: Any, sites: Mapping[str, Any]) -> bool:
    """Does ``domain`` (a ``DomainConfig``) decide by shapes? Yes when it maps partitions to types
    or one of its sites has a ``types`` table or discovers sizes; a domain of single-type sites
    keeps the cores-only counter, exactly as before catalogues."""
    names = domain.sites or list(sites)
    return bool(domain.partitions) or any(sites[n].types or sites[n].discover for n in names if n in sites)


def build_catalogue(types: Sequence[InstanceType], domain: Any, quotas: Mapping[str, int],
                    live_sites: Mapping[str, int], live_types: Mapping[tuple[str, str], int],
                    excluded: frozenset[tuple[str, str]] = frozenset(), boot_seconds: float = 0.0) -> Catalogue:
    """The domain's ``Catalogue`` now: its offers (``offers.domain_offers``) with their room,
    each site's room, and every offer by (site, type) whatever its room."""
    offers = domain_offers(types, domain, live_types, legacy_cores=domain.cores_per_node, excluded=excluded)
    known = {(o.site, o.type): o for o in domain_offers(types, domain, {}, legacy_cores=domain.cores_per_node)}
    room = {site: max(0, q - live_sites.get(site, 0)) for site, q in quotas.items()}
    return Catalogue(tuple(offers), room, domain.default_partition, known, boot_seconds)
