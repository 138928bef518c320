"""What the poll loop and reconciliation conclude from one cloud listing — pure, no I/O.

``observe`` (the poll loop) and ``reconcile`` (on start and every few minutes) are functions
of a ``World`` — the listing, when it was taken, the store's records, the shared miss
history, the first sightings of unknown nodes, what is in flight here, the clock — and the
``Rules``; they return a ``Plan`` of actions. The shell in ``provisioner.py`` lists, reads,
calls these, and carries the plan out; every decision is tested table by table in
``tests/provisioner/test_reconcile.py``.

Why these rules (design rule 8: absence is a hint, never proof; destroy only what we
positively know is ours and unwanted):

* **Absence.** A record whose node a listing omits gets one more *miss*; poll and
  reconciliation share the history. After ``vanish_misses`` consecutive misses spanning at
  least ``vanish_min_seconds`` the record is *presumed gone*: a flag announced to the engine,
  not a state. Nothing is destroyed or closed on a presumption, so a listing that was partial
  (OpenStack's down cell, a short page), late or wrong costs nothing; when the node is listed
  again it is re-adopted. Only a record we were already terminating is closed on absence.
* **Whose node.** Only nodes tagged with this deployment are looked at. A node whose launch
  id the store does not know is ours only if it also carries this *store's* id; one of
  another store (a second provisioner with its own database, a database re-created under an
  explicitly configured deployment) is never destroyed, only reported.
* **A failed launch's live node is reopened, not destroyed.** A create that took effect but
  whose answer was lost, then API errors until the retries ran out, leaves a ``failed`` record
  and a live node — on HTCondor a startd that joins by itself and takes jobs. ``Reopen`` puts the
  record back in the state the cloud shows and announces it (``previous: failed``); the engine
  keeps the node or drains it like any other. Likewise ERROR of a ``pending`` record counts
  toward the miss run and closes it (node destroyed) only when the run is long enough.
* **Adopt, don't sweep.** Every create is preceded by its stored launch, so a live node of this
  store whose launch is unknown means the store lost it (restored from a backup, a failover
  that dropped the last commits) — and the engine that asked for it may run jobs there. Such a
  node with a domain tag is adopted (``AdoptFound``) and announced; the engine keeps it or
  retires it the safe way. Only a node without a domain (no one to hand it to) is an *orphan*.
* **Orphan grace.** Measured from when this store first saw the node (``Sighting``,
  persisted), not from the cloud's ``created_at``: a restart neither restarts nor skips it.
* **Cap.** One reconciliation destroys at most ``max_destroys`` nodes. Orphans are the class
  a wrong or restored store produces, so when there are more orphans than the cap none is
  destroyed (a circuit breaker); nodes of our own closed launches beyond the cap wait for the
  next round. Either way an alert says so.
* **Listing hygiene.** A node listed twice counts once; a record that changed after the
  listing was taken is not judged by it.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import repeat

from epu.common.messages import PREEMPTED_REASON
from epu.common.retire import Proof
from epu.services.provisioner.cloud import TAG_DEPLOYMENT, TAG_DOMAIN, TAG_STORE, CloudNode
from epu.services.provisioner.records import InstanceRecord, Miss, Sighting
from epu.services.provisioner.states import TERMINAL_INSTANCE_STATES, check_transition

# --------------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class Rules:
    deployment: str
    """This deployment's identity (the ``epu-deployment`` tag)."""
    store_id: str
    """This store's id (the ``epu-store`` tag)."""
    vanish_misses: int = 3
    """Consecutive listings without a record's node before it is presumed gone."""
    vanish_min_seconds: float = 60.0
    """... and the time those listings must span."""
    orphan_grace_seconds: float = 600.0
    """How long an orphan is watched, from its first sighting here, before it is destroyed."""
    max_destroys: int = 5
    """Most nodes one reconciliation destroys (see the module docstring)."""
    resume_after_seconds: float = 30.0
    """A ``requested`` launch with nothing in flight here is re-driven after this long."""


