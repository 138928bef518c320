"""The policy's view of one domain: latest snapshot + the engine's instance table. Pure.

The engine's own instance states come from the census (``census.py``: joined, idle, lost),
which reads the snapshot through this module's ``NodeIndex``.

Which node is an instance's: ``NodeIndex`` — by identity first (``NodeInfo.instance_id``, the
launch id the backend carried into the batch system), and only for nodes that report no
identity by name, normalized to the short host name (``short_name``: HTCondor reports the
FQDN, Slurm and Torque the short name). This is the one place names are compared.
"""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from functools import cached_property, lru_cache
from itertools import count
from typing import Any

from epu.common.messages import PREEMPTED_REASON, JobShape, NodeInfo, QueuedJob, SensorSnapshot, group_jobs

PENDING_STATES = frozenset({"requested", "pending", "started"})
IN_SERVICE = frozenset({"free", "busy"})
ACTIVE_STATES = frozenset({"requested", "pending", "started", "joined"})
LIVE_STATES = frozenset({"requested", "pending", "started", "joined", "draining", "terminating"})


@dataclass(frozen=True, slots=True)
class Instance:
    """One instance as the engine tracks it (a row of the ``instances`` table)."""

    instance_id: str
    domain: str
    site: str
    node_name: str
    cores: int
    state: str
    launched_at: float
    state_at: float
    seq: int = -1
    ip: str | None = None
    joined_at: float | None = None
    idle_since: float | None = None
    drain_at: float | None = None
    """When the last ``offline`` was sent. Kept on an instance put back to ``joined`` because that
    offline failed: an error may be a timeout of an offline that took effect, which the next
    snapshot shows (``lifecycle.Cycle.decision``, step 6b)."""
    add_sent_at: float | None = None
    removed: bool = False
    terminate_sent: bool = False
    reason: str = ""
    missing_since: float | None = None
    """Joined, but its node is absent from the snapshot or ``down`` since then (lost)."""
    seen_at: float | None = None
    """When its node first showed in a snapshot (the batch system knows it since)."""
    retire: str = ""
    """Why it is being taken out ("" = it is not): scale-down, stalled, lost, operator. Set with
    the first step of the way out (offline, remove, or terminate for a node never in the batch
    system); the way out is always offline → empty → remove confirmed → terminate."""
    instance_type: str = ""
    """The catalogue type it was launched as ("" = the site's single type)."""
    gang: str = ""
    """``ID:SIZE``: one of SIZE instances launched as a group for multi-node jobs ("" = none)."""
    reopened_seq: int | None = None
    """The ``seq`` of the event that reopened this instance after a ``failed`` (the provisioner
    found its node alive): events with a lower ``seq`` are older than the reopening and are
    dropped — a ``failed`` otherwise counts as news whatever its ``seq`` (a replaced store counts
    anew), and a late one (a delayed event, an older report) would end the instance again."""

    @property
    def preempted(self) -> bool:
        """The cloud took it back (a spot reclaim): its provisioner said so in the reason it kept."""
        return self.state == "terminated" and self.reason.startswith(PREEMPTED_REASON)

    @property
    def pending(self) -> bool:
        """Launched, not in the batch system yet, and not being given up."""
        return self.state in PENDING_STATES and not self.terminate_sent and not self.retire

    @property
    def active(self) -> bool:
        """Counts towards the domain's size (min/max): live and not on its way out."""
        return self.state in ACTIVE_STATES and not self.terminate_sent and not self.retire

    @property
    def batch_may_know(self) -> bool:
        """The batch system may have (had) a node for it: we added it, a snapshot showed it, or
        its VM ran (a daemon that registers by itself, HTCondor's startd). Such an instance is
        terminated only after the sensor confirmed its node removed (or an operator forced it)."""
        return (self.add_sent_at is not None or self.seen_at is not None or self.joined_at is not None
                or self.state in ("started", "joined", "draining"))

    @property
    def terminate_unless_started(self) -> bool:
        """Its terminate in flight was sent ``unless_started`` (the planner sends every unforced
        terminate of an instance the batch system cannot know so): the engine's view lags the
        cloud, so the provisioner carries it out only while the VM has not started. Once the
        instance is reported ``started``, that terminate is refused (the provisioner refuses it
        from then on, and one it accepted would have moved the instance to ``terminating``, never
        back to ``started``): it is no longer in flight, and the instance goes the safe way out."""
        return self.terminate_sent and self.state in ("requested", "pending") and not self.batch_may_know


