"""Slurm-native mode: Slurm's power saving picks the nodes, EPU serves them with its guarantees.

Why: admins know cloud bursting as Slurm's own power saving (slurm-gcp, ParallelCluster,
CycleCloud): Slurm schedules pending jobs onto powered-down CLOUD nodes with its partitions,
features, reservations and priorities, then calls ResumeProgram with the node names. In a
domain with ``native = "slurm"`` those calls (``slurm.power``, from ``epu slurm resume|suspend|
resume-fail``) replace the policy's launches and scale-down; everything else stays EPU's:

* **a resume is demand for exactly that node**: launched under its name (design rule 8: the
  instance id goes into the node's Comment at ``add``, so the node is matched by identity), as
  the instance type the node's features name (or its ``type_nodes`` pool, or the one type the
  domain offers), at the site a feature names or — none named — wherever placement puts it
  (rank/cheapest/spread, backoff, quotas); max_nodes and the spend cap are the planner's as
  always;
* **a resume EPU cannot serve is given back at once** (``give_back``: Slurm powers the node down
  with the reason and requeues its job elsewhere) — no type for it, no site with room, max_nodes,
  the spend cap — instead of leaving the node to time out (``give_backs``);
* **a stalled node is replaced under the same name**: the life cycle gives up an instance that
  did not join within ``stall_seconds`` (``lifecycle.Cycle``), and since Slurm still wants the
  name it is launched again, before ResumeTimeout;
* **a suspend ends an instance only with its removal proved**: a ``remove`` (the sensor checks
  Slurm's own job list) then a terminate with proof ``removed`` — the gate's rules, unchanged;
* **a removed slot is held until its instance has ended**: the sensor's ``remove`` drains it
  (Slurm must not power it up for a job while the machine still runs: the machine's slurmd would
  answer, and the destroy kill the job — ``epu sim --seed 950014 --scenario native-spot-loss``);
  once no live instance has the identity the slot still carries, ``release`` hands it back to
  Slurm's power saving (``releases``: found in every snapshot, so a lost release is sent again);
* **a lost call is found in the snapshot**: a node Slurm shows POWERING_UP that no live instance
  holds is wanted like a resume (a resume call lost, an engine restarted), so calls are a fast
  path, never the only path; a node Slurm shows powered down whose instance lives was suspended.

The requests (``Requests``) are the engine's memory of the calls; everything deciding is
``decide`` and ``give_backs``, pure functions of the view, the config and that memory.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any

from epu.common.messages import TERMINAL_INSTANCE_STATES, SlurmPower
from epu.common.retire import RetireReason
from epu.services.decision.actions import Action, Decision, Launch, Node, Terminate
from epu.services.decision.lifecycle import Cycle
from epu.services.decision.view import DomainView, Instance, short_name

POWERING_UP = frozenset({"POWERING_UP", "POWER_UP"})
POWERED_DOWN = frozenset({"POWERED_DOWN", "POWERING_DOWN", "POWER_DOWN"})
DRAINED = frozenset({"DRAIN", "DRAINED", "DRAINING"})
SEEN_BATCHES = 10_000
"""How many batch ids are remembered to drop a call delivered twice."""


@dataclass
class DomainRequests:
    """What Slurm's power saving asked of one domain, by node name → engine time of the call."""

    resumes: dict[str, float] = field(default_factory=dict)
    suspends: dict[str, float] = field(default_factory=dict)
    failed: dict[str, float] = field(default_factory=dict)
    """resume_fail: Slurm gave up on the node (ResumeTimeout)."""
    given_back: dict[str, float] = field(default_factory=dict)
    """Nodes given back to Slurm, and when: not wanted again from a snapshot older than that."""
    siblings: dict[str, frozenset[str]] = field(default_factory=dict)
    """Node → the nodes one job of the same resume call waits for (``SLURM_RESUME_FILE``): all or
    nothing — one of them given back gives back the others not launched yet."""