@dataclass(frozen=True)
class World:
    site: str
    nodes: tuple[CloudNode, ...]
    """The listing, as the site returned it (duplicates and foreign nodes included)."""
    listed_at: float
    """When the list call was made; records updated after it are not judged by it."""
    now: float
    records: Mapping[str, InstanceRecord]
    """The site's live records and every record a listed node names (``Store.records_for``)."""
    misses: Mapping[str, Miss] = field(default_factory=dict)
    sightings: Mapping[str, Sighting] = field(default_factory=dict)
    """By cloud id, this site's."""
    busy: frozenset[str] = frozenset()
    """Work in flight here: ``launch:<id>`` and ``terminate:<id>``."""


# --------------------------------------------------------------------------- actions


@dataclass(frozen=True)
class Follow:
    """The cloud says the node moved on: advance the record."""

    instance_id: str
    state: str
    reason: str
    error_kind: str | None = None
    ip: str | None = None


@dataclass(frozen=True)
class NoteIp:
    instance_id: str
    ip: str


@dataclass(frozen=True)
class Notice:
    """The cloud announced it will reclaim a live tracked node (``CloudNode.interruption_at``):
    tell the engine, once (no state changes: the node runs until the cloud takes it)."""

    instance_id: str
    at: float


@dataclass(frozen=True)
class Adopt:
    """A known launch's node the record does not track yet (a crash after the create call)."""

    instance_id: str
    node: CloudNode


@dataclass(frozen=True)
class AdoptFound:
    """A live node with this store's tags and a domain whose launch the store does not know (a
    restored backup, a failover that lost the last commits): recorded as the cloud shows it and
    announced, so the engine — which launched it — keeps or retires it (draining first)."""

    instance_id: str
    domain: str
    node: CloudNode


@dataclass(frozen=True)
class Reopen:
    """A live node of a launch closed ``failed`` (its create took effect but the answer was lost,
    then API errors until the retries ran out): the record is reopened in the state the cloud
    shows and announced (``previous: failed``), so the engine keeps the node or retires it the
    safe way (drain, remove, terminate) — it may have joined the batch system by itself (an
    HTCondor startd does) and run jobs. Never destroyed on the cloud's word alone."""

    instance_id: str
    node: CloudNode
    state: str
    """``pending`` or ``started``: what the node's listing shows (``pending`` for a node listed
    ``ERROR``, which the poll then judges like any pending node's)."""


@dataclass(frozen=True)
class CountMiss:
    miss: Miss


@dataclass(frozen=True)
class ClearMiss:
    instance_id: str


@dataclass(frozen=True)
class PresumeGone:
    instance_id: str
    cloud_id: str
    reason: str


@dataclass(frozen=True)
class Readopt:
    """A presumed-gone record's node is listed again."""

    instance_id: str
    cloud_id: str
    reason: str


@dataclass(frozen=True)
class CloseGone:
    """A record we were terminating whose node is no longer listed: terminated."""

    instance_id: str
    reason: str


@dataclass(frozen=True)
class Destroy:
    """Destroy a node by the provisioner's own rule (carried out through ``terminations``)."""

    cloud_id: str
    launch_id: str
    proof: Proof
    """The rule that makes it safe: ``failed-launch`` (the node of a record closed failed on the
    cloud's word — it holds a quota slot), ``closed-record`` (the node of a record that ended
    before it was seen), ``duplicate`` (a second node of a tracked launch) or ``orphan``."""
    why: str


@dataclass(frozen=True)
class Sight:
    sighting: Sighting


@dataclass(frozen=True)
class Forget:
    cloud_id: str


@dataclass(frozen=True)
class ResumeLaunch:
    instance_id: str


@dataclass(frozen=True)
class ResumeTerminate:
    instance_id: str


@dataclass(frozen=True)
class Alert:
    """Something on a destroy path an operator must hear about (``ProvisionerAlert``)."""

    kind: str
    message: str
    cloud_ids: tuple[str, ...] = ()
    count: int = 1
    """How many nodes it concerns (``cloud_ids`` names at most ``ALERT_IDS``)."""


Action = (Follow | NoteIp | Notice | Adopt | AdoptFound | Reopen | CountMiss | ClearMiss | PresumeGone | Readopt | CloseGone | Destroy | Sight
          | Forget | ResumeLaunch | ResumeTerminate | Alert)


