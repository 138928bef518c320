"""The simulated cloud: one account in virtual time, behind a real libcloud ``NodeDriver``.

Why not ``services/provisioner/sim.py``: that driver keeps its nodes in a SQLite file so that
several processes share one cloud, draws ids from ``uuid`` and sleeps for API latency. The
simulator needs a cloud that lives in memory, takes its ids and every random choice from the
world's seeded streams, models latency as virtual time, and lets the world see every call
(who destroyed what, on whose behalf) to check the invariants. The provisioner still talks to
it through ``LibcloudSite`` exactly as to EC2: ``create_node`` with a client token and tags,
``list_nodes``, ``destroy_node``, errors worded like EC2's.

Each provisioner gets its own ``SimNodeDriver`` (its credentials) on the shared ``SimCloud``
(the account): the cloud knows which provisioner created and destroyed each node.

Faults (``CloudFaults``, all off by default): transient API errors, capacity errors, a create
whose answer is lost, boots that never finish, slow boots, listings that omit live nodes (one
poll or a burst of polls), nodes that vanish for real, preemption.
"""

from __future__ import annotations

import math
import operator
import random
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from libcloud.common.exceptions import BaseHTTPError
from libcloud.common.types import LibcloudError
from libcloud.compute.base import Node, NodeDriver, NodeImage, NodeLocation, NodeSize
from libcloud.compute.types import NodeState

from epu.services.provisioner.cloud import TAG_DEPLOYMENT, TAG_DOMAIN, TAG_LAUNCH
from epu.sim.sameness import SameObjects
from epu.sim.world import World


@dataclass
class CloudFaults:
    """Knobs of one cloud account. Rates are per call (API errors) or per node (boots)."""

    transient_error_rate: float = 0.0
    """A call fails with a 503 (retried by the provisioner)."""
    capacity_error_rate: float = 0.0
    """A create fails with InsufficientInstanceCapacity (the engine fails over)."""
    lost_answer_rate: float = 0.0
    """A create succeeds but its answer is lost (504): the client token must save us."""
    lost_answer_status: int = 504
    """What a lost answer comes back as: 504 (a gateway timeout: the provisioner knows the create
    may have taken effect) or 503 (a refusal that took effect all the same: with the errors after
    it, a launch closed ``failed`` whose node lives, reopened when a listing shows it)."""
    errors_after_lost_answer: int = 0
    """After a lost create answer, this many following create calls fail with a 503 — the
    provisioner's retries run out and its launch closes ``failed`` while the node boots (and, on
    HTCondor, joins by itself and takes jobs)."""
    capacity_after_lost_answer: bool = False
    """Those calls fail with InsufficientInstanceCapacity instead (the lost node took the last
    slot): not transient, so the launch closes ``failed`` at once, and the provisioner's
    reconciliation later finds the node alive and reopens the launch."""
    listing_lag_seconds: float = 0.0
    """A new node appears in listings only up to this long after its create (EC2's eventual
    consistency): a lookup by tag right after a lost answer finds nothing."""
    client_tokens: bool = True
    """The API honours client tokens (EC2). False (OpenStack): a repeated create makes another
    node, so after a lost answer only a listing by the launch-id tag tells what exists."""
    never_boot_rate: float = 0.0
    """A node stays PENDING forever."""
    slow_boot_rate: float = 0.0
    """A node boots after ``slow_boot_seconds`` (past the stall limit)."""
    slow_boot_seconds: float = 900.0
    boot_failure_rate: float = 0.0
    """A node ends in ERROR instead of RUNNING."""
    partial_listing_rate: float = 0.0
    """A listing omits some live nodes (an OpenStack cell down, a lost page)..."""
    partial_listing_polls: tuple[int, int] = (1, 1)
    """... for this many consecutive listings (min, max)."""
    partial_listing_share: float = 0.5
    """Share of live nodes a partial listing omits."""
    wrong_state_rate: float = 0.0
    """A listing shows some running nodes in a state they are not in: ERROR (an OpenStack server
    that a failed live migration left in ERROR while its guest runs on) or TERMINATED (an
    answer from a lagging replica of the API)..."""
    wrong_state_polls: tuple[int, int] = (1, 1)
    """... for this many consecutive listings (min, max), the same nodes in the same wrong state..."""
    wrong_state_share: float = 0.3
    """... a share of the running nodes, each shown in one of ``wrong_states``."""
    wrong_states: tuple[str, ...] = ("error", "terminated")
    vanish_rate_per_hour: float = 0.0
    """Per live node and hour: deleted behind our back, without a trace."""
    preempt_rate_per_hour: float = 0.0
    """Per live node and hour: terminated by the cloud (spot reclaim), listed as TERMINATED."""
    preempt_notice_seconds: float = 0.0
    """A preemption is announced this long before it (EC2's spot interruption notice: 120 s): the
    node is listed with ``extra["interruption_at"]`` from then on. 0: no notice."""