class Requests:
    """The engine's memory of ``slurm.power`` calls, per domain (see the module docstring: a lost
    memory is rebuilt from Slurm's snapshots)."""

    def __init__(self) -> None:
        self.domains: dict[str, DomainRequests] = {}
        self._seen: OrderedDict[str, None] = OrderedDict()
        self.received = 0
        self.duplicates = 0

    def of(self, domain: str) -> DomainRequests:
        return self.domains.setdefault(domain, DomainRequests())

    def on_power(self, msg: SlurmPower, now: float) -> bool:
        """Record a call; False for a batch already recorded (Slurm or the broker repeated it)."""
        if msg.batch_id in self._seen:
            self.duplicates += 1
            return False
        self._seen[msg.batch_id] = None
        while len(self._seen) > SEEN_BATCHES:
            self._seen.popitem(last=False)
        self.received += 1
        d = self.of(msg.domain)
        for name in msg.nodes:
            if msg.action == "resume":
                d.resumes[name] = now
                d.siblings.pop(name, None)
                d.suspends.pop(name, None)
                d.failed.pop(name, None)
                d.given_back.pop(name, None)
            elif msg.action == "suspend":
                d.suspends[name] = now
                d.resumes.pop(name, None)
            else:
                d.failed[name] = now
                d.resumes.pop(name, None)
        if msg.action == "resume":
            for job in msg.jobs:
                group = frozenset(job.nodes_resume) & frozenset(msg.nodes)
                if len(group) > 1:
                    for name in group:
                        d.siblings[name] = d.siblings.get(name, frozenset()) | group
        return True


@dataclass(frozen=True)
class Wanted:
    """A node Slurm wants up and no live instance of ours holds."""

    name: str
    why: str
    type: str = ""
    """The instance type to launch ("" = the domain's single-type launch, or unknown)."""
    offers: tuple[Any, ...] = ()
    problem: str = ""
    """Why it cannot be served ("" = it can be tried)."""
    leaving: str = ""
    """A live instance of ours on its way out that still holds the name (a stalled one being
    removed): the name is not given back while it does — that node is ours until removed."""


@dataclass
class NativeDecision:
    decision: Decision
    wanted: list[Wanted]
    """Every node wanted this iteration (served or not): the engine gives back what the plan
    did not launch (``give_backs``)."""
    releases: list[tuple[str, str]] = field(default_factory=list)
    """(node, instance id) of the held slots to release (``releases``)."""


def _tokens(native_state: str) -> set[str]:
    return set(native_state.replace("+", " ").split())


def _holders(view: DomainView) -> dict[str, Instance]:
    """Node name → the live instance that holds it for demand (not on its way out)."""
    out: dict[str, Instance] = {}
    for i in view.instances:
        if i.state in TERMINAL_INSTANCE_STATES or i.terminate_sent or i.retire:
            continue
        out[short_name(i.node_name)] = i
    return out


def _live(view: DomainView) -> dict[str, Instance]:
    """Node name → any live instance of it (on its way out included)."""
    out: dict[str, Instance] = {}
    for i in view.instances:
        if i.state not in TERMINAL_INSTANCE_STATES and not i.terminate_sent:
            out.setdefault(short_name(i.node_name), i)
    return out


def type_of(name: str, view: DomainView, cfg: Any, sites: set[str]) -> tuple[str, str, str]:
    """(type, site, problem) for node ``name``: its ``type_nodes`` pool, else a feature of its
    node naming a type of the catalogue (and one naming a site pins the site), else the one type
    the domain offers. ``problem`` says why none fits."""
    catalogue = view.catalogue
    types = sorted({o.type for o in catalogue.known.values()}) if catalogue is not None else []
    for typ, nodes in (getattr(cfg, "type_nodes", None) or {}).items():
        if name in nodes.names:
            return typ, "", ""
    node = view.nodes.get(name)
    site = ""
    if node is not None:
        feats = set(node.features)
        named = [t for t in types if t in feats]
        pinned = [s for s in sites if s in feats or f"site_{s}" in feats]
        site = pinned[0] if len(pinned) == 1 else ""
        if len(named) == 1:
            return named[0], site, ""
        if len(named) > 1:
            return "", site, f"node {name} has features of {len(named)} types ({', '.join(named)})"
    if catalogue is None:
        return "", site, ""  # the domain's single-type launch
    if len(types) == 1:
        return types[0], site, ""
    return "", site, (f"no instance type for node {name}: no type_nodes pool holds it and its features name none "
                      f"of {', '.join(types) or 'no type'}")