@dataclass
class Plan:
    actions: list[Action] = field(default_factory=list)
    waiting_orphans: list[str] = field(default_factory=list)
    """Orphans inside their grace period (cloud ids)."""
    withheld: list[str] = field(default_factory=list)
    """Destroys the cap refused or deferred (cloud ids)."""
    steady: bool = False
    """Set by ``observe``: every watched record's node was listed and nothing is to be done.
    ``observe`` is a pure function of the listing, the records, the misses and the rules, and
    with every node listed the listing time plays no part: the same inputs again (the same
    objects — records and nodes are immutable) give the same empty plan (``Provisioner.poll``
    returns it; the simulator skips its next poll of the site on it, ``epu.sim.quiet_poll``)."""

    def of(self, kind: type) -> list:
        return [a for a in self.actions if isinstance(a, kind)]


# --------------------------------------------------------------------------- decisions

#: How many cloud ids an alert names (the count says the rest).
ALERT_IDS = 20


_CLOUD_ID = operator.attrgetter("cloud_id")
_TAGS = operator.attrgetter("tags")
_DEPLOYMENT_TAG = operator.methodcaller("get", TAG_DEPLOYMENT)


def ours(world: World, rules: Rules) -> dict[str, CloudNode]:
    """This deployment's nodes by cloud id, each once (the first listing of a duplicate wins)."""
    nodes = world.nodes
    ids = list(map(_CLOUD_ID, nodes))
    if (len(set(ids)) == len(ids)
            and all(map(operator.eq, map(_DEPLOYMENT_TAG, map(_TAGS, nodes)), repeat(rules.deployment)))):
        # The common listing — every node this deployment's, none twice (``LibcloudSite.nodes``
        # answers only its deployment's): the loop's very answer, built in C.
        return dict(zip(ids, nodes, strict=True))
    out: dict[str, CloudNode] = {}
    for node in nodes:
        if node.tags.get(TAG_DEPLOYMENT) == rules.deployment and node.cloud_id not in out:
            out[node.cloud_id] = node
    return out


def observe(world: World, rules: Rules) -> Plan:
    """The poll loop: move each tracked record to what the cloud says, count misses, presume
    gone, re-adopt. Destroys nothing but a node the cloud itself lists as failed (right after its
    record is closed ``failed``: it holds a quota slot until it is gone)."""
    plan = Plan()
    nodes = ours(world, rules)
    site, misses = world.site, world.misses
    # The watched records only matter to forget the misses of those no longer watched: none
    # held (a poll's common case), none is gathered.
    watched: set[str] | None = set() if misses else None
    absent = False
    for rec in world.records.values():
        if rec.site != site or rec.cloud_id is None or rec.state in TERMINAL_INSTANCE_STATES:
            continue  # a launch in flight owns a record without a node
        if watched is not None:
            watched.add(rec.instance_id)
        node = nodes.get(rec.cloud_id)
        if node is None:
            absent = True
            _absent(plan, world, rules, rec)
        elif not _quiet(rec, node, misses):
            _present(plan, world, rules, rec, node)
    if watched is not None:
        plan.actions += [ClearMiss(iid) for iid in misses if iid not in watched]  # closed since: forget
    plan.steady = not absent and not plan.actions
    return plan


def _quiet(rec: InstanceRecord, node: CloudNode, misses: Mapping[str, Miss]) -> bool:
    """Would ``_present`` plan nothing for this pair? The common case of a poll — a listed
    node whose state moves its record nowhere (the same state, or behind a ``joined`` record)
    — answered without building anything. Exactly ``_present``'s conditions, negated: no miss
    to clear, not presumed gone, no allowed transition, no new address, no interruption notice.
    Anything else goes through ``_present``."""
    return (rec.presumed_gone_at is None and node.interruption_at is None
            and (not node.ip or node.ip == rec.ip) and rec.instance_id not in misses
            and not (node.state and _moves(rec.state, node.state)))


@lru_cache(maxsize=256)
def _moves(current: str, new: str) -> bool:
    """``check_transition(current, new).allowed``, remembered (a pure function of two states)."""
    return check_transition(current, new).allowed


