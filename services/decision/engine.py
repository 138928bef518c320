"""The decision engine's imperative shell: feeds messages into the store, runs iterations.

Per domain and iteration: refresh the instance table from the latest snapshot, build the
view, call the domain's policy, plan (guard rails + placement), store the plan *then* send
it, publish a decision record. Everything that decides is in the pure modules
(``policies/``, ``planner``, ``placement``, ``view``, ``demand``); what is kept between messages
is in the modules whose data it is (``snapshots``, ``health``, ``catalogues``,
``instance_events``, ``census``, ``policy_params``), and messages other than snapshots are
handled there too (``instance_events``, ``node_results``, ``control``); this class only moves
data between them, the store and the broker.

Safety rules the shell keeps around the pure core (issue 11):

* our own outage is not a site's fault: each domain has a ``healthy_since`` (``health``) — reset
  whenever a snapshot is unavailable or late, a launch or terminate goes unanswered, a publish
  fails, or the engine itself was not iterating — and stall/loss clocks only run from it;
* launch failures reported by the provisioner are counted in the next iteration, at most one
  per site (with the stalls), and re-launching is the iteration's job: there is one launch
  path;
* the circuit breaker (``breaker.check``) is evaluated on every snapshot; while it is open
  nothing is taken out, and its opening and closing are published (a ``DecisionRecord`` with
  no action and the reason in its notes);
* a node counts as removed only when the sensor's ``remove`` succeeded (``node_results``).

Failover: snapshots reach only the active consumer of a domain's single-active-consumer
snapshot queue, and the engine acts on a domain only while it holds a snapshot younger than
``active_window_seconds`` *and* the domain's lease in the shared store (``lease``; every
committed plan re-checks it, so an engine that lost the lease cannot commit, hence cannot
send). When the active engine dies the broker hands the queue to the standby, whose first
snapshot activates it once the lease is free, and the shared store tells it every launch
already made — so no launch is repeated (re-sends keep their id).
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from epu.common.clock import Clock, RealClock
from epu.common.config import EpuConfig
from epu.common.config.catalogue import InstanceType
from epu.common.messages import (
    DecisionRecord,
    Envelope,
    InstanceEvent,
    InstanceReport,
    Message,
    NodeCommandResult,
    PolicyChange,
    PolicyOutcome,
    SensorSnapshot,
    SlurmPower,
    UnsatisfiableShape,
    ViewSummary,
)
from epu.services.decision import budget, node_results, slurm_native
from epu.services.decision.actions import Decision
from epu.services.decision.catalogues import Catalogues
from epu.services.decision.census import CensusKeeper
from epu.services.decision.control import PolicyChanges
from epu.services.decision.gate import Authority, Gate, give_back, release, shadow_plan, shadow_signature
from epu.services.decision.health import PipelineHealth
from epu.services.decision.instance_events import InstanceEvents
from epu.services.decision.lease import Fenced, StaleWrite
from epu.services.decision.lifecycle import add_started
from epu.services.decision.occupancy import JobSpans
from epu.services.decision.placement import SiteHealth, SiteInfo, record_success
from epu.services.decision.planner import Plan, placement_input, plan
from epu.services.decision.policies import (
    DEMAND_SENSITIVE,
    PolicyError,
    get_policy,
    validate_params,
)
from epu.services.decision.policy_params import PolicyParams
from epu.services.decision.ports import DecisionLeases, DecisionStore
from epu.services.decision.records import decision_record, summarize
from epu.services.decision.retries import CommandRetries
from epu.services.decision.shaped import Catalogue, uses_catalogue
from epu.services.decision.snaporder import ClockSkew, SnapshotOrder
from epu.services.decision.snapshots import Snapshots
from epu.services.decision.spend import SpendHolds
from epu.services.decision.store import PlanWrite
from epu.services.decision.view import DomainView, build_view

log = logging.getLogger("epu.decision")

#: How often a message's handler is run again when another engine's write made what it read
#: stale (``Engine._read_then_write``) before the error goes to the consumer.
_STALE_TRIES = 5

SiteContext = tuple[dict[str, SiteHealth], dict[str, int], dict[str, int]]
"""Site health and live and unproven instance counts per site, over all domains (``_site_context``)."""


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
    to_slurm: list[Message] = field(default_factory=list)
    """Native mode: nodes Slurm resumed that this iteration could not serve, handed back, and
    slots held since their removal whose instances have ended, released."""


class Engine:
    """The decision engine of one process, for every configured domain (see the module docstring)."""

    def __init__(self, config: EpuConfig, store: DecisionStore, publish: Callable[[Message], Any],
                 clock: Clock | None = None, publish_many: Callable[[list[Message]], Any] | None = None,
                 leases: DecisionLeases | None = None) -> None:
        self.config = config
        self.settings = config.decision
        self.store: DecisionStore = store
        self.gate = Gate(store, publish, publish_many)
        """The one door every command leaves by (``gate``); it holds the publish functions."""
        self.clock = clock or RealClock()
        self.domains = list(config.domains)
        self.site_infos = {n: SiteInfo(n, s.quota, s.price_per_hour or 0.0, s.cores) for n, s in config.sites.items()}
        self.site_caps = {n: s.budget_per_hour for n, s in config.sites.items() if s.budget_per_hour is not None}
        """Site → its spend cap ([sites.NAME] budget_per_hour), over every domain."""
        self.leases: DecisionLeases | None = leases
        """Fencing across engine processes (None: this engine is the only one, e.g. in-process tests)."""
        self.snapshots = Snapshots()
        self.spend = SpendHolds()
        self.health = PipelineHealth(self.settings, store)
        self.catalogues = Catalogues(config, self.site_infos)
        self._shadowed: dict[str, tuple[Any, ...]] = {}
        """Domain → what its last published shadow record would have done (``shadow_signature``)."""
        self.events = InstanceEvents(config, store, self.clock, self.gate, self.acting, self.catalogues, self.health)
        self.control = PolicyChanges(config, store, self.clock, publish, self.site_infos, self.health,
                                     types=lambda: self.catalogues.types)
        self.job_spans = JobSpans(store, gap=self.settings.active_window_seconds)
        """Which jobs ran on which instance, kept in the store for ``epu cost`` (``occupancy``)."""
        self.retries = CommandRetries()
        """Node commands answered with an error, waiting before they are planned again (``retries``)."""
        self.census = CensusKeeper()
        """Each domain's census (joined, idle, lost), taken again only when its inputs changed."""
        self.params = PolicyParams()
        self.native = slurm_native.Requests()
        """Slurm's power-saving calls per domain (native mode, ``slurm_native``)."""
        self._native_wanted: dict[str, list[slurm_native.Wanted]] = {}
        self._native_held: dict[str, list[tuple[str, str]]] = {}
        self._was_active: set[str] = set()
        self._launched: Counter[tuple[str, str]] = Counter()
        """(site, type) → launches planned in this iteration, not committed yet (``_live_per_type``)."""
        self.iterations = 0
        for name, cfg in config.domains.items():
            try:
                validate_params(cfg.policy, cfg.params)
            except PolicyError as exc:
                raise ValueError(f"domains.{name}: {exc}") from None
            store.seed_config(name, cfg, self.clock.now())

    @property
    def publish(self) -> Callable[[Message], Any]:
        """Publishes one message (the service's): records here, commands by the gate."""
        return self.gate.publish

    @publish.setter
    def publish(self, fn: Callable[[Message], Any]) -> None:
        self.gate.publish = fn

    @property
    def publish_many(self) -> Callable[[list[Message]], Any] | None:
        """Sends a burst of commands with one confirm wait (the service's); without it, one by one."""
        return self.gate.publish_many

    @publish_many.setter
    def publish_many(self, fn: Callable[[list[Message]], Any] | None) -> None:
        self.gate.publish_many = fn

    # what the modules keep, read by the service's metrics and status and by tests
    @property
    def types(self) -> dict[str, list[InstanceType]]:
        """Each site's instance-type catalogue (``Catalogues.types``)."""
        return self.catalogues.types

    @property
    def cooldown(self) -> dict[tuple[str, str], float]:
        """(site, type) offerings out until then after a capacity error (``Catalogues``)."""
        return self.catalogues.cooldown

    @property
    def spot_failures(self) -> dict[str, tuple[int, float]]:
        """Domain → (spot capacity errors in a row, when the last came) (``Catalogues``)."""
        return self.catalogues.spot_failures

    @property
    def unsatisfiable(self) -> dict[str, list[UnsatisfiableShape]]:
        """Domain → pending jobs no type of its catalogue can serve (``Catalogues``)."""
        return self.catalogues.unsatisfiable

    @property
    def budget_held(self) -> dict[str, str]:
        """Domain → why the spend cap held launches at its last iteration (``SpendHolds``)."""
        return self.spend.held

    @property
    def order(self) -> SnapshotOrder:
        """Which snapshot of a domain is newer (``Snapshots.order``)."""
        return self.snapshots.order

    @property
    def skew(self) -> ClockSkew:
        """How far each domain's sensor clock is off (``Snapshots.skew``)."""
        return self.snapshots.skew

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
        elif isinstance(msg, SlurmPower):
            self.on_slurm_power(msg)
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
        changed = self.snapshots.admit(snap, self.clock.now())
        if self.snapshots.snapshot(snap.domain) is snap:  # kept as the newest: whose jobs ran where (epu cost)
            self.job_spans.observe(snap.domain, snap, self.snapshots.taken(snap.domain) or self.clock.now())
        return changed

    def is_active(self, domain: str) -> bool:
        return self.snapshots.fresh(domain, self.clock.now(), self.settings.active_window_seconds)

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
        return self.snapshots.snapshot(domain)

    def snapshot_taken(self, domain: str) -> float | None:
        """When the newest snapshot of ``domain`` was taken, in this engine's clock (None: none)."""
        return self.snapshots.taken(domain)

    def forget_snapshots(self) -> None:
        """The runtime lost its broker connection: whatever this engine knew may be another
        engine's to act on now (the broker may hand the snapshot queue to a standby). Forget the
        snapshots — the engine acts again only on a snapshot received after reconnecting —, the
        pipeline-health clocks, and the store's cached working set (re-read from the shared store
        then); give the leases up."""
        self.snapshots.forget()
        self.health.forget()
        self.census.forget()
        self.events.forget()
        self.job_spans.forget()
        self.store.invalidate()
        if self.leases is not None:
            self.leases.release()

    def _fence(self, domain: str, now: float) -> Any:
        return self.leases.fence(domain, now) if self.leases is not None else None

    def on_instance_report(self, report: InstanceReport) -> int:
        """Anti-entropy: the provisioner's full state of a domain (``InstanceEvents``); returns
        how many entries were news."""
        return self.events.on_instance_report(report)

    def apply_offered(self, offered: dict[str, list[Any]]) -> list[str]:
        """A provisioner's discovered catalogues (``Catalogues.apply_offered``); returns the sites
        whose catalogue changed."""
        return self.catalogues.apply_offered(offered)

    def on_instance_event(self, evt: InstanceEvent, repair: bool = False) -> None:
        self.events.on_instance_event(evt, repair)

    def on_slurm_power(self, msg: SlurmPower) -> bool:
        """One call of Slurm's power saving (``slurm_native``): remembered for the domain's next
        iteration (the service wakes it at once). A domain not in native mode ignores it (logged):
        its slots are EPU's to fill."""
        current = self.store.current_config(msg.domain) if msg.domain in self.domains else None
        if current is None or not getattr(current[1], "native", ""):
            log.warning("slurm.power for a domain not in native mode: ignored", extra={
                "domain": msg.domain, "action": msg.action, "nodes": len(msg.nodes)})
            return False
        return self.native.on_power(msg, self.clock.now())

    def on_node_result(self, res: NodeCommandResult) -> None:
        """A command's answer (``node_results``)."""
        row = self.store.action(res.command_id)
        node_results.on_node_result(self.store, self.clock, res)
        if row is not None and not row["done"] and row["domain"] == res.domain and row["kind"] == res.action:
            self.retries.answered(row["target"], res.action, res.command_id, res.ok, self.clock.now())

    # ------------------------------------------------------------------ control
    def handle_control(self, msg: Message, _envelope: Envelope | None = None) -> None:
        if isinstance(msg, PolicyChange):
            self._read_then_write(self.on_policy_change, msg)
        else:
            self._sync()

    def on_policy_change(self, change: PolicyChange) -> PolicyOutcome:
        """An operator's change, applied once and answered (``control``)."""
        return self.control.on_policy_change(change)

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
                record = self._send(p)
            except Exception:
                log.exception("iteration failed", extra={"domain": p.domain})
                continue
            if record is not None:
                records.append(record)
        if len(self.retries) > 1000:  # forget the backoffs of instances that ended
            live = {i.instance_id for i in self.store.instances()}
            self.retries.forget({k for k, _ in self.retries.waiting(-math.inf)} - live)
        try:
            self.resend(active, now)
            self.events.unfinished_terminates(active, now)
        except Exception:
            log.exception("re-send failed")
            self.health.publish_failed(active)
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

    def _site_context(self) -> SiteContext:
        """Site health and live/unproven counts over all domains (quota is per site)."""
        live, unproven = self.store.live_per_site()
        return self.store.site_health(), live, unproven

    def iterate_domain(self, domain: str, now: float, sites: SiteContext | None = None) -> DecisionRecord | None:
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
        return self._send(p)

    def _stored(self, w: PlanWrite) -> None:
        """A domain's plan was committed: if it wrote only the census's changed instances, the
        store holds exactly the census's objects now (``CensusKeeper.stored``)."""
        if not w.plan.instances:
            self.census.stored(w.domain, self.store.domain_stamp(w.domain))

    def _prepare(self, domain: str, now: float, sites: SiteContext | None = None) -> _Prepared:
        """Everything of a domain's iteration up to its commit: refresh, view, policy, plan; the
        iteration's site context (``sites``) counts its launches at once, so the next domain's
        placement sees them (a plan that then fails to commit only made the others more careful)."""
        latest = self.snapshots.latest[domain]
        current = self.store.current_config(domain)
        assert current is not None
        version, cfg = current
        memory, iteration = self.store.memory(domain)
        snap = latest.snapshot
        r = self.census.for_iteration(domain, self.store.domain_stamp(domain), latest.nodes, snap.available, now,
                                      lambda: self.store.instances(domain))  # the census
        why = self.health.breaker_check(r.census, latest)
        health_ = self.health.update(domain, latest, now, r.before)
        notes_extra = self.health.breaker(domain, health_, why, now)
        view = build_view(domain, snap, latest.digest, r.instances, now, min_nodes=cfg.min_nodes,
                          max_nodes=cfg.max_nodes, cores_per_node=cfg.cores_per_node, memory=memory,
                          nodes=latest.nodes, all_live=True, parts=r.parts, healthy_since=health_.healthy_since,
                          breaker="" if health_.released else health_.breaker,
                          cleanup=self.store.cleanup(domain) if snap.available else [], free=latest.free_workers(),
                          gangs=r.census.gangs)
        view.snapshot_at = self.snapshots.skew.engine_time(domain, snap.taken_at, latest.received_at)  # vs. drain_at
        health, live, unproven = sites if sites is not None else self._site_context()
        if uses_catalogue(cfg, self.config.sites):
            view.catalogue = self.catalogue(domain, cfg, live, now)
            if snap.available:
                notes_extra += self.catalogues.report_unsatisfiable(domain, view.demand.detail, view.catalogue)
        decision = self.decide(view, cfg)
        successes = {i.site: record_success(health[i.site]) for i in r.joined
                     if i.site in health and health[i.site].failures}
        health.update(successes)
        for i in r.joined:
            unproven[i.site] = max(0, unproven.get(i.site, 0) - 1)
        for site, why_ in self.events.take_failures(set(cfg.sites or self.site_infos)).items():
            decision.failed_sites.setdefault(site, why_)
        caps = None  # the spend caps (budget_per_hour of the domain and of sites)
        if cfg.budget_per_hour or self.site_caps:
            caps = budget.budget_for(cfg.budget_per_hour, self.site_caps, view.instances, self._live_per_type(),
                                     budget.price_table(budget.site_prices(self.config.sites), self.types))
        placement = placement_input(cfg, self.site_infos, health, live, unproven, budget=caps,
                                    backoff_initial=self.settings.backoff_initial_seconds,
                                    backoff_max=self.settings.backoff_max_seconds)
        out = plan(view, decision, placement, self.store.in_flight(domain), backing_off=self.retries.waiting(now))
        returned = self._to_slurm(domain, out, now) if getattr(cfg, "native", "") and snap.available else []
        notes_extra += self.spend.note(domain, out.budget)
        shadow_changed = False
        if cfg.mode == "observe":
            out = shadow_plan(out)
            signature = shadow_signature(out.shadow)
            shadow_changed = bool(out.shadow) and self._shadowed.get(domain) != signature
            self._shadowed[domain] = signature
        else:
            self._shadowed.pop(domain, None)
        out.sites = {**successes, **out.sites}
        write = None
        if out.actions or r.changed or out.sites or (decision.memory is not None and decision.memory != memory):
            iteration += 1
            write = PlanWrite(domain, out, now, decision.memory, iteration, r.changed, self._fence(domain, now))
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
        saw = summarize(view, self.catalogues.unsatisfiable.get(domain, [])) \
            if out.actions or shadow_changed or notes_extra else None
        return _Prepared(domain, out, now, iteration, saw, cfg.policy, version, bool(notes_extra or shadow_changed),
                         write, returned)

    def _to_slurm(self, domain: str, out: Plan, now: float) -> list[Message]:
        """Native mode: the nodes Slurm wants that this plan does not launch go back to Slurm now,
        and the slots held since their removal whose instances have ended are released."""
        msgs: list[Message] = []
        for node, iid in self._native_held.pop(domain, []):
            msgs.append(release(domain, node, iid))
            out.notes.append(f"released {node} to Slurm's power saving: instance {iid} has ended")
        want = self._native_wanted.pop(domain, [])
        if not want:
            return msgs
        launched = {p.message.node_name for p in out.actions if p.kind == "launch"}  # type: ignore[attr-defined]
        req = self.native.of(domain)
        back = slurm_native.give_backs(want, launched, out.notes)
        whole = slurm_native.all_or_nothing(back, launched, req)
        if whole:  # a job given back in part is given back whole: its other launches are dropped unsent
            dropped = [p for p in out.actions if p.kind == "launch" and p.message.node_name in whole]  # type: ignore[attr-defined]
            out.actions = [p for p in out.actions if p not in dropped]
            for p in dropped:
                out.instances.pop(p.instance_id, None)
            back += [(n, "epu: cannot serve: another node of the same job cannot be served (all or nothing)")
                     for n in sorted(whole)]
        for node, reason in back:
            req.resumes.pop(node, None)
            req.given_back[node] = now
            msgs.append(give_back(domain, node, reason))
            out.notes.append(f"gave {node} back to Slurm: {reason}")
        return msgs

    def catalogue(self, domain: str, cfg: Any, live: dict[str, int], now: float) -> Catalogue:
        """The domain's offers now (``Catalogues.catalogue``), counting this iteration's launches."""
        return self.catalogues.catalogue(domain, cfg, live, now, self._live_per_type())

    def _live_per_type(self) -> dict[tuple[str, str], int]:
        """The store's live instances per (site, type), plus this iteration's launches not
        committed yet (``iterate`` commits every domain's plan after all are prepared)."""
        counts = self.store.live_per_type()
        for key, n in self._launched.items():
            counts[key] = counts.get(key, 0) + n
        return counts

    def next_deadlines(self, now: float) -> dict[str, float]:
        """Domain → the earliest time at which an iteration, given no new input, could do
        something other than nothing because one of this engine's own timers turns: the health
        clock and a silent provisioner (``PipelineHealth.deadlines``), a stale snapshot, the end
        of the active window, an unanswered launch or terminate turning overdue, a terminate asked
        again (``InstanceEvents.deadlines``), an offering's cooldown, the spot fallback
        (``Catalogues``). ``now``: the next iteration must run (also while the spend cap holds
        launches, or a policy whose decision moves with time has jobs waiting,
        ``DEMAND_SENSITIVE``); ``inf``: nothing pending. The thresholds of the stored data (an
        instance's stamps plus the policy's durations, re-sends, site backoff) are the store's
        to tell (the simulators' ``fastpath.next_wake``). A caller that skips iterations on this
        answer calls ``skip_iteration`` for each one it skips. Leases are not counted: one that
        lapses while no iteration runs is taken again by the next under the same holder, which
        is only the same outcome with a single engine (the simulators skip only then)."""
        gap, window = self.settings.pipeline_gap_seconds, self.settings.active_window_seconds
        offering = self.catalogues.next_cooldown_end(now)
        out: dict[str, float] = {}
        for d in self.domains:
            latest = self.snapshots.get(d)
            if latest is None or now - latest.received_at > window:
                out[d] = math.inf  # not iterated until a snapshot (an input) comes
                continue
            current = self.store.current_config(d)
            if d in self.spend.held or (current is not None and current[1].mode == "observe") or (
                    current is not None and current[1].policy in DEMAND_SENSITIVE and latest.digest.jobs):
                # launches held by the spend cap, and an observe mode's shadow plan, are planned
                # (ids drawn) each time
                out[d] = now
                continue
            spans = self.params.durations(current[1].policy, current[1].params) if current else []
            times = [offering, latest.received_at + gap, latest.received_at + window]
            times += self.health.deadlines(d, now, spans)
            first = self.store.first_unanswered(d)
            if first is not None:
                times.append(first + gap)
            times += self.events.deadlines(d)
            spot = self.catalogues.spot_retry(d, now)
            if spot is not None:
                times.append(spot)
            retry = self.retries.next_end(now)
            if retry is not None:
                times.append(retry)
            out[d] = min((t for t in times if t >= now), default=math.inf)
        return out

    def skip_iteration(self, now: float) -> None:
        """Stand for an iteration not run because ``next_deadlines`` said it would do nothing:
        the pipeline check still learns that the engine was iterating (a gap is a fault)."""
        for d in self.domains:
            if self.is_active(d):
                self.health.iterated(d, now)

    def breakers(self) -> dict[str, str]:
        """Domain → why its circuit breaker is open (for metrics and health)."""
        return self.health.breakers()

    def decide(self, view: DomainView, cfg: Any) -> Decision:
        if cfg.paused:
            return Decision(notes=["domain paused by an operator"])
        if not view.available:
            return Decision(add_started(view), None, ["sensor unavailable: no policy run, no scale-down"])
        params = self.params.get(cfg.policy, cfg.params)
        if getattr(cfg, "native", ""):
            nd = slurm_native.decide(view, cfg, self.native.of(view.domain), getattr(params, "stall_seconds", 600.0),
                                     getattr(params, "gang_deadline", None))
            self._native_wanted[view.domain] = nd.wanted
            self._native_held[view.domain] = nd.releases
            return nd.decision
        policy = get_policy(cfg.policy)
        return policy.decide(view, params, view.now)

    def _send(self, p: _Prepared) -> DecisionRecord | None:
        """Send a stored plan's actions (one confirmed batch when the service can), then publish
        its decision record if it sent anything or its notes are an event (``always``)."""
        out, sent = p.plan, []
        if p.to_slurm:  # not intents: a lost one is found again in the next snapshot (still powering
            # up, still held)
            self.gate.send(p.domain, p.to_slurm, Authority.POLICY)
        try:
            sent = self.gate.send(p.domain, [a.message for a in out.actions], instances=out.instances).ids
        except Exception as exc:
            sent = getattr(exc, "sent", [])
            self.health.publish_failed([p.domain])
            raise
        finally:
            self.store.mark_sent(sent, p.now)
        if not out.actions and not p.always and not p.to_slurm:
            return None
        record = decision_record(p.domain, out, p.now, p.iteration, out.notes, p.saw, p.policy, p.version)
        self.publish(record)
        return record

    def resend(self, domains: list[str], now: float) -> int:
        """Re-send every open action not sent yet or sent ``resend_seconds`` ago (same ids)."""
        if not domains:
            return 0
        by_domain: dict[str, list[Message]] = {}
        for m in self.store.unsent_or_due(domains, now, self.settings.resend_seconds):
            by_domain.setdefault(m.domain, []).append(m)  # type: ignore[attr-defined]
        n = 0
        for domain, msgs in by_domain.items():
            ids: list[str] = []
            try:
                ids = self.gate.send(domain, msgs, Authority.SAFETY_NET).ids
            except Exception as exc:
                ids = getattr(exc, "sent", [])
                raise
            finally:
                self.store.mark_sent(ids, now)
                n += len(ids)
        return n