def _by_state(by_short: dict[str, NodeInfo]) -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    """The short names of the busy, the idle (free, no job, no core used) and the down nodes, in
    one pass (three comprehensions were ~12 ms at 50,000 nodes, this ~6)."""
    busy: list[str] = []
    idle: list[str] = []
    down: list[str] = []
    is_busy, is_idle, is_down = busy.append, idle.append, down.append
    for k, n in by_short.items():
        state = n.state
        if state == "busy":
            is_busy(k)
        elif state == "free":
            if not n.jobs and not n.cores_used:
                is_idle(k)
        elif state == "down":
            is_down(k)
    return frozenset(busy), frozenset(idle), frozenset(down)


_INDEX_SERIALS = count(1)
"""Serials of ``NodeIndex`` objects (never reused: ``Census.gathered_at`` names one without keeping it)."""


@lru_cache(maxsize=1 << 16)
def short_name(name: str) -> str:
    """The one normalization of node names: the short host name, lower case."""
    return name.split(".", 1)[0].lower()


class NodeIndex:
    """A snapshot's nodes, found by instance identity, then by short name (see module docstring)."""

    __slots__ = ("by_id", "by_name", "by_short", "busy_short", "idle_short", "down_short", "_free",
                 "serial", "since", "left_busy", "items")

    def __init__(self, nodes: dict[str, NodeInfo] | list[NodeInfo] | None = None,
                 before: NodeIndex | None = None) -> None:
        """``before``: the domain's previous snapshot's index (the engine's, on arrival): the
        short names that stopped being busy since are kept (``left_busy``), so
        ``refresh_census_again`` finds the quiet instances whose node changed without a pass over
        every quiet one (~5 ms at 50,000 nodes, most of it memory stalls of string compares)."""
        self.serial = next(_INDEX_SERIALS)
        self._free: list[NodeInfo] | None = None
        items = list(nodes.values()) if isinstance(nodes, dict) else list(nodes or [])
        self.items: list[NodeInfo] = items
        """The nodes as given, in order (the next snapshot's index compares its own with them)."""
        if before is not None and len(items) == len(before.items) and all(map(operator.is_, items, before.items)):
            self._same_as(before)
            return
        self.by_name: dict[str, NodeInfo] = {n.name: n for n in items}
        with_id = [n for n in items if n.instance_id]
        self.by_id: dict[str, NodeInfo] = {n.instance_id: n for n in with_id}  # type: ignore[misc]
        bare = [n for n in items if not n.instance_id] if with_id else items
        # the first node of a short name wins (built backwards: the last assignment stays); a name
        # in lower case without a dot is its own short name (no call: built once per snapshot,
        # at 50,000 nodes every step counts)
        self.by_short: dict[str, NodeInfo] = {
            (name if name.islower() and "." not in name else short_name(name)): n
            for n in reversed(bare) for name in (n.name,)}
        self.busy_short: frozenset[str] | None = None
        """Short names whose node is busy, when no node carries an instance id (None then):
        ``refresh_census_again`` finds which quiet instances' nodes stopped being busy with one
        set difference instead of 50,000 look-ups. Built once per snapshot, on arrival."""
        self.idle_short: frozenset[str] | None = None
        """Likewise, short names whose node is idle (free, no job, no core used)."""
        self.down_short: frozenset[str] | None = None
        """Likewise, short names whose node is down (a joined instance there is lost, and stays so)."""
        if not self.by_id:
            self.busy_short, self.idle_short, self.down_short = _by_state(self.by_short)
        self.since: int | None = None
        """``before``'s serial when ``left_busy`` was computed against it."""
        self.left_busy: frozenset[str] | None = None
        """``before.busy_short - busy_short`` (with ``since``): every short name that stopped
        being busy since ``before``."""
        if before is not None and before.busy_short is not None and self.busy_short is not None:
            self.since, self.left_busy = before.serial, before.busy_short - self.busy_short

    def _same_as(self, before: NodeIndex) -> None:
        """This index over the very node objects ``before`` was built on (frozen: most snapshots
        of a quiet cluster repeat the last one's nodes): its look-ups copied, its name sets shared
        (frozen), nothing left busy — what building it anew gives, without a pass per look-up."""
        self.by_name = dict(before.by_name)
        self.by_id = dict(before.by_id)
        self.by_short = dict(before.by_short)
        self.busy_short, self.idle_short, self.down_short = before.busy_short, before.idle_short, before.down_short
        self.since = self.left_busy = None
        if before.busy_short is not None:  # (no identities: the sets exist; the same nodes, none left busy)
            self.since, self.left_busy = before.serial, frozenset()
        if before._free is not None:
            self._free = list(before._free)

    @property
    def free(self) -> list[NodeInfo]:
        """The free workers (free, a core left), in the snapshot's order: ``DomainView.free_workers``.
        Listed once per index (the engine asks on arrival: a pass over 50,000 nodes is ~5 ms)."""
        if self._free is None:
            self._free = [n for n in self.by_name.values() if n.state == "free" and n.cores_used < n.cores]
        return self._free

    def find(self, inst: Instance) -> NodeInfo | None:
        node = self.by_id.get(inst.instance_id) if self.by_id else None
        if node is not None or not self.by_short:
            return node
        # a name found as it is is short already (every key is): short_name would not change it
        name = inst.node_name
        node = self.by_short.get(name)
        return node if node is not None else self.by_short.get(short_name(name))

    def __len__(self) -> int:
        return len(self.by_name)