def _present(plan: Plan, world: World, rules: Rules, rec: InstanceRecord, node: CloudNode) -> None:
    if _ended_unasked(rec, node):
        _absent(plan, world, rules, rec, shown=node.native_state,
                failed_boot=node.state == "failed" and rec.state in ("requested", "pending"))
        return
    if rec.instance_id in world.misses:
        plan.actions.append(ClearMiss(rec.instance_id))
    if rec.presumed_gone:
        plan.actions.append(Readopt(rec.instance_id, node.cloud_id,
                                    f"listed again by site {world.site} (node {node.cloud_id} {node.native_state}): "
                                    "re-adopted"))
    target = node.state
    if target == "failed":
        reason, kind = f"node in state {node.native_state}", "transient"
    elif target == "terminated" and node.preempted and rec.state != "terminating":
        reason, kind = f"{PREEMPTED_REASON} (node {node.cloud_id})", "preempted"
    elif target == "terminated":
        reason, kind = ("terminated" if rec.state == "terminating"
                        else f"terminated by the cloud (node {node.cloud_id})"), None
    else:
        reason, kind = f"node {node.native_state}", None
    if target and _moves(rec.state, target):
        plan.actions.append(Follow(rec.instance_id, target, reason, kind, node.ip))
        if target == "failed":
            # the cloud says so itself; a failed node still counts against the quota and is billed
            # until it is destroyed, so it goes now, not at the next reconciliation
            plan.actions.append(Destroy(node.cloud_id, rec.instance_id, Proof.FAILED_LAUNCH,
                                        f"record {rec.instance_id} failed: node {node.native_state}"))
    elif node.ip and node.ip != rec.ip:
        plan.actions.append(NoteIp(rec.instance_id, node.ip))
    if node.interruption_at is not None and rec.state in ("pending", "started") and target in ("pending", "started"):
        plan.actions.append(Notice(rec.instance_id, node.interruption_at))


def _ended_unasked(rec: InstanceRecord, node: CloudNode) -> bool:
    """Does the listing say a node ended that we never asked to end and that the cloud did not
    say it reclaimed (a spot preemption names itself)? Then it is this listing's word against
    earlier ones: an OpenStack server a failed live migration left in ERROR runs on, a lagging
    replica of the API answers TERMINATED. Such a listing counts as one that did not show the
    node alive — a miss, toward a presumption (``_absent``) — and never closes the record: a
    closed record's node is destroyed by the next reconciliation, with whatever runs on it.
    ERROR for a node no listing has shown running yet (still ``pending``) is a boot that failed
    only once the listings agree: it counts toward the same run, and ``_absent`` closes the record
    ``failed`` and destroys the node (it holds a quota slot) when the run is long enough and the
    latest listing shows ERROR — a listing that lags a create may show a booted node in ERROR.
    The exception: an end the driver saw itself (``CloudNode.end_observed``)."""
    if node.end_observed:
        return False
    if node.state == "failed":
        return rec.state != "terminating" and _moves(rec.state, "failed")
    return (node.state == "terminated" and not node.preempted and rec.state != "terminating"
            and _moves(rec.state, "terminated"))


def _next_miss(world: World, rec: InstanceRecord) -> Miss | None:
    """The record's run of misses with this listing added; None when this listing adds nothing."""
    if rec.updated_at > world.listed_at:
        return None  # changed after the listing was taken: what it shows there means nothing
    prev = world.misses.get(rec.instance_id)
    if prev is not None and world.listed_at <= prev.last_at:
        return None  # a listing no newer than one already counted (late, or the same twice) is no new miss
    return Miss(rec.instance_id, world.site, (prev.count if prev else 0) + 1,
                prev.first_at if prev else world.listed_at, world.listed_at)


def _absent(plan: Plan, world: World, rules: Rules, rec: InstanceRecord, shown: str | None = None,
            failed_boot: bool = False) -> None:
    """A listing without the record's node (``shown``: with it in that state, see ``_ended_unasked``;
    ``failed_boot``: in ERROR, of a record no listing showed running)."""
    miss = _next_miss(world, rec)
    if miss is None:
        return
    enough = miss.count >= rules.vanish_misses and world.listed_at - miss.first_at >= rules.vanish_min_seconds
    if enough and rec.state == "terminating":
        plan.actions.append(CloseGone(rec.instance_id, f"node {rec.cloud_id} gone after terminate: not listed by "
                                                       f"site {world.site} {miss.count} times"))
        plan.actions.append(ClearMiss(rec.instance_id))
        return
    if enough and shown is not None and failed_boot:
        span = world.listed_at - miss.first_at
        plan.actions.append(Follow(rec.instance_id, "failed", f"node in state {shown}: not listed running in "
                                   f"{miss.count} consecutive listings over {span:.0f} s, boot failed", "transient"))
        plan.actions.append(Destroy(rec.cloud_id or "", rec.instance_id, Proof.FAILED_LAUNCH,
                                    f"record {rec.instance_id} failed: node {shown} in {miss.count} listings"))
        plan.actions.append(ClearMiss(rec.instance_id))
        return
    plan.actions.append(CountMiss(miss))
    if enough and not rec.presumed_gone:
        span = world.listed_at - miss.first_at
        seen = "not listed" if shown is None else f"not listed alive (last: {shown}, never asked to end)"
        plan.actions.append(PresumeGone(
            rec.instance_id, rec.cloud_id or "",
            f"presumed gone: node {rec.cloud_id} {seen} by site {world.site} in {miss.count} consecutive "
            f"listings over {span:.0f} s; not destroyed"))


