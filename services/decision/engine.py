"""The decision engine's imperative shell: feeds messages into the store, runs iterations.

Per domain and iteration: refresh the instance table from the latest snapshot, build the
view, call the domain's policy, plan (guard rails + placement), store the plan *then* send
it, publish a decision record. Everything that decides is in the pure modules
(``policies/``, ``planner``, ``placement``, ``view``, ``demand``); this class only moves data
between them, the store and the broker.

Safety rules the shell keeps around the pure core (issue 11):

* our own outage is not a site's fault: each domain has a ``healthy_since`` — reset whenever a
  snapshot is unavailable or late, a launch or terminate goes unanswered, a publish fails, or
  the engine itself was not iterating — and stall/loss clocks only run from it;
* launch failures reported by the provisioner are counted in the next iteration, at most one
  per site (with the stalls), and re-launching is the iteration's job: there is one launch
  path;
* the circuit breaker (``breaker.check``) is evaluated on every snapshot; while it is open
  nothing is taken out, and its opening and closing are published (a ``DecisionRecord`` with
  no action and the reason in its notes);
* a node counts as removed only when the sensor's ``remove`` succeeded.

Failover: snapshots reach only the active consumer of a domain's single-active-consumer
snapshot queue, and the engine acts on a domain only while it holds a snapshot younger than
``active_window_seconds`` *and* the domain's lease in the shared store (``lease``; every
committed plan re-checks it, so an engine that lost the lease cannot commit, hence cannot
send). When the active engine dies the broker hands the queue to the standby, whose first
snapshot activates it once the lease is free, and the shared store tells it every launch
already made — so no launch is repeated (re-sends keep their id).
"""

from __future__ import annotations

import copy
import logging
import math
import operator
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from epu.common.clock import Clock, RealClock
from epu.common.config import EpuConfig
from epu.common.config.catalogue import site_types
from epu.common.messages import (
    INSTANCE_STATE_ORDER,
    INTERRUPTION_REASON,
    TERMINAL_INSTANCE_STATES,
    ActionRecord,
    DecisionRecord,
    Envelope,
    InstanceEvent,
    InstanceReport,
    Message,
    NodeCommandResult,
    NodeInfo,
    PolicyChange,
    PolicyOutcome,
    SensorSnapshot,
    TerminateRequest,
    UnsatisfiableShape,
    ViewSummary,
    new_id,
)
from epu.services.decision import breaker, budget
from epu.services.decision.actions import Decision
from epu.services.decision.census import Census, CensusKeeper
from epu.services.decision.changes import ChangeRejected, apply_change, check_ceiling
from epu.services.decision.lease import Fenced, StaleWrite
from epu.services.decision.lifecycle import add_started
from epu.services.decision.offers import from_offered
from epu.services.decision.packing import describe_shape, unservable
from epu.services.decision.placement import SiteHealth, SiteInfo, record_success
from epu.services.decision.planner import PlacementInput, Plan, node_name_for, plan, shadow
from epu.services.decision.policies import (
    DEMAND_SENSITIVE,
    Params,
    PolicyError,
    durations,
    get_policy,
    validate_params,
)
from epu.services.decision.ports import DecisionLeases, DecisionStore
from epu.services.decision.shaped import Catalogue, build_catalogue, uses_catalogue
from epu.services.decision.snaporder import ClockSkew, SnapshotOrder
from epu.services.decision.store import PlanWrite
from epu.services.decision.view import (
    DomainView,
    Instance,
    JobDigest,
    NodeIndex,
    build_view,
    dissolve_complete_gangs,
    evolve,
    partition,
)

log = logging.getLogger("epu.decision")

#: How often a message's handler is run again when another engine's write made what it read
#: stale (``Engine._read_then_write``) before the error goes to the consumer.
_STALE_TRIES = 5


@dataclass
class _Latest:
    """The newest snapshot of a domain, digested once on arrival (not at every iteration)."""

    snapshot: SensorSnapshot
    digest: JobDigest
    nodes: NodeIndex
    received_at: float
    free: list[NodeInfo] | None = None
    """The snapshot's free workers (``DomainView.free_workers``), listed once per snapshot."""
    jobs_verdict: str | None = None
    """The circuit breaker's snapshot-only question (``breaker.jobs_verdict``), asked once."""


@dataclass
class _Prepared:
    """A domain's iteration up to its commit (``Engine._prepare``): what to store (``write``,
    None: nothing) and, once stored, what to send and record."""

    domain: str
    plan: Plan
    now: float
    iteration: int
    saw: ViewSummary | None
    """What the decision record says the domain looked like (only when one will be published:
    the views of 1,000 domains are not kept alive until the sends)."""
    policy: str
    version: int
    always: bool
    """Publish a decision record even without actions (the notes are an event)."""
    write: PlanWrite | None


@dataclass
class _Health:
    """Per domain, in memory: since when the pipeline has looked healthy, and the breaker."""

    healthy_since: float
    last_iteration: float
    breaker: str = ""
    breaker_since: float = 0.0
    released: bool = False
    """An operator released the breaker: ignore it until a healthy snapshot."""
    publish_failed: bool = False

    def deadline(self, now: float, spans: list[float]) -> float:
        """When this health may next change what an iteration does: ``now`` while it looks
        unhealthy (each iteration moves ``healthy_since``: ``Engine._pipeline``, ``_breaker``),
        else the first of ``spans`` (the policy's durations: a stall counts healthy pipeline time)
        counted from ``healthy_since`` that is not past."""
        if self.publish_failed or (self.breaker and not self.released) or self.healthy_since >= self.last_iteration:
            return now
        return min((t for t in (self.healthy_since + d for d in spans) if t >= now), default=math.inf)