def site_octet(site: str) -> int:
    """A site's second address octet (1-250): stable across runs, derived from its name."""
    return zlib.crc32(site.encode()) % 250 + 1


@dataclass
class VM:
    cloud_id: str
    name: str
    tags: dict[str, str]
    token: str | None
    created_at: float
    boot_at: float
    boot_fails: bool
    created_by: str
    site: str = ""
    terminated_at: float | None = None
    listed_from: float = 0.0
    """Listings show the node from then on (eventual consistency)."""
    destroyed_by: str | None = None
    cause: str = ""
    seq: int = 0
    size: str = ""
    """The provider size it was created with (an instance type's ``size``)."""
    interruption_at: float | None = None
    """The cloud announced it will reclaim the node then (a spot interruption notice)."""

    @property
    def launch_id(self) -> str | None:
        return self.tags.get(TAG_LAUNCH)

    @property
    def ip(self) -> str:
        """Its address, as the cloud's listings show it: unique per VM of a run (each site has
        its own second octet, so two clouds' nodes never share one)."""
        return f"10.{site_octet(self.site)}.{(self.seq >> 8) & 255}.{self.seq & 255}"

    @property
    def domain(self) -> str | None:
        return self.tags.get(TAG_DOMAIN)

    def running(self, now: float) -> bool:
        return self.terminated_at is None and not self.boot_fails and now >= self.boot_at

    @property
    def live(self) -> bool:
        """Exists (and is billed): not terminated, whatever its boot did."""
        return self.terminated_at is None


@dataclass
class CloudStats:
    creates: int = 0
    destroys: int = 0
    lists: int = 0
    errors: int = 0
    preempted: int = 0
    vanished: int = 0
    partial_listings: int = 0
    wrong_listings: int = 0


