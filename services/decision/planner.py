"""From a policy's Decision to concrete, safe, placed messages. Pure.

The planner is the guard rail between any policy and the clouds:

* a node running a job is never terminated unless the action is forced;
* an instance the batch system may know (added, seen, or its VM ran) is terminated only after
  the sensor confirmed its node removed (``removed``), unless forced; any other unforced
  terminate is sent ``unless_started`` — the provisioner carries it out only while the VM has
  not started (this view lags the cloud: a booted VM's own daemon may have joined and taken a
  job), else refuses, and the instance goes the safe way;
* an unavailable snapshot never leads to a scale-down (offline, remove, terminate);
* one action per instance and kind, and none while the same one is still in flight; never
  ``online`` while a ``remove`` of the same node is in flight, nor the reverse;
* launches never take the domain above ``max_nodes`` and are placed on sites
  (``placement.place``); a site with a stalled instance counts one failure per iteration;
* launches never take the domain's or a site's spend rate above its ``budget_per_hour``
  (``budget.admit``); scale-down is never held by a cap.

It also states each action's effect on the instance table, which the engine stores
together with the action *before* sending it (intent first).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from epu.common.config.decision import DomainConfig
from epu.common.messages import Message, new_id
from epu.common.retire import Proof, RetireReason
from epu.services.decision.actions import Decision, Launch, Node, Terminate
from epu.services.decision.budget import Budget, admit
from epu.services.decision.gate import launch_request, node_command, proof_of, retire_of, terminate_request
from epu.services.decision.placement import SiteHealth, SiteInfo, place, record_failure
from epu.services.decision.view import ACTIVE_STATES, DomainView, Instance, evolve, short_name

log = logging.getLogger(__name__)

SCALE_DOWN = frozenset({"offline", "remove", "terminate"})


@dataclass(frozen=True)
class Planned:
    action_id: str
    kind: str
    instance_id: str
    site: str
    reason: str
    message: Message
    instance_type: str = ""
    """For launches: the catalogue type ("" = the site's single type)."""
    gang: str = ""


@dataclass
class Plan:
    actions: list[Planned] = field(default_factory=list)
    instances: dict[str, Instance] = field(default_factory=dict)
    """New or changed instance rows, stored with the actions."""
    sites: dict[str, SiteHealth] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    budget: str = ""
    """Why the spend cap held launches this iteration ("" = it held none)."""
    shadow: list[Planned] = field(default_factory=list)
    """Observe mode: what the iteration would have done (never stored nor sent)."""
    refused: list[str] = field(default_factory=list)
    """Actions refused for safety that an operator must hear about (also in ``notes``): the
    engine publishes the iteration's decision record for them even when nothing was sent."""


@dataclass(frozen=True)
class PlacementInput:
    order: list[str]
    strategy: str
    infos: dict[str, SiteInfo]
    health: dict[str, SiteHealth]
    live: dict[str, int]
    unproven: dict[str, int]
    backoff_initial: float = 300.0
    backoff_max: float = 1800.0
    node_names: tuple[str, ...] = ()
    """The domain's pool of worker names (empty: generated names)."""
    type_nodes: dict[str, tuple[tuple[str, ...], str | None]] = field(default_factory=dict)
    """Instance type → (its pool of worker names, a name pattern) (``type_nodes`` of the domain)."""
    budget: Budget | None = None
    """Spend caps, rates and prices (None: no cap)."""


def placement_input(cfg: DomainConfig, infos: dict[str, SiteInfo], health: dict[str, SiteHealth],
                    live: dict[str, int], unproven: dict[str, int], *, backoff_initial: float, backoff_max: float,
                    budget: Budget | None = None) -> PlacementInput:
    """A domain's ``PlacementInput`` from its config: its sites (none named: every site of
    ``infos``, in their order) and placement, its worker names, with the sites' health and live
    and unproven counts over all domains, the backoff bounds and the spend caps (``budget``)."""
    return PlacementInput(cfg.sites or list(infos), cfg.placement, infos, health, live, unproven, backoff_initial,
                          backoff_max, tuple(cfg.node_names),
                          {t: (tuple(n.names), n.pattern) for t, n in cfg.type_nodes.items()}, budget)


#: How many characters of the launch id a generated node name carries. A launch id is a uuid4 in
#: hex: 16 characters hold 60 random bits (the 13th is the version digit). With 1,000 live nodes
#: and a million launches a year, the 8 characters (32 bits) used before made two live nodes of
#: one name likely within a year (~20 %); 60 bits make it about one in a billion. A name held by
#: another live instance is still refused at ``add`` (``_name_holder``): Slurm's ``add`` of an
#: existing name would rewrite that node's address and identity.
NAME_ID_CHARS = 16

#: A host name label (RFC 1123) is at most 63 characters.
_LABEL_MAX = 63


def name_id(launch_id: str) -> str:
    """The part of a launch id that goes into a generated node name (``{id}`` of a pattern)."""
    return launch_id[:NAME_ID_CHARS]


def _name_holders(view: DomainView) -> dict[str, list[str]]:
    """Node name → the instances that may hold it in the batch system: every instance not ended,
    and every ended one whose node was not removed yet (``view.cleanup``)."""
    out: dict[str, list[str]] = {}
    for i in view.instances:
        if i.state not in ("terminated", "failed"):
            out.setdefault(short_name(i.node_name), []).append(i.instance_id)
    for i in view.cleanup:
        if not i.removed:
            out.setdefault(short_name(i.node_name), []).append(i.instance_id)
    return out


def _shown_as(view: DomainView, name: str, holder: str) -> bool:
    """Does the snapshot show a node of ``name`` carrying ``holder``'s identity?"""
    node = view.nodes.get(name) or view.nodes.get(short_name(name))
    if node is None:
        node = next((n for n in view.nodes.values() if short_name(n.name) == short_name(name)), None)
    return node is not None and node.instance_id == holder


def _name_holder(holders: dict[str, list[str]], inst: Instance) -> str | None:
    """Another instance holding ``inst``'s node name, if any."""
    for other in holders.get(short_name(inst.node_name), ()):
        if other != inst.instance_id:
            return other
    return None


NAME_DRAWS = 64
"""Launch ids drawn at most for one generated name that no instance or node holds. With the ids'
64 bits a second draw never happens in practice; the simulator's small id space (scenario
name-collisions) needs a few. After that many the last draw stands, and the add refusal of a held
name (``_name_holder``) is what keeps the two apart."""


def names_taken(view: DomainView) -> set[str]:
    """Node names (short) a new launch must not take: every instance not ended, every ended one
    whose node was not removed yet, and every node the batch system shows. A name taken twice is
    a node whose daemon the other instance's may overwrite when it registers by itself (Slurm)."""
    return ({short_name(i.node_name) for i in view.instances if i.state not in ("terminated", "failed")}
            | {short_name(i.node_name) for i in view.cleanup} | {short_name(n) for n in view.nodes})


def draw_named(make_id: Callable[[], str], name_of: Callable[[str], str],
               taken: set[str] | None) -> tuple[str, str]:
    """A launch id whose generated node name is not ``taken`` (then taken by it)."""
    for _ in range(NAME_DRAWS):
        launch_id = make_id()
        name = name_of(launch_id)
        if taken is None or short_name(name) not in taken:
            break
    if taken is not None:
        taken.add(short_name(name))
    return launch_id, name


def node_name_for(domain: str, launch_id: str) -> str:
    """``<domain>-<id>``: the domain shortened when the label would pass 63 characters (a domain
    name may have 63), never the id."""
    ident = name_id(launch_id)
    prefix = domain.replace('_', '-')[:_LABEL_MAX - len(ident) - 1].rstrip("-")
    return f"{prefix}-{ident}" if prefix else ident


def plan(view: DomainView, decision: Decision, placement: PlacementInput,
         in_flight: set[tuple[str, str]], *, make_id: Callable[[], str] = new_id,
         backing_off: set[tuple[str, str]] = frozenset()) -> Plan:  # type: ignore[assignment]
    """``backing_off``: (instance, kind) node commands answered with an error that wait before
    they are sent again (``retries``)."""
    out = Plan(notes=list(decision.notes))
    targets = {a.instance_id for a in decision.actions if not isinstance(a, Launch)}
    by_id = {i.instance_id: i for i in [*view.instances, *view.cleanup] if i.instance_id in targets} \
        if targets else {}
    seen: set[tuple[str, str]] = set()
    launches: list[Launch] = []
    holders: dict[str, list[str]] | None = None  # node name -> instances holding it (built at the first add)
    now = view.now
    for site, why in sorted(decision.failed_sites.items()):  # one failure per site per iteration
        h = placement.health.get(site, SiteHealth(site))
        out.sites[site] = record_failure(h, now, why, initial=placement.backoff_initial,
                                         maximum=placement.backoff_max, stalled=why.startswith("stalled"))

    def current(iid: str) -> Instance:
        return out.instances.get(iid, by_id[iid])

    for action in decision.actions:
        if isinstance(action, Launch):
            launches.append(action)
            continue
        iid = action.instance_id
        kind = action.kind
        if iid not in by_id:
            out.notes.append(f"dropped {kind} of unknown instance {iid}")
            continue
        if (iid, kind) in seen or (iid, kind) in in_flight or (iid, kind) in backing_off:
            continue
        inst = current(iid)
        if kind in SCALE_DOWN and not view.available and not getattr(action, "force", False):
            out.notes.append(f"dropped {kind} {inst.node_name}: sensor unavailable, no scale-down")
            continue
        terminal = inst.state in ("terminated", "failed")
        if isinstance(action, Terminate):
            if inst.terminate_sent or terminal:
                continue
            if view.running_jobs(inst) and not action.force:
                out.notes.append(f"kept {inst.node_name}: a job runs there (terminate needs force)")
                continue
            if inst.batch_may_know and not inst.removed and not action.force:
                out.notes.append(f"kept {inst.node_name}: the batch system may know it; terminate only "
                                 "after its removal is confirmed")
                continue
            # unforced, and not known to the batch system as far as this view goes: the view lags
            # the cloud, so the provisioner checks that the VM has not started (a daemon that
            # registers by itself may have joined and taken a job)
            retire = retire_of(inst, RetireReason(action.retire) if action.retire else RetireReason.SCALE_DOWN)
            proof = Proof.FORCED if action.force else proof_of(inst)
            assert proof is not None  # removed, or unknown to the batch system (checked above)
            msg: Message = terminate_request(inst, retire, proof, action.reason, make_id=make_id)
            out.instances[iid] = evolve(inst, terminate_sent=True, idle_since=None, retire=retire)
            out.actions.append(Planned(msg.request_id, "terminate", iid, inst.site, action.reason, msg))
        else:
            assert isinstance(action, Node)
            if terminal and kind != "remove":
                continue
            if kind == "offline" and ((inst.state not in ACTIVE_STATES and inst.state != "draining")
                                      or inst.removed or (iid, "online") in in_flight):
                continue
            # opposite commands never travel together: the sensor may carry them out in either
            # order (observe-switches, seed 83017: an online overtaken by the offline sent before
            # it left a node drained in Slurm that the engine held joined, never scaled down)
            if kind == "online" and (inst.state != "draining" or inst.removed or (iid, "remove") in in_flight
                                     or (iid, "offline") in in_flight):
                continue
            if kind == "remove" and (iid, "online") in in_flight:
                continue
            if kind == "add" and (inst.state != "started" or inst.retire):
                continue
            if kind == "add":
                if holders is None:
                    holders = _name_holders(view)
                holder = _name_holder(holders, inst)
                if holder is not None:
                    why = (f"refused add of {inst.node_name} for instance {iid}: the name is held by live "
                           f"instance {holder} (an add would rewrite that node's address and identity)")
                    out.notes.append(why)
                    out.refused.append(why)
                    log.warning(why, extra={"domain": view.domain, "instance": iid, "holder": holder})
                    continue
            node = view.node_of(inst)
            if node is None and kind != "add":
                # no node of this instance's identity in the snapshot: its name may be another
                # live instance's (a collision whose add was refused), and a command by name would
                # drain or remove that one's node. The batch system's own view says the name is
                # someone else's: this instance has no node there — a removal confirmed.
                if holders is None:
                    holders = _name_holders(view)
                holder = _name_holder(holders, inst)
                if holder is not None and _shown_as(view, inst.node_name, holder):
                    if kind == "remove" and not terminal:
                        out.instances[iid] = evolve(inst, removed=True, idle_since=None,
                                                    retire=action.retire or inst.retire or RetireReason.SCALE_DOWN)
                    elif kind == "remove":
                        out.instances[iid] = evolve(inst, removed=True)
                    out.notes.append(f"no {kind} for {inst.node_name} of instance {iid}: the batch system shows "
                                     f"that name as instance {holder}'s; this one has no node there")
                    seen.add((iid, kind))
                    continue
            msg = node_command(view.domain, action.op, node.name if node is not None else inst.node_name, inst,
                               action.reason, requeue=action.requeue, make_id=make_id)
            if kind == "add":
                out.instances[iid] = evolve(inst, add_sent_at=now)
            elif kind == "offline":  # sent again to a node already draining: the drain began then, not now
                out.instances[iid] = evolve(inst, state="draining", state_at=inst.state_at if inst.state == "draining"
                                             else now, drain_at=now, idle_since=None,
                                             retire=action.retire or inst.retire or RetireReason.SCALE_DOWN)
            elif kind == "online":
                out.instances[iid] = evolve(inst, state="joined", state_at=now, drain_at=None, idle_since=None,
                                             retire="")
            elif kind == "remove" and not terminal:
                state = "draining" if inst.state in ACTIVE_STATES else inst.state
                out.instances[iid] = evolve(inst, state=state, state_at=now if state != inst.state else inst.state_at,
                                             idle_since=None, retire=action.retire or inst.retire or RetireReason.SCALE_DOWN)
            out.actions.append(Planned(msg.command_id, kind, iid, inst.site, action.reason, msg))
        seen.add((iid, kind))

    if launches:
        active = len(view.active) + sum(int(new.active) - int(by_id[iid].active)
                                        for iid, new in out.instances.items() if iid in by_id)
        room = max(0, view.max_nodes - active)
        if len(launches) > room:
            out.notes.append(f"max_nodes={view.max_nodes}: {len(launches) - room} launch(es) dropped")
            launches = launches[:room]
        typed = [a for a in launches if a.offers]
        launches = [a for a in launches if not a.offers]
        # a name is free once its instance is over AND its node has left the batch system
        # (a slot still draining or powering down would be taken for the new worker's node)
        used = ({i.node_name for i in view.instances if i.state not in ("terminated", "failed")}
                | {i.node_name for i in view.cleanup} | {short_name(n) for n in view.nodes} | set(view.nodes)) \
            if placement.node_names or placement.type_nodes else set()
        names: list[str | None] = [None] * len(launches)
        if any(a.name for a in launches):  # native mode: the names Slurm chose, no pool
            names = [a.name or None for a in launches]
        elif placement.node_names and launches:
            free = [n for n in placement.node_names if n not in used]
            if len(launches) > len(free):
                out.notes.append(f"node_names: {len(launches) - len(free)} launch(es) wait for a free name")
                launches = launches[:len(free)]
            names = list(free[:len(launches)])
            used |= set(names)  # type: ignore[arg-type]
        placed = place(len(launches), placement.order, placement.strategy, placement.infos,
                       {**placement.health, **out.sites}, placement.live, placement.unproven, now)
        out.notes += placed.why if placed.unplaced else []
        taken = names_taken(view)
        for launch, site, name in zip(launches, placed.sites, names, strict=False):
            out.actions.append(launch_action(view.domain, site, launch.cores, launch.reason, now,
                                             placement, out, make_id, name=name, taken=taken))
        if typed:
            _plan_typed(view, typed, placement, out, used, make_id, taken)
        if placement.budget is not None and placement.budget.capped:
            _hold_over_budget(out, placement.budget)
    return out


def _hold_over_budget(out: Plan, budget: Budget) -> None:
    """Drop the planned launches the spend cap does not admit (their rows with them)."""
    launches = [p for p in out.actions if p.kind == "launch"]
    verdict = admit([(p.site, p.instance_type) for p in launches], budget)
    if not verdict.held:
        return
    dropped = {p.action_id for p, ok in zip(launches, verdict.keep, strict=True) if not ok}
    out.actions = [p for p in out.actions if p.action_id not in dropped]
    for iid in dropped:
        out.instances.pop(iid, None)
    out.budget = verdict.why
    out.notes.append(verdict.why)
    if any(p.gang for p in out.actions):
        _resize_gangs(out)


def _plan_typed(view: DomainView, launches: list[Launch], placement: PlacementInput, out: Plan,
                used: set[str], make_id: Callable[[], str], taken: set[str]) -> None:
    """Launches of catalogue types: per group of equal offers, the domain's placement picks the
    sites among the offers' (``offers.place_line``: quotas of the site and of the type, backoff,
    probation); names come from the type's pool or pattern (``type_nodes``), else the domain's."""
    from epu.services.decision.offers import place_line  # offers imports the planner's neighbours
    from epu.services.decision.packing import LaunchLine

    groups: dict[tuple, list[Launch]] = {}
    for a in launches:
        groups.setdefault(a.offers, []).append(a)
    live = dict(placement.live)
    unproven = dict(placement.unproven)
    health = {**placement.health, **out.sites}
    gangs: dict[str, str] = {}  # the policy's group key -> a fresh id (with the size)
    for offers, group in groups.items():
        kind = offers[0].type
        pool, pattern = placement.type_nodes.get(kind, ((), None))
        if not pool and not pattern:
            pool = placement.node_names
        names: list[str | None] = [None] * len(group)
        if any(a.name for a in group):  # native mode: the names Slurm chose, no pool
            names = [a.name or None for a in group]
        elif pool:
            free = [n for n in pool if n not in used]
            if len(group) > len(free):
                out.notes.append(f"names for {kind}: {len(group) - len(free)} launch(es) wait for a free name")
                group = group[:len(free)]
            names = list(free[:len(group)])
            used.update(free[:len(group)])
        line = LaunchLine(offers, len(group), ())
        picks, placed = place_line(line, placement.strategy, placement.infos, health, live, unproven, view.now)
        if placed.unplaced:
            out.notes += [f"{kind}: {w}" for w in placed.why]
        for launch, (site, typ), name in zip(group, picks, names, strict=False):
            offer = next(o for o in offers if o.site == site and o.type == typ)
            if name is None and pattern:
                launch_id, name = draw_named(
                    make_id, lambda lid, typ=typ, pat=pattern: pat.format(domain=view.domain, type=typ, id=name_id(lid)),
                    taken)
            elif name is None:
                launch_id, name = draw_named(make_id, lambda lid: node_name_for(view.domain, lid), taken)
            else:
                launch_id = make_id()
            gang = ""
            if launch.gang:
                key, _, size = launch.gang.rpartition(":")
                gang = gangs.setdefault(key, f"{make_id()[:12]}:{size}")
            out.actions.append(launch_action(view.domain, site, offer.cores, launch.reason, view.now, placement,
                                             out, lambda launch_id=launch_id: launch_id, name=name,
                                             instance_type=typ, gang=gang))
            live[site] = live.get(site, 0) + 1
            unproven[site] = unproven.get(site, 0) + 1
    if gangs:
        _resize_gangs(out)


def _resize_gangs(out: Plan) -> None:
    """A group some of whose launches were not placed (quotas, probation, names) is the group of
    those launched: otherwise the next iteration would release it as incomplete, and again."""
    launched: dict[str, int] = {}
    for p in out.actions:
        if p.gang:
            launched[p.gang] = launched.get(p.gang, 0) + 1
    for k, p in enumerate(out.actions):
        if not p.gang or launched[p.gang] == int(p.gang.rpartition(":")[2]):
            continue
        n = launched[p.gang]
        gang = f"{p.gang.rpartition(':')[0]}:{n}" if n > 1 else ""
        out.actions[k] = replace(p, gang=gang)
        out.instances[p.instance_id] = replace(out.instances[p.instance_id], gang=gang)


def launch_action(domain: str, site: str, cores: int, reason: str, now: float, placement: PlacementInput,
                  out: Plan, make_id: Callable[[], str] = new_id, *, name: str | None = None,
                  instance_type: str = "", gang: str = "", taken: set[str] | None = None) -> Planned:
    """One launch, stored as a ``requested`` instance with the action. A catalogue type's cores
    are the type's; the single-type launch keeps the site's ``cores`` when larger (as always).
    ``taken``: node names held now (``names_taken``), which a generated name avoids."""
    if name is None:
        launch_id, name = draw_named(make_id, lambda lid: node_name_for(domain, lid), taken)
    else:
        launch_id = make_id()
    info = placement.infos.get(site)
    site_cores = cores if instance_type else max(cores, info.cores if info else cores)
    msg = launch_request(launch_id, domain, site, name, site_cores, instance_type)
    out.instances[launch_id] = Instance(launch_id, domain, site, name, site_cores, "requested", now, now,
                                        reason=reason, instance_type=instance_type, gang=gang)
    return Planned(launch_id, "launch", launch_id, site, reason, msg, instance_type, gang)