class Engine:
    def __init__(self, config: EpuConfig, store: DecisionStore, publish: Callable[[Message], Any],
                 clock: Clock | None = None, publish_many: Callable[[list[Message]], Any] | None = None,
                 leases: DecisionLeases | None = None) -> None:
        self.config = config
        self.settings = config.decision
        self.store: DecisionStore = store
        self.publish = publish
        self.publish_many = publish_many
        """Sends a burst of actions with one confirm wait (the service's); without it, one by one."""
        self.clock = clock or RealClock()
        self.domains = list(config.domains)
        self.site_infos = {n: SiteInfo(n, s.quota, s.price_per_hour, s.cores) for n, s in config.sites.items()}
        self.types = {n: site_types(n, s) for n, s in config.sites.items()}
        """Each site's instance-type catalogue, from config (docs/demand.md); a site that
        ``discover``s sizes takes what the provisioner found (``apply_offered``)."""
        self.cooldown: dict[tuple[str, str], float] = {}
        """(site, type) offerings out until then after a capacity error (``on_instance_event``)."""
        self.spot_failures: dict[str, tuple[int, float]] = {}
        """Domain → (capacity errors of spot offerings in a row, when the last one came)."""
        self.unsatisfiable: dict[str, list[UnsatisfiableShape]] = {}
        """Domain → pending jobs no type of its catalogue can serve (newest iteration)."""
        self._latest: dict[str, _Latest] = {}
        self.site_caps = {n: s.budget_per_hour for n, s in config.sites.items() if s.budget_per_hour is not None}
        """Site → its spend cap ([sites.NAME] budget_per_hour), over every domain."""
        self.budget_held: dict[str, str] = {}
        """Domain → why the spend cap held launches at its last iteration (status and metric)."""
        self.order = SnapshotOrder()
        """Which snapshot of a domain is newer, by its sensor's count (snaporder.py)."""
        self.skew = ClockSkew()
        """How far each domain's sensor clock is off: its ``taken_at`` in the engine's clock."""
        self.leases: DecisionLeases | None = leases
        """Fencing across engine processes (None: this engine is the only one, e.g. in-process tests)."""
        self._health: dict[str, _Health] = {}
        self._was_active: set[str] = set()
        self._reports: dict[str, float] = {}
        """When the provisioner's last anti-entropy report of each domain arrived: its heartbeat."""
        self._asked_again: dict[str, float] = {}
        """Instance → when a terminate was last re-sent for it (``_unfinished_terminates``)."""
        self._failures: dict[str, str] = {}
        """Launch failures seen since the last iteration, per site (counted once there)."""
        self.census = CensusKeeper()
        """Each domain's census (joined, idle, lost), taken again only when its inputs changed."""
        self._ending: dict[str, tuple[int, list[Instance]]] = {}
        """Per domain: (instance stamp, its ``terminating`` instances) (``_unfinished_terminates``)."""
        self._launched: Counter[tuple[str, str]] = Counter()
        """(site, type) → launches planned in this iteration, not committed yet (``_live_per_type``)."""
        self._params: dict[str, tuple[str, dict[str, Any], Params]] = {}
        """Per policy name: (the name, a copy of the parameters it validated, the result) — the
        last validation, reused while a config's parameters equal that copy (``_policy_params``)."""
        self.iterations = 0
        for name, cfg in config.domains.items():
            try:
                validate_params(cfg.policy, cfg.params)
            except PolicyError as exc:
                raise ValueError(f"domains.{name}: {exc}") from None
            store.seed_config(name, cfg, self.clock.now())

    # ------------------------------------------------------------------ input
    def _sync(self) -> None:
        self.store.sync()  # another engine may have written the shared store since we last looked

    def handle_input(self, msg: Message, _envelope: Envelope | None = None) -> None:
        if isinstance(msg, SensorSnapshot):
            self.on_snapshot(msg)
        elif isinstance(msg, InstanceEvent):
            self._read_then_write(self.on_instance_event, msg)
        elif isinstance(msg, NodeCommandResult):
            self._read_then_write(self.on_node_result, msg)
        elif isinstance(msg, InstanceReport):
            self._read_then_write(self.on_instance_report, msg)
        else:
            self._sync()

    def _read_then_write(self, handler: Callable[[Any], Any], msg: Message) -> None:
        """Run a handler on the store as it is now, again while another engine's write makes
        what it read stale (``StaleWrite``: each write that changes an instance is a
        compare-and-set). Handlers are functions of the store and the message, and a refused
        write stored nothing, so running one again is safe. After ``_STALE_TRIES`` the error
        goes to the consumer (the message is redelivered)."""
        for attempt in range(_STALE_TRIES):
            self._sync()
            try:
                handler(msg)
                return
            except StaleWrite as exc:
                if attempt + 1 == _STALE_TRIES:
                    raise
                log.info("another engine wrote the store meanwhile: read again", extra={
                    "type": msg.TYPE, "attempt": attempt + 1, "reason": str(exc)})

    def on_snapshot(self, snap: SensorSnapshot) -> bool:
        """Keep the newest snapshot of a domain; True when its queued demand differs from the
        one before (the caller may then iterate at once rather than at the next tick)."""
        if snap.domain not in self.config.domains:
            return False
        prev = self._latest.get(snap.domain)
        if not self.order.admit(snap):
            return False  # an older snapshot arriving late says nothing new (by its sensor's count)
        self.skew.observe(snap.domain, snap.taken_at, self.clock.now())
        digest = JobDigest.of_snapshot(snap)
        nodes = NodeIndex(snap.nodes if snap.available else [], before=prev.nodes if prev is not None else None)
        latest = self._latest[snap.domain] = _Latest(snap, digest, nodes, self.clock.now(), free=nodes.free)
        if prev is not None and prev.jobs_verdict is not None and _same_jobs_question(prev.snapshot, snap):
            latest.jobs_verdict = prev.jobs_verdict  # the same question: the same answer
        return prev is None or prev.digest.shapes != digest.shapes

    def is_active(self, domain: str) -> bool:
        latest = self._latest.get(domain)
        return latest is not None and self.clock.now() - latest.received_at <= self.settings.active_window_seconds

    def acting(self, domain: str, now: float) -> bool:
        """Fresh snapshot and (with fencing) the domain's lease, taken or renewed now."""
        if not self.is_active(domain):
            return False
        if self.leases is None:
            return True
        try:
            return self.leases.hold(domain, now)
        except Exception as exc:  # the store is busy or away: no lease this round, no action
            log.warning("lease check failed", extra={"domain": domain, "error": f"{type(exc).__name__}: {exc}"})
            return False

    def _acting_domains(self, now: float) -> list[str]:
        """``acting`` for every domain; the leases this engine holds renewed first in one
        transaction when the leases can (``Leases.renew_many``), the rest one by one."""
        if self.leases is None:
            return [d for d in self.domains if self.acting(d, now)]
        fresh = [d for d in self.domains if self.is_active(d)]
        try:
            renewed = self.leases.renew_many(fresh, now)
        except Exception as exc:  # the store is busy or away: each domain's own check says so
            log.warning("lease renewal failed", extra={"domains": len(fresh), "error": f"{type(exc).__name__}: {exc}"})
            renewed = set()
        return [d for d in fresh if d in renewed or self.acting(d, now)]

    def leadership(self, domain: str) -> str:
        """``active``, ``standby`` or ``fenced`` (see ``lease``)."""
        active = self.is_active(domain)
        if self.leases is None:
            return "active" if active else "standby"
        return self.leases.state(domain, active)

    def latest_snapshot(self, domain: str) -> SensorSnapshot | None:
        latest = self._latest.get(domain)
        return latest.snapshot if latest is not None else None

    def snapshot_taken(self, domain: str) -> float | None:
        """When the newest snapshot of ``domain`` was taken, in this engine's clock (None: none)."""
        latest = self._latest.get(domain)
        if latest is None:
            return None
        return self.skew.engine_time(domain, latest.snapshot.taken_at, latest.received_at)

    def forget_snapshots(self) -> None:
        """The runtime lost its broker connection: whatever this engine knew may be another
        engine's to act on now (the broker may hand the snapshot queue to a standby). Forget the
        snapshots — the engine acts again only on a snapshot received after reconnecting —, the
        pipeline-health clocks, and the store's cached working set (re-read from the shared store
        then); give the leases up."""
        self._latest.clear()
        self._health.clear()
        self.census.forget()
        self._ending.clear()
        self.store.invalidate()
        if self.leases is not None:
            self.leases.release()

    def _fence(self, domain: str, now: float) -> Any:
        return self.leases.fence(domain, now) if self.leases is not None else None

    def on_instance_report(self, report: InstanceReport) -> int:
        """Anti-entropy: apply the provisioner's full state of a domain, entry by entry, as the
        events it summarizes (forward only, by seq). Returns how many entries were news. A
        repair never counts a failure against a site: those follow live events only."""
        self._reports[report.domain] = self.clock.now()  # the provisioner is alive (our pipeline check)
        self.apply_offered(report.offered)
        repaired = 0
        items = [e for e in report.instances if e.domain == report.domain]
        known = self.store.seqs([e.instance_id for e in items]) if items else {}
        live = {i.instance_id: i.state for i in self.store.instances(report.domain)} if items else {}
        stale: list[str] = []
        for evt in items:
            seq = known.get(evt.instance_id)
            state = live.get(evt.instance_id)
            if seq is None or evt.seq > seq or (
                    state is not None and INSTANCE_STATE_ORDER[evt.state] > INSTANCE_STATE_ORDER[state]):
                repaired += 1
                self.on_instance_event(evt, repair=True)
            elif state is None and evt.state not in TERMINAL_INSTANCE_STATES:
                stale.append(evt.instance_id)
        if stale:
            self._end_stale(report.domain, stale)
        if repaired:
            log.info("instance table repaired from a provisioner report",
                     extra={"domain": report.domain, "entries": repaired})
        return repaired

    def apply_offered(self, offered: dict[str, list[Any]]) -> list[str]:
        """A provisioner's discovered catalogues (``instance.report`` ``offered``) replace the
        config-only catalogue of each site that ``discover``s sizes; other sites keep their
        declared types. Returns the sites whose catalogue changed."""
        changed = []
        for site, items in offered.items():
            cfg = self.config.sites.get(site)
            if cfg is None or not cfg.discover:
                continue
            types = from_offered(site, items)
            if types != self.types.get(site):
                self.types[site] = types
                changed.append(site)
                log.info("instance types of a site discovered by the provisioner",
                         extra={"site": site, "types": len(types)})
        return changed

    def _end_stale(self, domain: str, instance_ids: list[str]) -> None:
        """A provisioner holds live records of instances that ended here (its store was restored
        from a backup older than their end): tell it they are over, or its store never matches
        the cloud. Safe: each ended here on a provisioner's word that its node was terminated or
        failed; a record already closed there ignores it."""
        if self.acting(domain, self.clock.now()):  # else the acting engine does it
            self._terminate_again(domain, instance_ids,
                                  "ended (the provisioner's record of it is older than its end)")

    def _terminate_again(self, domain: str, instance_ids: list[str], reason: str) -> None:
        for iid in instance_ids:
            log.info("terminate re-sent", extra={"domain": domain, "instance": iid, "reason": reason})
            self.publish(TerminateRequest(request_id=new_id(), instance_id=iid, domain=domain, reason=reason))

    def _unfinished_terminates(self, domains: list[str], now: float) -> None:
        """A terminate is answered by ``terminating``; if ``terminated`` never follows, the
        provisioner that answered lost it (it died before the destroy and came back on another
        store): ask again, every ``10 × resend_seconds``. The engine decided this end already (the
        node was drained first), so asking again is safe; a closed record ignores it."""
        after = 10 * self.settings.resend_seconds
        for domain in domains:
            ending = self._terminating(domain)
            due = [i.instance_id for i in ending if now - i.state_at >= after
                   and now - self._asked_again.get(i.instance_id, i.state_at) >= after]
            for iid in due:
                self._asked_again[iid] = now
            self._terminate_again(domain, due, "terminate re-sent: terminating for too long")
        if len(self._asked_again) > 1000:  # forget the ended ones now and then
            ending_ids = {i.instance_id for d in domains for i in self.store.instances(d) if i.state == "terminating"}
            self._asked_again = {k: v for k, v in self._asked_again.items() if k in ending_ids}

    def _terminating(self, domain: str) -> list[Instance]:
        """The domain's instances in ``terminating``, listed again only when its instances changed."""
        stamp = self.store.domain_stamp(domain)
        cached = self._ending.get(domain)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        ending = self.store.terminating(domain)
        self._ending[domain] = (stamp, ending)
        return ending

    def on_instance_event(self, evt: InstanceEvent, repair: bool = False) -> None:
        if evt.domain not in self.config.domains:
            return
        now = self.clock.now()
        inst = self.store.instance(evt.instance_id)
        if inst is None:
            if evt.state in TERMINAL_INSTANCE_STATES:
                return
            inst = Instance(evt.instance_id, evt.domain, evt.site, evt.node_name or node_name_for(
                evt.domain, evt.instance_id), evt.cores or 1, "requested", evt.at, evt.at,
                reason="adopted: announced by a provisioner", instance_type=evt.instance_type)
        if evt.interruption_at is not None and not repair:
            self._interrupted(inst, evt)
            return
        if (evt.previous == "failed" and inst.state == "failed" and evt.state not in TERMINAL_INSTANCE_STATES
                and evt.seq > inst.seq):
            self._reopened(inst, evt, now)
            return
        if inst.reopened_seq is not None and evt.seq < inst.reopened_seq:
            return  # older than its reopening (a delayed event, an older report): the failure it undid
        forward = INSTANCE_STATE_ORDER[evt.state] > INSTANCE_STATE_ORDER[inst.state] or (
            evt.state == "failed" and inst.state not in TERMINAL_INSTANCE_STATES)
        if evt.seq <= inst.seq and not forward:
            # stale or duplicate (rule 4). A state further on is news whatever its seq: seqs count
            # one store's record, and a provisioner on a replaced or restored store counts anew
            return
        # one copy (an Instance has twenty-odd fields: each replace costs microseconds per event)
        new = evolve(inst, seq=max(evt.seq, inst.seq), ip=evt.ip or inst.ip, state=evt.state, state_at=now,
                      reason=evt.reason or inst.reason) if forward else \
            evolve(inst, seq=max(evt.seq, inst.seq), ip=evt.ip or inst.ip)
        answered: tuple[str, ...] = ("launch",)
        if evt.state in ("terminating", "terminated", "failed"):
            answered += ("terminate",)
        if evt.state in TERMINAL_INSTANCE_STATES:
            answered += ("add", "offline", "online")
        if forward and evt.state == "started" and inst.terminate_unless_started:  # refused: it may have a job
            new, answered = evolve(new, terminate_sent=False), (*answered, "terminate")
        self.store.record_instance_event(new, answered, f"instance {evt.state}")
        if evt.state == "started" and not repair:
            self._spot_started(inst)
        if (evt.state == "failed" and evt.error_kind == "capacity" and inst.instance_type and not repair
                and not inst.terminate_sent and inst.joined_at is None):
            self._capacity_error(inst, now, evt.reason)
        elif evt.state == "failed" and not inst.terminate_sent and inst.joined_at is None and not repair:
            # counted against the site at the next iteration (once per site per iteration);
            # the replacement is the iteration's too: the policy sees the supply gone
            self._failures.setdefault(inst.site, f"launch failed: {evt.error_kind or 'error'}: {evt.reason}"[:300])
            log.warning("launch failed", extra={"site": inst.site, "instance": inst.instance_id,
                                                "kind": evt.error_kind, "reason": evt.reason})

    def _reopened(self, inst: Instance, evt: InstanceEvent, now: float) -> None:
        """The provisioner reopened a launch it had closed ``failed``: the cloud lists its node
        alive (the create took effect, its answer was lost, the retries ran out). The node may
        have joined the batch system by itself and run jobs, so the instance is live again —
        joined when a snapshot shows it, kept or retired the safe way (drain, remove, terminate)
        like any other. Its stall clock starts now; an end decided earlier is decided again."""
        new = evolve(inst, seq=evt.seq, ip=evt.ip or inst.ip, state=evt.state, state_at=now, launched_at=now,
                     reason=evt.reason or inst.reason, terminate_sent=False, reopened_seq=evt.seq)
        self.store.save_instances([new])
        log.warning("a failed launch's node is alive: taken back", extra={
            "domain": inst.domain, "instance": inst.instance_id, "state": evt.state, "reason": evt.reason})

    def _interrupted(self, inst: Instance, evt: InstanceEvent) -> None:
        """The cloud will reclaim a live instance soon (a spot interruption notice): it leaves at
        once, ``retire = "interrupted"`` — its node removed with its jobs requeued (the life
        cycle's next step), then terminated — and stops counting as capacity, so the demand it
        served is placed again now, not after the preemption. Idempotent; a notice for an
        instance already ended or being terminated changes nothing."""
        if (inst.state in TERMINAL_INSTANCE_STATES or inst.terminate_sent or inst.removed
                or inst.retire == "interrupted" or inst.seq < 0):
            return
        self.store.save_instances([replace(inst, retire="interrupted", idle_since=None,
                                           reason=evt.reason or INTERRUPTION_REASON)])
        log.warning("interruption notice: draining the node before the cloud takes it",
                    extra={"domain": inst.domain, "instance": inst.instance_id, "node": inst.node_name,
                           "at": evt.interruption_at})

    def on_node_result(self, res: NodeCommandResult) -> None:
        """A command's answer: the action done and, when the answer changes it, the instance — in
        one compare-and-set write (``Store.record_node_result``): two transactions let a retry
        after a conflict find the action done and drop the change (a removal lost)."""
        row = self.store.action(res.command_id)
        if row is None:
            return
        if row["domain"] != res.domain or row["kind"] != res.action:
            # bound to its sender (common.senders): a sensor answers only its own domain's commands
            log.warning("node result does not answer its command: ignored", extra={
                "command_id": res.command_id, "result": f"{res.domain}/{res.action}",
                "command": f"{row['domain']}/{row['kind']}"})
            return
        if row["done"]:
            self._late_offline(res, row)
            return
        outcome = "ok" if res.ok else f"error: {res.error or res.output}"[:1000]
        inst = self.store.instance(row["target"])
        new: Instance | None = None
        if inst is None:
            pass
        elif res.action == "remove" and res.ok:
            new = evolve(inst, removed=True)  # the only proof of removal
        elif res.action == "add" and not res.ok:
            new = replace(inst, add_sent_at=None)  # retried next iteration
        elif (res.action == "offline" and not res.ok and inst.state == "draining" and inst.retire == "scale-down"
              and row["created_at"] <= inst.state_at):
            # Only a failure of the offline that began the drain undoes it: a re-sent one may fail
            # after an earlier attempt took (``epu sim --seed 7046 --scenario batch-faults``), and
            # the next snapshot decides. ``drain_at`` stays: an error may be a timeout of an offline
            # that took effect, which ``lifecycle`` (step 6b) drains once a snapshot shows it.
            new = replace(inst, state="joined", retire="")
        elif res.action == "online" and not res.ok and inst.state == "joined":
            # still drained in the batch system: back on the way out (drain, remove, terminate)
            new = replace(inst, state="draining", drain_at=self.clock.now(), retire=inst.retire or "scale-down")
        self.store.record_node_result(res.command_id, outcome, new)

    def _late_offline(self, res: NodeCommandResult, row: dict[str, Any]) -> None:
        """A command is sent again while no answer came (the sensor was down), so one command can
        be answered twice: a first attempt that failed (a timeout) and a later one that took
        effect. The failure already put a scale-down drain back to ``joined``; a success after it
        means the node *is* offline in the batch system. Believing the failure would leave a
        drained node that the engine counts as in service, never idle and never retired — billed
        forever (``epu sim --seed 1010 --scenario policy-spare``). So the drain is taken up again:
        the node is on its way out (remove when empty, then terminate) or, if demand comes back,
        reclaimed with ``online`` like any draining node."""
        if not (res.ok and res.action == "offline" and str(row.get("outcome") or "").startswith("error")):
            return
        inst = self.store.instance(row["target"])
        if inst is None or inst.state != "joined" or inst.retire or inst.removed:
            return
        self.store.save_instances([replace(inst, state="draining", drain_at=self.clock.now(),
                                           retire=inst.retire or "scale-down")])

    # ------------------------------------------------------------------ control
    def handle_control(self, msg: Message, _envelope: Envelope | None = None) -> None:
        if isinstance(msg, PolicyChange):
            self._read_then_write(self.on_policy_change, msg)
        else:
            self._sync()

    def on_policy_change(self, change: PolicyChange) -> PolicyOutcome:
        now = self.clock.now()
        prior = self.store.change_outcome(change.change_id)
        if prior is not None:  # a re-delivered change: answer again, apply once
            current = self.store.current_config(change.domain)
            out = PolicyOutcome(change_id=change.change_id, domain=change.domain, applied=prior["applied"],
                                version=prior["version"], reason=prior["reason"],
                                config=current[1].model_dump(mode="json") if current else {})
            self.publish(out)
            return out
        current = self.store.current_config(change.domain)
        who = {"operator": change.operator, "request": change.model_dump_json(
            exclude={"change_id", "domain", "operator"}, exclude_defaults=True)}
        if change.domain not in self.config.domains or current is None:
            reason = f"unknown domain {change.domain!r} (managed: {', '.join(self.domains) or 'none'})"
            self.store.record_change(change.change_id, change.domain, False, reason, now, **who)
            out = PolicyOutcome(change_id=change.change_id, domain=change.domain, applied=False, reason=reason)
        else:
            try:
                retiring = self._retirements(change)
                new = apply_change(current[1], change, list(self.site_infos))
                check_ceiling(new, self.config.domains.get(change.domain),
                              {n: s.quota for n, s in self.config.sites.items()})
            except ChangeRejected as exc:
                self.store.record_change(change.change_id, change.domain, False, str(exc), now, **who)
                out = PolicyOutcome(change_id=change.change_id, domain=change.domain, applied=False,
                                    version=current[0], reason=str(exc),
                                    config=current[1].model_dump(mode="json"))
            else:
                changed = new != current[1]
                version = self.store.record_change(change.change_id, change.domain, True, "", now,
                                                   new if changed else None, retire=retiring, **who) or current[0]
                if change.sites is not None:  # the operator lets listed sites back in
                    health = self.store.site_health()
                    self.store.save_sites([record_success(health[s]) for s in change.sites if s in health])
                if change.release_breaker:
                    h = self._health.get(change.domain)
                    if h is not None and h.breaker:
                        h.released = True
                what = [f"applied by {change.operator or 'operator'}"]
                if retiring:
                    what.append(f"{len(retiring)} instance(s) to drain and terminate")
                if change.release_breaker:
                    what.append("circuit breaker released")
                out = PolicyOutcome(change_id=change.change_id, domain=change.domain, applied=True,
                                    version=version, reason="; ".join(what), config=new.model_dump(mode="json"))
        log.info("policy change", extra={"domain": change.domain, "applied": out.applied, "reason": out.reason})
        self.publish(out)
        return out

    def _retirements(self, change: PolicyChange) -> list[Instance]:
        """An operator's unforced terminate: the instances, marked to go the safe way out."""
        out = []
        for iid in change.retire or []:
            inst = self.store.instance(iid)
            if inst is None or inst.domain != change.domain:
                raise ChangeRejected(f"retire: no instance {iid} in domain {change.domain}")
            if inst.state in TERMINAL_INSTANCE_STATES or inst.terminate_sent:
                continue  # already on its way out
            out.append(replace(inst, retire=inst.retire or "operator", idle_since=None))
        return out

    # ------------------------------------------------------------------ iterations
    def iterate(self) -> list[DecisionRecord]:
        """One iteration over every domain this engine is active for, then due re-sends.

        Every domain's plan is prepared first, then all plans that write are committed in one
        transaction (``Store.commit_plans``: one savepoint and one lease check per domain), then
        each committed plan is sent, in domain order. Store-before-send holds for every command
        (all were durable, under the lease, before the first send); a fenced domain, or one whose
        write failed, sends nothing and is tried again at the next iteration — the others go on.
        At 1,000 domains this is one commit per iteration instead of one per domain."""
        now = self.clock.now()
        self.iterations += 1
        records = []
        active = self._acting_domains(now)
        if active:
            self._sync()
        if set(active) - self._was_active:
            # newly in charge (first snapshot, a takeover): another engine may have written since
            self.store.invalidate()
        self._was_active = set(active)
        sites = self._site_context() if active else None  # read once, kept current below
        self._launched = Counter()
        prepared: list[_Prepared] = []
        for domain in active:
            try:
                prepared.append(self._prepare(domain, now, sites))
            except Exception:
                log.exception("iteration failed", extra={"domain": domain})
        failed = self._commit([p.write for p in prepared if p.write is not None])
        self._launched = Counter()  # stored now (or not at all): the store counts them
        for p in prepared:
            if p.write is not None and p.domain not in failed:
                self._stored(p.write)
            why = failed.get(p.domain)
            if isinstance(why, StaleWrite):
                log.warning("another engine wrote the store during this iteration: nothing committed or sent "
                            "(read again next iteration)", extra={"domain": p.domain, "reason": str(why)})
                continue
            if isinstance(why, Fenced):
                log.warning("fenced: another engine holds the domain now; nothing committed or sent",
                            extra={"domain": p.domain, "reason": str(why)})
                active.remove(p.domain)
                continue
            if why is not None:
                log.error("iteration failed: its plan was not stored, nothing sent (tried again next iteration)",
                          exc_info=why, extra={"domain": p.domain})
                continue
            try:
                record = self._send_prepared(p)
            except Exception:
                log.exception("iteration failed", extra={"domain": p.domain})
                continue
            if record is not None:
                records.append(record)
        try:
            self.resend(active, now)
            self._unfinished_terminates(active, now)
        except Exception:
            log.exception("re-send failed")
            self._publish_failed(active)
        return records

    def _commit(self, writes: list[PlanWrite]) -> dict[str, Exception]:
        """Store the plans of an iteration, all in one transaction (``commit_plans``); returns the domains whose plan was not stored, with why. A failure of
        the transaction as a whole (its commit) fails every domain: nothing is sent."""
        if not writes:
            return {}
        try:
            return dict(self.store.commit_plans(writes))
        except Exception as exc:
            return {w.domain: exc for w in writes}

    def _placement_input(self, cfg: Any, health: dict[str, SiteHealth], live: dict[str, int],
                         unproven: dict[str, int]) -> PlacementInput:
        return PlacementInput(cfg.sites or list(self.site_infos), cfg.placement, self.site_infos, health,
                              live, unproven, self.settings.backoff_initial_seconds,
                              self.settings.backoff_max_seconds, tuple(cfg.node_names),
                              {t: (tuple(n.names), n.pattern) for t, n in cfg.type_nodes.items()})

    def _site_context(self) -> tuple[dict[str, SiteHealth], dict[str, int], dict[str, int]]:
        """Site health and live/unproven counts over all domains (quota is per site)."""
        live, unproven = self.store.live_per_site()
        return self.store.site_health(), live, unproven

    def _pipeline(self, domain: str, latest: _Latest, now: float, instances: list[Instance]) -> _Health:
        """Update since when the pipeline has looked healthy for ``domain`` (see the module docstring)."""
        gap = self.settings.pipeline_gap_seconds
        h = self._health.get(domain)
        if h is None:
            h = self._health[domain] = _Health(healthy_since=now, last_iteration=now)
        snap = latest.snapshot
        why = ""
        if now - h.last_iteration > gap:
            why = "the engine was not iterating"
        elif not snap.available:
            why = "sensor unavailable"
        elif now - latest.received_at > gap:
            why = "no fresh snapshot"
        elif h.publish_failed:
            why = "publishing failed"
        elif self.store.overdue(domain, now - gap):
            why = "provisioner not answering"
        elif (domain in self._reports and now - self._reports[domain] > gap
              and any(i.pending for i in instances)):
            # a provisioner that sends reports stopped sending them while launches are under way:
            # it is down (its launches may have booted unseen), not the site
            why = "provisioner silent"
        h.publish_failed = False
        h.last_iteration = now
        if why:
            h.healthy_since = now
        return h

    def _refresh(self, domain: str, latest: _Latest, now: float) -> tuple[
            list[Instance], list[Instance], Any, list[Instance], list[Instance], list[Instance] | None, str | None,
            bool]:
        """The domain's instances refreshed from its latest snapshot (the census): (before, after,
        parts, changed, newly joined, dissolved gangs' list or None, the breaker's verdict,
        whether an instance of ``after`` may belong to a gang)."""
        snap = latest.snapshot
        before, census = self.census.take(domain, self.store.domain_stamp(domain), latest.nodes, snap.available, now,
                                          lambda: self.store.instances(domain))
        after, parts, changed, came = census.instances, census.parts, census.changed, census.joined
        dissolved = dissolve_complete_gangs(after) if census.gangs else None
        if dissolved is not None:
            self.census.forget(domain)  # (the dissolved list is stored: the next census starts anew)
            after, parts = dissolved, partition(dissolved)
            changed = [a for a, b in zip(after, before, strict=True) if a is not b and a != b]
        return before, after, parts, changed, came, dissolved, self._breaker_check(census, latest), census.gangs

    def iterate_domain(self, domain: str, now: float,
                       sites: tuple[dict[str, SiteHealth], dict[str, int], dict[str, int]] | None = None,
                       ) -> DecisionRecord | None:
        """One domain's iteration on its own: prepare, commit (raises ``Fenced`` when the lease
        is gone: nothing stored, nothing sent), send. ``iterate`` does the same for all domains
        with one commit."""
        self._launched = Counter()
        p = self._prepare(domain, now, sites)
        if p.write is not None:
            w = p.write
            self._launched = Counter()
            self.store.commit_plan(domain, w.plan, now, w.memory, w.iteration, w.refreshed, fence=w.fence)
            self._stored(w)
        return self._send_prepared(p)

    def _stored(self, w: PlanWrite) -> None:
        """A domain's plan was committed: if it wrote only the census's changed instances, the
        store holds exactly the census's objects now (``CensusKeeper.stored``)."""
        if not w.plan.instances:
            self.census.stored(w.domain, self.store.domain_stamp(w.domain))

    def _prepare(self, domain: str, now: float,
                 sites: tuple[dict[str, SiteHealth], dict[str, int], dict[str, int]] | None = None,
                 ) -> _Prepared:
        """Everything of a domain's iteration up to its commit: refresh, view, policy, plan; the
        iteration's site context (``sites``) counts its launches at once, so the next domain's
        placement sees them (a plan that then fails to commit only made the others more careful)."""
        latest = self._latest[domain]
        current = self.store.current_config(domain)
        assert current is not None
        version, cfg = current
        memory, iteration = self.store.memory(domain)
        snap = latest.snapshot
        before, after, parts, changed, came, dissolved, why, gangs = self._refresh(domain, latest, now)
        health_ = self._pipeline(domain, latest, now, before)
        notes_extra = self._breaker(domain, health_, why, now)
        if latest.free is None:
            latest.free = [n for n in latest.nodes.by_name.values() if n.state == "free" and n.cores_used < n.cores]
        view = build_view(domain, snap, latest.digest, after, now, min_nodes=cfg.min_nodes,
                          max_nodes=cfg.max_nodes, cores_per_node=cfg.cores_per_node, memory=memory,
                          nodes=latest.nodes, all_live=True, parts=parts, healthy_since=health_.healthy_since,
                          breaker="" if health_.released else health_.breaker,
                          cleanup=self.store.cleanup(domain) if snap.available else [], free=latest.free,
                          gangs=gangs)
        view.snapshot_at = self.skew.engine_time(domain, snap.taken_at, latest.received_at)  # vs. drain_at
        health, live, unproven = sites if sites is not None else self._site_context()
        if uses_catalogue(cfg, self.config.sites):
            view.catalogue = self.catalogue(domain, cfg, live, now)
            if snap.available:
                notes_extra += self._report_unsatisfiable(domain, view.demand.detail, view.catalogue)
        decision = self.decide(view, cfg)
        joined = [a for a, b in zip(after, before, strict=True) if a is not b and a.state == "joined"
                  and b.state != "joined"] if dissolved is not None else came
        successes = {i.site: record_success(health[i.site]) for i in joined
                     if i.site in health and health[i.site].failures}
        health.update(successes)
        for i in joined:
            unproven[i.site] = max(0, unproven.get(i.site, 0) - 1)
        for site, why_ in self._take_failures(cfg).items():
            decision.failed_sites.setdefault(site, why_)
        placement = self._placement_input(cfg, health, live, unproven)
        if cfg.budget_per_hour or self.site_caps:
            placement = replace(placement, budget=budget.budget_for(
                cfg.budget_per_hour, self.site_caps, view.instances, self._live_per_type(),
                budget.price_table({n: i.price_per_hour for n, i in self.site_infos.items()}, self.types)))
        out = plan(view, decision, placement, self.store.in_flight(domain))
        notes_extra += self._held(domain, out.budget)
        if cfg.mode == "observe":
            out = shadow(out)
        out.sites = {**successes, **out.sites}
        write = None
        if out.actions or changed or out.sites or (decision.memory is not None and decision.memory != memory):
            iteration += 1
            write = PlanWrite(domain, out, now, decision.memory, iteration, changed, self._fence(domain, now))
        health.update(out.sites)
        for p in out.actions:
            if p.kind == "launch":
                live[p.site] = live.get(p.site, 0) + 1
                unproven[p.site] = unproven.get(p.site, 0) + 1
                inst = out.instances.get(p.instance_id)
                self._launched[(p.site, inst.instance_type if inst is not None else p.instance_type)] += 1
        notes_extra += out.refused  # a refused add is news even when nothing was sent
        if notes_extra:
            out.notes = notes_extra + [n for n in out.notes if n not in notes_extra]
        saw = summarize(view, self.unsatisfiable.get(domain, [])) if out.actions or out.shadow or notes_extra \
            else None
        return _Prepared(domain, out, now, iteration, saw, cfg.policy, version, bool(notes_extra or out.shadow),
                         write)

    def _send_prepared(self, p: _Prepared) -> DecisionRecord | None:
        return self._send(p.domain, p.plan, p.now, p.iteration, p.plan.notes, p.saw, p.policy, p.version,
                          always=p.always)

    def catalogue(self, domain: str, cfg: Any, live: dict[str, int], now: float) -> Catalogue:
        """The domain's offers now: its sites' types, their rooms, minus offerings cooling down
        (and spot ones while the domain has fallen back to on-demand)."""
        names = [n for n in (cfg.sites or list(self.site_infos)) if n in self.site_infos]
        types = [t for n in names for t in self.types.get(n, [])]
        excluded = {k for k, until in self.cooldown.items() if until > now}
        if self._spot_off(domain, now):
            excluded |= {(t.site, t.name) for t in types if t.spot}
        return build_catalogue(types, cfg,
                               {n: self.site_infos[n].quota for n in names}, live, self._live_per_type(),
                               frozenset(excluded))

    def _live_per_type(self) -> dict[tuple[str, str], int]:
        """The store's live instances per (site, type), plus this iteration's launches not
        committed yet (``iterate`` commits every domain's plan after all are prepared)."""
        counts = self.store.live_per_type()
        for key, n in self._launched.items():
            counts[key] = counts.get(key, 0) + n
        return counts

    def _offer(self, site: str, instance_type: str) -> Any:
        return next((t for t in self.types.get(site, []) if t.name == instance_type), None)

    def _capacity_error(self, inst: Instance, now: float, reason: str) -> None:
        """A typed launch met a capacity error: that offering (site, type) is out for the cooldown —
        the next iteration's packer places the demand on the next cheapest offer — and the site is
        not backed off (its other types may have room). Spot errors count towards the fallback."""
        key = (inst.site, inst.instance_type)
        self.cooldown[key] = now + self.settings.capacity_cooldown_seconds
        t = self._offer(*key)
        spot = bool(t is not None and t.spot)
        if spot:
            n, _at = self.spot_failures.get(inst.domain, (0, 0.0))
            self.spot_failures[inst.domain] = (n + 1, now)
        log.warning("capacity error: offering cooling down, failing over", extra={
            "domain": inst.domain, "site": inst.site, "type": inst.instance_type, "spot": spot,
            "until": self.cooldown[key], "reason": reason})

    def _spot_started(self, inst: Instance) -> None:
        """A spot instance came up: spot has capacity again, the run of errors is over."""
        t = self._offer(inst.site, inst.instance_type) if inst.instance_type else None
        if t is not None and t.spot:
            self.spot_failures.pop(inst.domain, None)

    def _spot_off(self, domain: str, now: float) -> bool:
        """Spot offers left out for ``domain``: too many capacity errors in a row, recently."""
        n, at = self.spot_failures.get(domain, (0, 0.0))
        if n < self.settings.spot_fallback_failures:
            return False
        if now - at >= self.settings.spot_fallback_seconds:
            self.spot_failures.pop(domain, None)  # time to try spot again
            return False
        return True

    def _report_unsatisfiable(self, domain: str, shapes: Any, catalogue: Catalogue) -> list[str]:
        """Pending jobs no type can serve: logged once per shape (again only if it went away and came
        back), kept for the metric and the decision records; notes for the shapes new this time (the
        engine then publishes a record even without actions: the report is an event)."""
        found = [UnsatisfiableShape(count=u.jobs, shape=describe_shape(u.shape), constraint=u.constraint,
                                    reason=u.reason)
                 for u in unservable(shapes, catalogue.offers, catalogue.default_partition)]
        before = {(u.shape, u.constraint) for u in self.unsatisfiable.get(domain, [])}
        self.unsatisfiable[domain] = found
        notes = []
        for u in found:
            if (u.shape, u.constraint) not in before:
                log.warning("unsatisfiable jobs: no instance type can serve them; never launched for",
                            extra={"domain": domain, "jobs": u.count, "shape": u.shape, "constraint": u.constraint,
                                   "reason": u.reason})
                notes.append(f"unsatisfiable ({u.constraint}): {u.count} x {u.shape}: {u.reason}")
        return notes

    def _take_failures(self, cfg: Any) -> dict[str, str]:
        """Launch failures since the last iteration, for the sites of this domain (once each)."""
        mine = set(cfg.sites or self.site_infos)
        out = {s: why for s, why in self._failures.items() if s in mine}
        for s in out:
            del self._failures[s]
        return out

    def _breaker_check(self, census: Census, latest: _Latest) -> str | None:
        """Why the latest snapshot is implausible ("" = it is fine; None = unavailable, not judged):
        ``breaker.check`` on the refresh's counts, its snapshot-only half once per snapshot."""
        snap = latest.snapshot
        if not snap.available:
            return None
        share, ok = self.settings.breaker_missing_share, self.settings.breaker_ok_count
        if latest.jobs_verdict is None:
            latest.jobs_verdict = breaker.jobs_verdict(snap, share=share, ok_count=ok)
        return breaker.missing_verdict(census.known, census.missing, share=share, ok_count=ok) or latest.jobs_verdict

    def _breaker(self, domain: str, h: _Health, why: str | None, now: float) -> list[str]:
        """Evaluate the circuit breaker on the latest snapshot (``why``: ``_breaker_check``'s
        verdict); notes when it opens or closes."""
        if why is None:
            return []
        notes: list[str] = []
        if why and not h.breaker:
            h.breaker, h.breaker_since = why, now
            notes.append(f"circuit breaker open: {why}; no scale-down and no lost-node handling until a "
                         "healthy snapshot (or epu policy release-breaker)")
            log.warning("circuit breaker open", extra={"domain": domain, "why": why})
        elif not why and h.breaker:
            notes.append(f"circuit breaker closed after {now - h.breaker_since:.0f}s: the snapshot is plausible "
                         f"again (was: {h.breaker})")
            log.info("circuit breaker closed", extra={"domain": domain})
            h.breaker, h.released = "", False
        elif why:
            h.breaker = why
        if h.breaker and not h.released:
            h.healthy_since = now  # nothing is lost while we cannot see
        return notes

    def _held(self, domain: str, why: str) -> list[str]:
        """Remember why the spend cap holds launches (status, metric); a note — hence a decision
        record, the event — when the cap starts or stops holding them."""
        before = self.budget_held.get(domain, "")
        if why:
            self.budget_held[domain] = why
        else:
            self.budget_held.pop(domain, None)
        if why and not before:
            log.warning("spend cap holds launches", extra={"domain": domain, "why": why})
            return [why]
        if before and not why:
            return ["spend cap: no launch held any more"]
        return []

    def next_deadlines(self, now: float) -> dict[str, float]:
        """Domain → the earliest time at which an iteration, given no new input, could do
        something other than nothing because one of this engine's own timers turns: the health
        clock (``_Health.deadline``), a stale snapshot or silent provisioner (``_pipeline``), the
        end of the active window, an unanswered terminate asked again
        (``_unfinished_terminates``), an offering's cooldown, the spot fallback. ``now``: the next
        iteration must run (also while the spend cap holds launches, or a policy whose decision
        moves with time has jobs waiting, ``DEMAND_SENSITIVE``); ``inf``: nothing pending. The thresholds of the stored data (an
        instance's stamps plus the policy's durations, re-sends, site backoff) are the store's
        to tell (the simulators' ``fastpath.next_wake``). A caller that skips iterations on this
        answer calls ``skip_iteration`` for each one it skips. Leases are not counted: one that
        lapses while no iteration runs is taken again by the next under the same holder, which
        is only the same outcome with a single engine (the simulators skip only then)."""
        gap, window = self.settings.pipeline_gap_seconds, self.settings.active_window_seconds
        again = 10 * self.settings.resend_seconds
        offering = min((u for u in self.cooldown.values() if u > now), default=math.inf)
        out: dict[str, float] = {}
        for d in self.domains:
            latest = self._latest.get(d)
            if latest is None or now - latest.received_at > window:
                out[d] = math.inf  # not iterated until a snapshot (an input) comes
                continue
            current = self.store.current_config(d)
            if d in self.budget_held or (
                    current is not None and current[1].policy in DEMAND_SENSITIVE and latest.digest.jobs):
                out[d] = now  # launches held by the spend cap are planned (ids drawn) each time
                continue
            spans = durations(self._policy_params(current[1].policy, current[1].params)) if current else []
            times = [offering, latest.received_at + gap, latest.received_at + window]
            h = self._health.get(d)
            if h is not None:
                times.append(h.deadline(now, spans))
            if d in self._reports:
                times.append(self._reports[d] + gap)
            first = self.store.first_unanswered(d)
            if first is not None:
                times.append(first + gap)
            times += [max(i.state_at, self._asked_again.get(i.instance_id, i.state_at)) + again
                      for i in self._terminating(d)]
            spot = self.spot_failures.get(d)
            if spot is not None:
                times.append(max(now, spot[1] + self.settings.spot_fallback_seconds))
            out[d] = min((t for t in times if t >= now), default=math.inf)
        return out

    def skip_iteration(self, now: float) -> None:
        """Stand for an iteration not run because ``next_deadlines`` said it would do nothing:
        the pipeline check still learns that the engine was iterating (a gap is a fault)."""
        for d in self.domains:
            h = self._health.get(d)
            if h is not None and self.is_active(d):
                h.last_iteration = now

    def breakers(self) -> dict[str, str]:
        """Domain → why its circuit breaker is open (for metrics and health)."""
        return {d: h.breaker for d, h in self._health.items() if h.breaker and not h.released}

    def decide(self, view: DomainView, cfg: Any) -> Decision:
        if cfg.paused:
            return Decision(notes=["domain paused by an operator"])
        if not view.available:
            return Decision(add_started(view), None, ["sensor unavailable: no policy run, no scale-down"])
        policy = get_policy(cfg.policy)
        return policy.decide(view, self._policy_params(cfg.policy, cfg.params), view.now)

    def _policy_params(self, name: str, params: dict[str, Any]) -> Params:
        """``validate_params(name, params)``, validated again only when the parameters differ
        from the last ones validated for ``name`` (a pydantic validation per iteration was ~1 %
        of the engine's work). Compared with their types too (``1 == 1.0 == True`` would not do:
        validation may tell them apart); the result is frozen, so it is shared safely."""
        hit = self._params.get(name)
        if hit is not None and _same_params(hit[1], params):
            return hit[2]
        out = validate_params(name, params)
        self._params[name] = (name, copy.deepcopy(params), out)
        return out

    def _publish_failed(self, domains: list[str]) -> None:
        for d in domains:
            h = self._health.get(d)
            if h is not None:
                h.publish_failed = True

    def _send(self, domain: str, out: Plan, now: float, iteration: int | None, notes: list[str],
              saw: ViewSummary | None = None, policy: str = "", version: int = 0,
              always: bool = False) -> DecisionRecord | None:
        sent = []
        try:
            if self.publish_many is not None and len(out.actions) > 1:
                self.publish_many([p.message for p in out.actions])
                sent = [p.action_id for p in out.actions]
            else:
                for p in out.actions:
                    self.publish(p.message)
                    sent.append(p.action_id)
        except Exception:
            self._publish_failed([domain])
            raise
        finally:
            self.store.mark_sent(sent, now)
        if not out.actions and not always:
            return None
        if iteration is None:
            iteration = self.store.memory(domain)[1]
        if not policy:
            current = self.store.current_config(domain)
            policy, version = (current[1].policy, current[0]) if current else ("", 0)
        record = DecisionRecord(
            domain=domain, iteration=iteration, policy=policy, policy_version=version,
            saw=saw if saw is not None else ViewSummary(),
            actions=[ActionRecord(kind=p.kind, target=p.instance_id, site=p.site, reason=p.reason,
                                  action_id=p.action_id, instance_type=p.instance_type, gang=p.gang)
                     for p in out.actions or out.shadow],
            at=now, notes=notes[:50], shadow=bool(out.shadow) and not out.actions)
        self.publish(record)
        return record

    def resend(self, domains: list[str], now: float) -> int:
        """Re-send every open action not sent yet or sent ``resend_seconds`` ago (same ids)."""
        if not domains:
            return 0
        msgs = self.store.unsent_or_due(domains, now, self.settings.resend_seconds)
        if self.publish_many is not None and len(msgs) > 1:
            self.publish_many(msgs)
        else:
            for m in msgs:
                self.publish(m)
        ids = [getattr(m, "launch_id", None) or getattr(m, "command_id", None) or m.request_id for m in msgs]
        self.store.mark_sent(ids, now)
        return len(msgs)