def wanted(view: DomainView, cfg: Any, req: DomainRequests) -> list[Wanted]:
    """The nodes Slurm wants up that no live instance holds: recent resume calls, and nodes a
    snapshot shows powering up (a call lost or forgotten)."""
    now = view.now
    horizon = float(getattr(cfg, "native_resume_seconds", 1800.0))
    holders = _holders(view)
    live = _live(view)
    names: dict[str, str] = {}
    called: dict[str, float] = {}
    for name, at in list(req.resumes.items()):
        if now - at > horizon:
            del req.resumes[name]  # Slurm has given up on it by now
            continue
        if view.available and view.snapshot_at > at:
            node = view.nodes.get(name)
            if node is None or not _tokens(node.native_state) & POWERING_UP:
                # Slurm's own state, read after the call, says it no longer waits for this node
                # (registered, powered down, given up): the call is spent — a launch now would be
                # for nobody (a node preempted and powered down must not come back by an old call)
                del req.resumes[name]
                continue
        names[name] = "resumed by Slurm"
        called[name] = at
    if view.available:
        for node in view.nodes.values():
            name = short_name(node.name)
            if name in names or not _tokens(node.native_state) & POWERING_UP:
                continue
            back = req.given_back.get(name)
            if back is not None and view.snapshot_at <= back:
                continue  # the snapshot predates the give-back: Slurm is powering it down now
            names[name] = "powering up in Slurm, no instance for it (a resume call lost)"
    sites = set(getattr(cfg, "sites", None) or [o.site for o in (view.catalogue.known.values()
                                                                if view.catalogue is not None else ())])
    out: list[Wanted] = []
    for name, why in names.items():
        if name in holders:
            if holders[name].state == "joined":
                req.resumes.pop(name, None)  # served
            continue
        typ, site, problem = type_of(name, view, cfg, sites)
        if problem and name not in view.nodes and called.get(name, float("-inf")) >= view.snapshot_at:
            # no snapshot since the call, and none before it showed the node (a sensor without
            # include_powered_down): the next one shows it powering up, with its features — wait
            # for it rather than give the node back (the native e2e saw that once in three runs)
            continue
        offers: tuple[Any, ...] = ()
        if not problem and typ and view.catalogue is not None:
            offers = tuple(o for o in view.catalogue.offers if o.type == typ and o.room > 0
                           and (not site or o.site == site) and (not sites or o.site in sites))
            if not offers:
                where = f" at site {site}" if site else ""
                problem = f"no site offers type {typ}{where} with room now (quota, capacity cooldown or none)"
        leaving = live[name].instance_id if name in live else ""
        out.append(Wanted(name, why, typ, offers, problem, leaving))
    return out


def releases(view: DomainView) -> list[tuple[str, str]]:
    """(node, instance id) of every slot held since a ``remove`` (powered down, drained, still
    carrying an instance's identity) whose instance no longer lives: its machine is gone, so the
    slot may be Slurm's again. An instance on its way out (terminating) still lives: its machine
    may answer a power-up until the destroy is done."""
    if not view.available:
        return []
    alive = {i.instance_id for i in view.instances if i.state not in TERMINAL_INSTANCE_STATES}
    out = []
    for node in view.nodes.values():
        tokens = _tokens(node.native_state)
        if (node.instance_id and node.instance_id not in alive and tokens & DRAINED and tokens & POWERED_DOWN
                and not node.jobs):
            out.append((short_name(node.name), node.instance_id))
    return out