class SimCloud:
    """One cloud account (all of a site's nodes, whoever created them)."""

    def __init__(self, world: World, name: str, *, quota: int | None = None,
                 boot_seconds: tuple[float, float] = (60.0, 180.0), terminated_linger: float = 120.0,
                 faults: CloudFaults | None = None,
                 boot_time: Callable[[random.Random], float] | None = None,
                 sizes: dict[str, dict[str, Any]] | None = None) -> None:
        self.world = world
        self.name = name
        self.sizes = dict(sizes or {})
        """What ``list_sizes()`` answers: size id → cores, memory_mb, gpus, ``price`` (None: none given)."""
        self.quota = quota
        self.boot_seconds = boot_seconds
        self.boot_time = boot_time
        """Draws a boot time from the cloud's stream (``epu simulate``'s cloud models); None:
        uniform over ``boot_seconds``."""
        self.terminated_linger = terminated_linger
        self.faults = faults or CloudFaults()
        self.enabled = True
        """Faults apply only while enabled (the world turns them off for the quiet tail)."""
        self.vms: dict[str, VM] = {}
        self._current: dict[str, VM] = {}
        """The VMs a listing may still show (live, or terminated less than ``terminated_linger``
        ago): listings and the quota check cost O(live nodes), not O(every node ever made)."""
        self.version = 0
        """Moved by every change of ``_current`` or of a VM in it (created, ended, noticed, gone):
        while it stands, what a listing shows changes only with time (``_listing``)."""
        self._listing: tuple[int, list[VM], float, float] | None = None
        """(version, the VMs listed, the earliest ``listed_from`` of those not listed yet, the
        earliest ``terminated_at`` of the terminated ones; ``inf`` for none) of the last listing:
        the same answer while no VM is due to show up or to leave the listing (both times are
        fixed once set: a VM's ``listed_from`` at its create, its ``terminated_at`` at its end)."""
        self.by_token: dict[str, str] = {}
        self.stats = CloudStats()
        self._ids = 0
        self._rng = world.rng(f"cloud/{name}")
        self._partial_left = 0
        self._wrong_left = 0
        self._errors_left = 0
        """Create calls still to fail after a lost answer (``errors_after_lost_answer``)."""
        self.misreported: dict[str, NodeState] = {}
        """The running nodes the last listing shows in a wrong state, and that state (empty but
        during a ``wrong_state_rate`` episode): the drivers put it on the Nodes they hand out."""
        self.on_running: list[Callable[[VM], None]] = []
        """Called when a node finishes booting (the batch system links its daemon)."""
        self.on_gone: list[Callable[[VM, str], None]] = []
        """Called when a node stops existing for the batch system (destroyed, preempted, vanished)."""
        self.before_destroy: list[Callable[[VM, str], None]] = []
        """Called with (node, caller) before a destroy call takes effect (invariant checks)."""
        self.on_create: list[Callable[[VM], None]] = []
        """Called when a create call made a node (the checker notes whose store it belongs to)."""

    # ------------------------------------------------------------------ world side
    def driver(self, caller: str) -> SimNodeDriver:
        d = SimNodeDriver(self, caller)
        d.client_tokens = self.faults.client_tokens
        return d

    def live_vms(self) -> list[VM]:
        return [v for v in self._current.values() if v.live]

    def _fault(self, rate: float) -> bool:
        return self.enabled and rate > 0 and self._rng.random() < rate

    def _schedule_life(self, vm: VM) -> None:
        """Boot completion, and the random end a node may meet (vanish, preemption)."""
        if math.isfinite(vm.boot_at) and not vm.boot_fails:
            self.world.at(vm.boot_at, lambda: self._booted(vm), f"cloud {self.name} booted {vm.cloud_id}")
        for rate, kind in ((self.faults.vanish_rate_per_hour, "vanish"), (self.faults.preempt_rate_per_hour, "preempt")):
            if self.enabled and rate > 0:
                when = vm.created_at + self._rng.expovariate(rate / 3600.0)
                self.world.at(when, lambda kind=kind: self._accident(vm, kind), f"cloud {self.name} {kind} {vm.cloud_id}")
                notice = self.faults.preempt_notice_seconds
                if kind == "preempt" and notice > 0:
                    self.world.at(max(vm.created_at, when - notice), lambda when=when: self._announce(vm, when),
                                  f"cloud {self.name} interruption notice {vm.cloud_id}")

    def _booted(self, vm: VM) -> None:
        if vm.terminated_at is None:
            for fn in self.on_running:
                fn(vm)

    def _announce(self, vm: VM, when: float) -> None:
        """A spot interruption notice: listings show when the node will be reclaimed."""
        if vm.terminated_at is None and self.enabled:
            vm.interruption_at = when
            self.version += 1

    def _accident(self, vm: VM, kind: str) -> None:
        if vm.terminated_at is not None or not self.enabled:
            return
        self._end(vm, kind, by=None)
        if kind == "vanish":
            self.stats.vanished += 1
            del self.vms[vm.cloud_id]
            self._current.pop(vm.cloud_id, None)
            self.version += 1
            if vm.token:
                self.by_token.pop(vm.token, None)
        else:
            self.stats.preempted += 1

    def _end(self, vm: VM, cause: str, by: str | None) -> None:
        vm.terminated_at = self.world.t
        vm.destroyed_by = by
        vm.cause = cause
        self.version += 1
        for fn in self.on_gone:
            fn(vm, cause)

    # ------------------------------------------------------------------ API (through the driver)
    def _api(self, call: str) -> None:
        f = self.faults
        if self._fault(f.transient_error_rate):
            self.stats.errors += 1
            raise BaseHTTPError(503, f"ServiceUnavailable: simulated transient error on {call}")

    def create(self, caller: str, name: str, tags: dict[str, str], token: str | None, size: str = "") -> VM:
        self._api("create")
        f = self.faults
        if self._errors_left > 0 and self.enabled:
            self._errors_left -= 1
            self.stats.errors += 1
            if f.capacity_after_lost_answer:
                raise LibcloudError("InsufficientInstanceCapacity: simulated: no capacity after a lost create "
                                    "answer", None)
            raise BaseHTTPError(503, "ServiceUnavailable: simulated: the API fails after a lost create answer")
        if token and token in self.by_token:
            return self.vms[self.by_token[token]]
        if self._fault(f.capacity_error_rate):
            self.stats.errors += 1
            raise LibcloudError("InsufficientInstanceCapacity: simulated: no capacity for this size", None)
        if self.quota is not None and sum(1 for v in self._current.values() if v.terminated_at is None) >= self.quota:
            raise LibcloudError(f"InstanceLimitExceeded: quota of {self.quota} instances reached", None)
        now = self.world.t
        if self.boot_time is not None:
            boot = self.boot_time(self._rng)
        else:
            lo, hi = self.boot_seconds
            boot = lo + self._rng.random() * (hi - lo)
        if self._fault(f.never_boot_rate):
            boot = math.inf
        elif self._fault(f.slow_boot_rate):
            boot = f.slow_boot_seconds * (1 + self._rng.random() * 0.2)
        fails = self._fault(f.boot_failure_rate)
        self._ids += 1
        vm = VM(cloud_id=f"{self.name}-{self._ids:05d}", name=name, tags=dict(tags), token=token,
                created_at=now, boot_at=now + boot, boot_fails=fails, created_by=caller, site=self.name,
                seq=self._ids, size=size)
        if self.enabled and f.listing_lag_seconds > 0:
            vm.listed_from = now + self._rng.random() * f.listing_lag_seconds
        self.vms[vm.cloud_id] = vm
        self._current[vm.cloud_id] = vm
        self.version += 1
        if token:
            self.by_token[token] = vm.cloud_id
        self.stats.creates += 1
        self.world.note(f"create {vm.cloud_id} {vm.launch_id} by {caller}")
        for fn in self.on_create:
            fn(vm)
        self._schedule_life(vm)
        if self._fault(f.lost_answer_rate):
            self._errors_left = f.errors_after_lost_answer
            if f.lost_answer_status == 503:
                raise BaseHTTPError(503, "ServiceUnavailable: simulated: the node was created all the same")
            raise BaseHTTPError(504, "GatewayTimeout: simulated: the node was created but the answer was lost")
        return vm

    def list(self, caller: str) -> list[VM]:
        self._api("list")
        self.stats.lists += 1
        now = self.world.t
        out = self._listing_at(now)
        f = self.faults
        if self.misreported or f.wrong_state_rate > 0:
            self._misreport(out, now)
        if self._partial_left <= 0 and self._fault(f.partial_listing_rate):
            lo, hi = f.partial_listing_polls
            self._partial_left = self._rng.randint(lo, hi)
        if self._partial_left > 0 and self.enabled:
            self._partial_left -= 1
            self.stats.partial_listings += 1
            keep = [v for v in out if not (v.terminated_at is None and self._rng.random() < f.partial_listing_share)]
            self.world.note(f"partial listing {self.name}: {len(out) - len(keep)} omitted")
            return keep
        return out

    def _misreport(self, out: list[VM], now: float) -> None:
        """Start, go on with or end an episode of wrong states (``CloudFaults.wrong_state_rate``):
        its nodes are drawn at its start and shown wrong while they still run."""
        f = self.faults
        if self._wrong_left <= 0:
            self.misreported = {}
            if not self._fault(f.wrong_state_rate):
                return
            lo, hi = f.wrong_state_polls
            self._wrong_left = self._rng.randint(lo, hi)
            self.misreported = {v.cloud_id: NodeState(self._rng.choice(f.wrong_states)) for v in out
                                if v.running(now) and self._rng.random() < f.wrong_state_share}
        self._wrong_left -= 1
        if not self.enabled:
            self._wrong_left, self.misreported = 0, {}
            return
        self.misreported = {k: st for k, st in self.misreported.items()
                            if (vm := self.vms.get(k)) is not None and vm.running(now)}
        if self.misreported:
            self.stats.wrong_listings += 1
            self.world.note(f"wrong listing {self.name}: {len(self.misreported)} shown "
                            + ", ".join(sorted({st.value for st in self.misreported.values()})))

    def relisted(self, listed: list[VM]) -> bool:
        """Would ``list`` now return ``listed``, that very list, and do nothing else but count
        the call? Then it is counted (``stats.lists``) and True: the caller may take the last
        answer again without listing. Only when no fault can strike a list call (no transient
        errors, no partial listings: their draws would be skipped) and ``_listing_at`` would hand
        back its last answer; False otherwise, and nothing happened."""
        f, last = self.faults, self._listing
        if self.misreported or self.enabled and (f.transient_error_rate > 0 or f.partial_listing_rate > 0
                                                 or self._partial_left > 0 or f.wrong_state_rate > 0):
            return False
        if last is None or last[1] is not listed or not self._listing_holds(last, self.world.t):
            return False
        self.stats.lists += 1
        return True

    def _listing_holds(self, last: tuple[int, list[VM], float, float], now: float) -> bool:
        """``_listing_at``'s test: the last answer stands at ``now`` — no VM changed (``version``),
        none waiting to be listed is due (every ``listed_from`` after ``now``: the earliest is)
        and no terminated one has lingered its time (none ended at or before ``now - linger``:
        the earliest did not)."""
        return last[0] == self.version and last[2] > now and not last[3] <= now - self.terminated_linger

    def _listing_at(self, now: float) -> list[VM]:
        """The VMs a listing shows at ``now`` (terminated ones linger a while). The last answer
        again — the same list, which callers do not change — while nothing moved ``version``,
        no VM waiting to be listed is due and no terminated one has lingered its time: the very
        tests below, on the few VMs they can change for."""
        last, linger = self._listing, self.terminated_linger
        if last is not None and self._listing_holds(last, now):
            return last[1]
        gone = [k for k, v in self._current.items() if v.terminated_at is not None and v.terminated_at <= now - linger]
        for k in gone:
            del self._current[k]
        if gone:
            self.version += 1
        out = [v for v in self._current.values() if v.listed_from <= now]
        self._listing = (self.version, out, min([v.listed_from for v in self._current.values() if v.listed_from > now],
                                                default=math.inf),
                         min([v.terminated_at for v in self._current.values() if v.terminated_at is not None],
                             default=math.inf))
        return out

    def destroy(self, caller: str, cloud_id: str) -> None:
        self._api("destroy")
        vm = self.vms.get(cloud_id)
        if vm is None:
            raise LibcloudError(f"InvalidInstanceID.NotFound: the instance ID '{cloud_id}' does not exist", None)
        if vm.terminated_at is not None:
            return
        for fn in self.before_destroy:
            fn(vm, caller)
        self.stats.destroys += 1
        self.world.note(f"destroy {cloud_id} by {caller}")
        self._end(vm, "destroyed", by=caller)