_STATE = operator.attrgetter("state")
_SITE = operator.attrgetter("site")
_TYPE = operator.attrgetter("instance_type")


def _same_jobs_question(before: SensorSnapshot, snap: SensorSnapshot) -> bool:
    """``breaker.jobs_verdict`` asks ``snap`` what it asked ``before``: a function of ``available``,
    ``running_jobs`` and the node list alone, and these are equal — the very node objects
    (frozen), as most snapshots of a quiet cluster repeat them (its pass over every job on every
    node was made again per snapshot)."""
    a, b = before.nodes, snap.nodes
    return (before.available == snap.available and before.running_jobs == snap.running_jobs
            and len(a) == len(b) and all(map(operator.is_, a, b)))


def _same_params(a: Any, b: Any) -> bool:
    """Equal and of the same types throughout (dicts, lists, tuples walked; other values by
    type and ``==``)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_params(v, b[k]) for k, v in a.items())
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(map(_same_params, a, b))
    return bool(a == b)


def summarize(view: DomainView, unsatisfiable: list[UnsatisfiableShape] | None = None) -> ViewSummary:
    """What the iteration saw, for its decision record (counted with ``map`` over attribute
    getters: in C, once per iteration that acts, over every node and instance)."""
    return ViewSummary(
        queued_jobs=view.demand.jobs, queued_cores=view.demand.cores,
        nodes_by_state=dict(Counter(map(_STATE, view.nodes.values()))),
        instances_by_state=dict(Counter(map(_STATE, view.instances))),
        instances_by_site=dict(Counter(map(_SITE, view.instances))),
        sensor_available=view.available,
        instances_by_type=dict(Counter(map(_TYPE, view.instances))) if view.catalogue is not None
        else {},
        unsatisfiable=list(unsatisfiable or []))