def reconcile(world: World, rules: Rules) -> Plan:
    """Reconciliation: everything ``observe`` does, plus adopt, sweep (capped), re-drive."""
    plan = observe(world, rules)
    nodes = ours(world, rules)
    closed: list[Destroy] = []
    orphans: list[Destroy] = []
    for node in nodes.values():
        lid = node.launch_id
        if not lid:
            continue  # ours by deployment but not by launch: nothing says what it is for
        rec = world.records.get(lid)
        if rec is None:
            _unknown(plan, world, rules, node, lid, orphans)
        elif rec.site not in (world.site, ""):
            continue  # a launch of another site: that site's reconciliation judges it
        elif rec.cloud_id is None and not rec.terminal:
            if f"launch:{lid}" not in world.busy:
                plan.actions.append(Adopt(lid, node))
        elif rec.terminal:
            if node.state == "terminated":
                continue
            if rec.state == "failed" and (node.live or rec.cloud_id is None):
                # a launch that failed without ever seeing its node (a lost create answer), or
                # whose node the cloud lists alive again: hand it to the engine, never destroy it.
                # (A node listed ERROR of a record closed on repeated ERROR listings still goes.)
                _reopen(plan, world, rec, node)
                continue
            if rec.presumed_gone:
                _sight(plan, world, node, lid, "reappeared",
                       f"node {node.cloud_id} of launch {lid} is listed again after its record was closed as "
                       "vanished; left running: terminate it by hand if it is not wanted")
                continue
            closed.append(Destroy(node.cloud_id, lid, Proof.CLOSED_RECORD, f"record {lid} is {rec.state}"))
        elif node.live and rec.cloud_id != node.cloud_id:
            tracked = nodes.get(rec.cloud_id or "")
            if tracked is not None and tracked.live:  # never on the word of a listing that lacks the tracked one
                closed.append(Destroy(node.cloud_id, lid, Proof.DUPLICATE,
                                      f"duplicate node for launch {lid} (tracked: {rec.cloud_id})"))
    _prune_sightings(plan, world, rules, nodes)
    _cap(plan, world, rules, closed, orphans)
    _redrive(plan, world, rules, nodes)
    return plan


def _sight(plan: Plan, world: World, node: CloudNode, lid: str, kind: str, first_message: str) -> Sighting:
    """Remember when this store first saw ``node`` (and say so the first time)."""
    prev = world.sightings.get(node.cloud_id)
    first = prev.first_seen if prev is not None and prev.kind == kind else world.now
    seen = Sighting(world.site, node.cloud_id, lid, kind, first, world.now)
    plan.actions.append(Sight(seen))
    if prev is None or prev.kind != kind:
        plan.actions.append(Alert(_ALERT_KIND[kind], first_message, (node.cloud_id,)))
    return seen


def _reopen(plan: Plan, world: World, rec: InstanceRecord, node: CloudNode) -> None:
    state = "started" if node.state == "started" else "pending"
    plan.actions.append(Reopen(rec.instance_id, node, state))
    plan.actions.append(Alert("failed-launch-alive", f"node {node.cloud_id} of launch {rec.instance_id}, closed "
                              f"failed ({rec.reason}), is listed {node.native_state} by site {world.site}: "
                              f"reopened as {state} and handed to the engine, which keeps or retires it; "
                              "never destroyed on the cloud's word alone", (node.cloud_id,)))


_ALERT_KIND = {"orphan": "orphan-seen", "foreign": "foreign-node", "reappeared": "node-reappeared"}