class SimNodeDriver(NodeDriver):
    """libcloud's interface over a ``SimCloud``, for one caller (a provisioner's credentials)."""

    type = "epu-sim-world"
    name = "EPU simulator cloud"
    website = "https://example.invalid/epu-sim"
    features = {"create_node": []}

    def __init__(self, cloud: SimCloud, caller: str) -> None:
        super().__init__(key="sim", secret=None, secure=False)
        self.cloud = cloud
        self.caller = caller
        self.client_tokens = True
        self.on_created: Callable[[], None] | None = None
        self._listed: dict[str, tuple[NodeState, Node, float | None]] = {}
        """The Node last listed per VM: handed out again while its state is the same (a VM's
        name, tags and address never change), so a listing of a quiet site builds nothing."""
        self._prune_at = 64
        """``_listed`` is pruned when it grows past this (twice its size after the last prune)."""
        self._steady: tuple[int, list[VM], list[Node], list[VM], float] | None = None
        """(the cloud's version, the VMs, their Nodes, the very list the cloud answered, the
        earliest boot time of its pending VMs) of the last listing: ``_node`` hands out those
        very Nodes again for the very same VMs while the version stands and no pending one is
        due to boot (see ``list_nodes``, ``listing_unchanged``)."""
        self._same = SameObjects()
        """Remembers the tuple of Nodes ``listing_unchanged`` last found to be ``_steady``'s very
        Nodes: a steady site is asked every poll with the same tuple."""
        self.last_answer: tuple[Node, ...] | None = None
        """The Nodes ``list_nodes`` last answered, in order (``epu.sim.quiet_poll`` keeps a steady
        poll's and asks ``listing_unchanged`` about them at the next)."""

    def _node(self, vm: VM) -> Node:
        last = self._listed.get(vm.cloud_id)
        now = self.cloud.world.t
        if (last is not None and vm.terminated_at is None and last[2] == vm.interruption_at
                and (last[0] is not NodeState.PENDING or now < vm.boot_at)):
            # Running, or failed to boot: so it stays until it is terminated (virtual time only
            # moves on; boot_at and boot_fails are fixed at creation); pending, still before its
            # boot time: pending still (the states below, in their order). A quiet listing's node
            # answered without working out its state again.
            return last[1]
        if vm.terminated_at is not None:
            state = NodeState.TERMINATED
        elif vm.boot_fails and now >= vm.boot_at:
            state = NodeState.ERROR
        elif now < vm.boot_at:
            state = NodeState.PENDING
        else:
            state = NodeState.RUNNING
        if last is not None and last[0] is state and last[2] == vm.interruption_at:
            return last[1]
        ip = vm.ip
        node = Node(id=vm.cloud_id, name=vm.name, state=state,
                    public_ips=[ip] if state is NodeState.RUNNING else [],
                    private_ips=[ip] if state is not NodeState.TERMINATED else [], driver=self,
                    extra=self._extra(vm, state), created_at=datetime.fromtimestamp(vm.created_at, UTC))
        # (``is``: ``state`` is one of the members above, and ``NodeState``'s ``==`` is Python.)
        # A terminated VM's Node is kept too: it stays so (its cause and tags are fixed) for as
        # long as it lingers in listings, so those listings hand out the same Node rather than
        # a new one per poll (each converted again downstream). Entries of VMs no listing can
        # show any more are dropped (``_prune``).
        self._listed[vm.cloud_id] = (state, node, vm.interruption_at)
        if len(self._listed) > self._prune_at:
            self._prune()
        return node

    def _prune(self) -> None:
        """Forget the Nodes of VMs the cloud no longer lists (gone from ``SimCloud._current``:
        terminated past their linger, or vanished) — never listed again, so never asked for."""
        current = self.cloud._current
        self._listed = {k: v for k, v in self._listed.items() if k in current}
        self._prune_at = 2 * len(self._listed) + 64

    @staticmethod
    def _extra(vm: VM, state: NodeState) -> dict[str, Any]:
        """What EC2 lists (through libcloud): the tags, and for a spot reclaim the state reason."""
        extra: dict[str, Any] = {"tags": dict(vm.tags)}
        if state is NodeState.TERMINATED and vm.cause == "preempt":
            extra["reason"] = "Server.SpotInstanceTermination: Spot instance termination"
        elif vm.interruption_at is not None and state is not NodeState.TERMINATED:
            extra["interruption_at"] = vm.interruption_at
        return extra

    def create_node(self, name: str, size: NodeSize, image: NodeImage, location: NodeLocation | None = None,
                    auth: Any = None, ex_metadata: dict[str, str] | None = None,
                    ex_userdata: str | None = None, ex_clienttoken: str | None = None,
                    **_kwargs: Any) -> Node:
        vm = self.cloud.create(self.caller, name, dict(ex_metadata or {}),
                               ex_clienttoken if self.client_tokens else None, size=str(size.id))
        if self.on_created is not None:
            self.on_created()  # the world may kill the caller here: the node exists, the answer is lost
        return self._node(vm)

    def list_nodes(self, *args: Any, **kwargs: Any) -> list[Node]:
        """The cloud's listing as libcloud Nodes (``_list_nodes``), with the nodes of an episode of
        wrong states (``CloudFaults.wrong_state_rate``) shown in theirs."""
        nodes = self._list_nodes()
        wrong = self.cloud.misreported
        if wrong:
            nodes = [self._shown_as(n, wrong[n.id]) if n.id in wrong else n for n in nodes]
        self.last_answer = tuple(nodes)
        return nodes

    def _shown_as(self, node: Node, state: NodeState) -> Node:
        """A fresh Node of ``node`` in a state it is not in, ERROR or TERMINATED (never kept: the
        next listing may be right)."""
        return Node(id=node.id, name=node.name, state=state, public_ips=[],
                    private_ips=[] if state is NodeState.TERMINATED else node.private_ips, driver=self,
                    extra={"tags": dict(node.extra.get("tags", {}))},
                    created_at=node.created_at)

    def _list_nodes(self) -> list[Node]:
        """Every listed VM's Node (``_node``). When the version of the cloud has not moved since
        the last listing (no VM ended, none was noticed for reclaim), the very same VMs are listed
        and none of its pending nodes is due to boot (``now`` before the earliest ``boot_at`` of
        them: a running, boot-failed or terminated node's state only a change of the VM, which
        moves the version, can leave; a pending one's also time ends, at its ``boot_at``), ``_node``
        would return each one's last Node: those are returned without asking it again. Pending
        nodes count since a busy cluster nearly always has one booting (a launch a minute): a
        listing that excluded them would be converted and judged again at almost every poll."""
        vms = self.cloud.list(self.caller)
        last = self._steady
        if (last is not None and last[0] == self.cloud.version and self.cloud.world.t < last[4]
                and len(last[1]) == len(vms) and all(map(operator.is_, last[1], vms))):
            if vms is not last[3]:
                self._steady = (last[0], last[1], last[2], vms, last[4])
            return list(last[2])
        # ``_node``'s first test inline (most of a listing that changed is VMs that did not): a
        # running or boot-failed VM still live, a pending one still before its boot time, or a
        # terminated one, with the same notice, is its last Node; any other goes through ``_node``.
        listed, node_of, pending, terminated = self._listed, self._node, NodeState.PENDING, NodeState.TERMINATED
        now = self.cloud.world.t
        nodes = [hit[1] if ((hit := listed.get(v.cloud_id)) is not None
                            and (hit[0] is not pending or now < v.boot_at)
                            and (v.terminated_at is None) is (hit[0] is not terminated)
                            and hit[2] == v.interruption_at) else node_of(v)
                 for v in vms]
        self._steady = (self.cloud.version, list(vms), nodes, vms,
                        min([v.boot_at for v, n in zip(vms, nodes, strict=True) if n.state is pending],
                            default=math.inf))
        return list(nodes)

    def listing_unchanged(self, nodes: list[Node] | tuple[Node, ...]) -> bool:
        """Would ``list_nodes`` now return ``nodes`` — these very Node objects, in this order —
        and do nothing else but count the call? Then it is counted and True:
        the last listing (``_steady``) answered ``nodes``, was the cloud's whole listing, none of
        its pending nodes is due to boot, and the cloud would answer that very list again
        (``SimCloud.relisted``: nothing changed, nothing due, no fault can strike)."""
        last = self._steady
        if last is None or last[0] != self.cloud.version or not self.cloud.world.t < last[4]:
            return False
        if not self._same.check(last, last[2], nodes):
            return False
        return self.cloud.relisted(last[3])

    def destroy_node(self, node: Node) -> bool:
        self.cloud.destroy(self.caller, str(node.id))
        return True

    def list_images(self, location: NodeLocation | None = None, ex_owner: Any = None) -> list[NodeImage]:
        return [NodeImage(id="sim-image", name="sim-image", driver=self)]

    def list_sizes(self, location: NodeLocation | None = None) -> list[NodeSize]:
        """The cloud's sizes as a libcloud driver reports them (``price`` None where it has none)."""
        return [NodeSize(id=sid, name=sid, ram=int(z.get("memory_mb", 0)), disk=0, bandwidth=None,
                         price=z.get("price"), driver=self,
                         extra={"vcpu": int(z.get("cores", 1)), "gpu": int(z.get("gpus", 0))})
                for sid, z in sorted(self.cloud.sizes.items())]

    def list_locations(self) -> list[NodeLocation]:
        return []


__all__ = ["TAG_DEPLOYMENT", "CloudFaults", "SimCloud", "SimNodeDriver", "VM"]