@dataclass(frozen=True)
class JobDigest:
    """Queued demand grouped by shape: (cores per node, nodes) → number of jobs.

    Built once per snapshot (not per iteration): 100,000 jobs collapse to a handful of shapes."""

    shapes: dict[tuple[int, int], int]
    jobs: int
    cores: int
    max_wait: float
    detail: tuple[JobShape, ...] = ()
    """The demand shapes themselves (time limits, waits), for policies that need more than counts."""

    @classmethod
    def of(cls, jobs: list[QueuedJob]) -> JobDigest:
        return cls.of_shapes(group_jobs(jobs))

    @classmethod
    def of_snapshot(cls, snapshot: SensorSnapshot) -> JobDigest:
        return cls.of_shapes(snapshot.all_shapes()) if snapshot.available else cls({}, 0, 0, 0.0)

    @classmethod
    def of_shapes(cls, shapes: list[JobShape]) -> JobDigest:
        """Only ``demand`` shapes count: held, dependent or limit-blocked jobs are no reason to launch."""
        by_size: Counter[tuple[int, int]] = Counter()
        max_wait = 0.0
        for s in shapes:
            if s.demand:
                by_size[(s.cores, s.nodes)] += s.count
                if s.max_wait_s > max_wait:
                    max_wait = s.max_wait_s
        return cls(dict(by_size), sum(by_size.values()),
                   sum(c * n * k for (c, n), k in by_size.items()), max_wait,
                   tuple(s for s in shapes if s.demand))