def _unknown(plan: Plan, world: World, rules: Rules, node: CloudNode, lid: str, orphans: list[Destroy]) -> None:
    if not node.live:
        if node.cloud_id in world.sightings:
            plan.actions.append(Forget(node.cloud_id))
        return
    store = node.tags.get(TAG_STORE)
    if store != rules.store_id:
        _sight(plan, world, node, lid, "foreign",
               f"node {node.cloud_id} carries this deployment's tag ({rules.deployment}) but "
               f"{'no store id' if not store else 'store ' + store}, not this store's ({rules.store_id}), "
               f"and launch id {lid} is unknown here: never touched. Two stores share one deployment "
               "identity, or the store was re-created")
        return
    domain = node.tags.get(TAG_DOMAIN)
    if domain:
        if node.cloud_id in world.sightings:
            plan.actions.append(Forget(node.cloud_id))
        plan.actions.append(AdoptFound(lid, domain, node))
        plan.actions.append(Alert("orphan-adopted", f"node {node.cloud_id} carries this store's tags but its launch "
                                  f"{lid} is unknown here (a restored or rolled-back store): adopted into domain "
                                  f"{domain}, never destroyed; the engine keeps or retires it", (node.cloud_id,)))
        return
    seen = _sight(plan, world, node, lid, "orphan",
                  f"orphan node {node.cloud_id}: launch id {lid} is unknown to this store; it will be destroyed "
                  f"after {rules.orphan_grace_seconds:.0f} s unless its launch becomes known")
    if world.now - seen.first_seen >= rules.orphan_grace_seconds:
        orphans.append(Destroy(node.cloud_id, lid, Proof.ORPHAN,
                               f"orphan: launch id {lid} unknown, first seen {world.now - seen.first_seen:.0f} s ago"))
    else:
        plan.waiting_orphans.append(node.cloud_id)


def _prune_sightings(plan: Plan, world: World, rules: Rules, nodes: Mapping[str, CloudNode]) -> None:
    """A sighting not listed for a grace period is forgotten; a shorter absence (a partial
    listing) keeps its first-seen time."""
    for cid, s in world.sightings.items():
        if cid not in nodes and world.now - s.last_seen > rules.orphan_grace_seconds:
            plan.actions.append(Forget(cid))


def _cap(plan: Plan, world: World, rules: Rules, closed: list[Destroy], orphans: list[Destroy]) -> None:
    cap = rules.max_destroys
    if len(orphans) > cap:
        ids = tuple(d.cloud_id for d in orphans)
        plan.withheld += ids
        plan.actions.append(Alert(
            "orphan-sweep-refused",
            f"{len(orphans)} orphan nodes at site {world.site} are due for destruction, more than the cap of {cap} "
            "per reconciliation: destroying none. This is what a wrong, re-created or restored store looks "
            "like; check the store, then raise provisioner.max_destroys_per_reconcile or terminate them by hand",
            ids[:ALERT_IDS], len(ids)))
        orphans = []
    due = closed + orphans
    plan.actions += due[:cap]
    if len(due) > cap:
        ids = tuple(d.cloud_id for d in due[cap:])
        plan.withheld += ids
        plan.actions.append(Alert(
            "destroy-deferred",
            f"{len(due)} nodes at site {world.site} are due for destruction; the cap of {cap} per reconciliation "
            f"defers {len(ids)} to the next one",
            ids[:ALERT_IDS], len(ids)))


def _redrive(plan: Plan, world: World, rules: Rules, nodes: Mapping[str, CloudNode]) -> None:
    closing = {a.instance_id for a in plan.of(CloseGone)}
    adopted = {a.instance_id for a in plan.of(Adopt)}
    for rec in world.records.values():
        if rec.site != world.site or rec.terminal or rec.instance_id in closing:
            continue
        if rec.state == "requested" and rec.cloud_id is None:
            if (rec.instance_id not in adopted and world.now - rec.updated_at >= rules.resume_after_seconds
                    and f"launch:{rec.instance_id}" not in world.busy):
                plan.actions.append(ResumeLaunch(rec.instance_id))
        elif rec.state == "terminating" and f"terminate:{rec.instance_id}" not in world.busy:
            node = nodes.get(rec.cloud_id or "")
            if node is None or node.live:
                plan.actions.append(ResumeTerminate(rec.instance_id))