def decide(view: DomainView, cfg: Any, req: DomainRequests, stall_seconds: float,
           gang_deadline: float | None = None) -> NativeDecision:
    """Native mode's decision for one domain (see the module docstring): the life cycle every
    policy shares (stall, give up, add, finish drains) with Slurm's resumes as the launches and
    Slurm's suspends and resume failures as the way out."""
    view = replace(view, min_nodes=0)  # Slurm decides how many: no floor of unnamed nodes
    want = wanted(view, cfg, req)
    launches = [Launch(cores=o.cores if (o := w.offers[0] if w.offers else None) else view.cores_per_node,
                       reason=f"{w.name}: {w.why}", offers=w.offers, name=w.name)
                for w in want if not w.problem]
    cycle = Cycle(view, stall_seconds, gang_deadline)
    cycle.launch(len(launches), "resumed by Slurm", typed=launches, reclaim=[])
    live = _live(view)
    out: list[Action] = []
    claimed: set[str] = set()
    failed_sites: dict[str, str] = {}
    for name, _at in list(req.failed.items()):
        inst = live.get(name)
        if inst is None:
            del req.failed[name]
            continue
        if inst.retire or inst.state == "joined":
            continue  # already on its way out, or it joined after all (Slurm will see it register)
        why = f"Slurm gave up on node {name} (ResumeTimeout): the instance never joined"
        failed_sites.setdefault(inst.site, f"resume failed: node {name}")
        claimed.add(inst.instance_id)
        out.append(Node("remove", inst.instance_id, why, retire=RetireReason.STALLED) if inst.batch_may_know
                   else Terminate(inst.instance_id, why, stalled=True, retire=RetireReason.STALLED))
    suspended = dict(req.suspends)
    if view.available:  # a node Slurm shows powered down whose instance lives: suspended (a call lost)
        for node in view.nodes.values():
            name = short_name(node.name)
            inst = live.get(name)
            if (inst is not None and inst.state == "joined" and _tokens(node.native_state) & POWERED_DOWN
                    and not node.jobs and view.node_of(inst) is node):
                suspended.setdefault(name, view.now)
    for name in suspended:
        inst = live.get(name)
        if inst is None:
            req.suspends.pop(name, None)
            continue
        if inst.retire or inst.instance_id in claimed:
            continue
        why = f"suspended by Slurm's power saving (node {name})"
        claimed.add(inst.instance_id)
        if not inst.batch_may_know:
            out.append(Terminate(inst.instance_id, f"{why}: never in the batch system", retire=RetireReason.NATIVE))
        elif inst.state in ("joined", "started", "draining"):
            out.append(Node("remove", inst.instance_id, f"{why}: remove it (no job on it, by Slurm's job list)",
                            retire=RetireReason.NATIVE))
    rest = cycle.decision(notes=[f"native mode: {len(want)} node(s) wanted by Slurm, {len(launches)} to launch"]
                          if want else None)
    out += [a for a in rest.actions if isinstance(a, Launch) or a.instance_id not in claimed]
    for site, why in failed_sites.items():
        rest.failed_sites.setdefault(site, why)
    return NativeDecision(Decision(out, None, rest.notes, rest.failed_sites), want, releases(view))


def all_or_nothing(back: list[tuple[str, str]], launched: set[str], req: DomainRequests) -> set[str]:
    """The nodes launched in this plan that a job shares with a node given back
    (``SLURM_RESUME_FILE``): Slurm requeues that job whole, so their launches are for nobody —
    dropped before they are stored (ParallelCluster's all-or-nothing launch, job by job)."""
    out: set[str] = set()
    for name, _why in back:
        out |= req.siblings.get(name, frozenset()) & launched
    return out


def give_backs(want: list[Wanted], launched: set[str], notes: list[str]) -> list[tuple[str, str]]:
    """(node, reason) for every wanted node the plan did not launch: EPU cannot serve it now, so
    Slurm gets it back at once (its job requeued) rather than at ResumeTimeout. ``notes``: the
    plan's, for the reason (max_nodes, the spend cap, placement)."""
    out = []
    why_plan = "; ".join(n for n in notes if any(k in n for k in ("max_nodes", "budget", "spend", "unplaced",
                                                                   "no site", "backoff", "quota")))[:300]
    for w in want:
        if w.name in launched or w.leaving:
            continue
        reason = w.problem or why_plan or "not launched (placement, max_nodes or the spend cap)"
        out.append((w.name, f"epu: cannot serve: {reason}"[:400]))
    return out


__all__ = ["DomainRequests", "NativeDecision", "Requests", "Wanted", "all_or_nothing", "decide", "give_backs",
           "releases", "type_of", "wanted"]