@dataclass
class DomainView:
    domain: str
    now: float
    available: bool
    demand: JobDigest
    nodes: dict[str, NodeInfo]
    instances: list[Instance]
    min_nodes: int = 0
    max_nodes: int = 10
    cores_per_node: int = 1
    memory: dict[str, Any] = field(default_factory=dict)
    parts: Parts | None = None
    """active/pending/joined/draining if already computed (the census does it in its pass)."""
    index: NodeIndex | None = None
    """The snapshot's nodes by identity and short name (built from ``nodes`` when not given)."""
    healthy_since: float = 0.0
    """Since when the pipeline (sensor, broker, provisioner, engine) has been seen healthy without
    a break: stall and loss clocks run only from then (our own outage is not a site's fault)."""
    breaker: str = ""
    """Why the circuit breaker is open ("" = closed): scale-down and "lost" handling are frozen."""
    cleanup: list[Instance] = field(default_factory=list)
    """Instances that ended (preempted, vanished, forced) whose batch node was never confirmed
    removed: their node is removed so a pool name is reused."""
    snapshot_at: float = 0.0
    """When the snapshot behind this view was taken (a command sent after it is not visible yet)."""
    catalogue: Any = None
    """The domain's instance-type offers (a ``shaped.Catalogue``) when it decides by shapes;
    ``None``: single-type sites, the cores-only counter (``demand``) as before."""
    free: list[NodeInfo] | None = None
    """The snapshot's free workers if already listed (the engine lists them once per snapshot)."""
    gangs: bool | None = None
    """False: no instance belongs to a gang (the engine's census knows it: ``incomplete_gangs``
    skips its pass over every instance); None: not known."""

    # ---- derived sets, used by every policy (computed once per view: 10,000 instances add up)
    def node_of(self, inst: Instance) -> NodeInfo | None:
        if self.index is None:
            self.index = NodeIndex(self.nodes)
        return self.index.find(inst)

    @cached_property
    def _parts(self) -> Parts:
        return self.parts if self.parts is not None else partition(self.instances)

    @property
    def active(self) -> list[Instance]:
        return self._parts[0]

    @property
    def pending(self) -> list[Instance]:
        return self._parts[1]

    @property
    def joined(self) -> list[Instance]:
        return self._parts[2]

    @property
    def draining(self) -> list[Instance]:
        return self._parts[3]

    def free_workers(self) -> list[NodeInfo]:
        """Nodes (ours or static) the batch system can give a job now."""
        return self._free

    @cached_property
    def _free(self) -> list[NodeInfo]:
        if self.free is not None:
            return self.free
        return [n for n in self.nodes.values() if n.state == "free" and n.cores_used < n.cores]

    def idle(self, min_seconds: float) -> list[Instance]:
        """Our joined nodes idle for at least ``min_seconds``, longest idle first."""
        out = [i for i in self.joined if i.idle_since is not None and self.now - i.idle_since >= min_seconds]
        return sorted(out, key=lambda i: (i.idle_since, i.instance_id))

    def running_jobs(self, inst: Instance) -> bool:
        node = self.node_of(inst)
        return bool(node and (node.jobs or node.cores_used))


def is_idle(node: NodeInfo | None) -> bool:
    return node is not None and node.state == "free" and not node.jobs and node.cores_used == 0


Parts = tuple[list[Instance], list[Instance], list[Instance], list[Instance]]

_FIELDS = tuple(f.name for f in fields(Instance))
_ROW = operator.attrgetter(*_FIELDS)
_AT = {f: k for k, f in enumerate(_FIELDS)}


def _builder() -> Callable[..., Instance]:
    """``Instance(*row)`` without its ``__init__``'s generic frozen-dataclass path: a new object
    whose slots are set with their own descriptors (one ``object.__setattr__`` lookup per field
    was most of an ``evolve``: ~1.6 µs of 2.3, this ~0.9). Made as ``dataclasses`` makes
    ``__init__`` (source text), the fields in declaration order, all given (a row has them all)."""
    env: dict[str, Any] = {"_new": object.__new__, "_cls": Instance}
    body = []
    for k, name in enumerate(_FIELDS):
        env[f"_set{k}"] = getattr(Instance, name).__set__
        body.append(f"    _set{k}(o, {name})")
    src = f"def build({', '.join(_FIELDS)}):\n    o = _new(_cls)\n" + "\n".join(body) + "\n    return o\n"
    exec(src, env)  # noqa: S102 — our own field names only
    return env["build"]


_BUILD = _builder()


def evolve(inst: Instance, **changes: Any) -> Instance:
    """``dataclasses.replace(inst, **changes)``, four times faster (its generic path was ~10 µs
    per call: a new snapshot that changes 500 timers at 50,000 nodes called it ~1,000 times)."""
    row = list(_ROW(inst))
    for k, v in changes.items():
        row[_AT[k]] = v
    return _BUILD(*row)


def partition(instances: list[Instance]) -> Parts:
    """active, pending, joined, draining — in one pass (instances being terminated are in none)."""
    active: list[Instance] = []
    pending: list[Instance] = []
    joined: list[Instance] = []
    draining: list[Instance] = []
    for i in instances:
        if i.terminate_sent:
            continue
        s = i.state
        if s == "joined" and not i.retire:
            joined.append(i)
            active.append(i)
        elif s == "draining" or (i.retire and s in ACTIVE_STATES):
            draining.append(i)
        elif s in PENDING_STATES:
            pending.append(i)
            active.append(i)
    return active, pending, joined, draining


def dissolve_complete_gangs(instances: list[Instance]) -> list[Instance] | None:
    """A gang whose members have all joined has done its job: its members become ordinary
    instances (a later scale-down of one must not look like an incomplete group). Returns the new
    list, or ``None`` when no gang completed (the common case: nothing to store)."""
    groups: dict[str, list[int]] = {}
    for k, inst in enumerate(instances):
        if inst.gang and not inst.terminate_sent:
            groups.setdefault(inst.gang, []).append(k)
    done = [ks for gang, ks in groups.items()
            if sum(1 for k in ks if instances[k].state == "joined") >= gang_size(gang)]
    if not done:
        return None
    out = list(instances)
    for ks in done:
        for k in ks:
            out[k] = replace(out[k], gang="")
    return out


def gang_size(gang: str) -> int:
    size = gang.rpartition(":")[2]
    return int(size) if size.isdigit() else 0


def build_view(domain: str, snapshot: SensorSnapshot | None, digest: JobDigest | None,
               instances: list[Instance], now: float, *, min_nodes: int, max_nodes: int,
               cores_per_node: int, memory: dict[str, Any] | None = None,
               nodes: dict[str, NodeInfo] | NodeIndex | None = None, all_live: bool = False,
               parts: Parts | None = None, healthy_since: float = 0.0, breaker: str = "",
               cleanup: list[Instance] | None = None, free: list[NodeInfo] | None = None,
               gangs: bool | None = None) -> DomainView:
    """``digest``, ``nodes`` and ``free`` (the free workers of ``nodes``) may be precomputed once
    per snapshot (the engine does);
    ``all_live`` says the instances were loaded live-only already (skips a filter pass)."""
    available = snapshot is not None and snapshot.available
    index = nodes if isinstance(nodes, NodeIndex) else None
    if nodes is None:
        nodes = {n.name: n for n in snapshot.nodes} if available and snapshot else {}
    by_name = index.by_name if index is not None else nodes
    if digest is None:
        digest = JobDigest.of_snapshot(snapshot) if snapshot else JobDigest({}, 0, 0, 0.0)
    live = instances if all_live else [i for i in instances if i.state in LIVE_STATES]
    return DomainView(domain, now, available, digest, by_name, live, min_nodes, max_nodes,  # type: ignore[arg-type]
                      cores_per_node, dict(memory or {}), parts if all_live else None, index,
                      healthy_since, breaker, list(cleanup or []), snapshot.taken_at if snapshot else 0.0,
                      free=free, gangs=gangs if all_live else None)
