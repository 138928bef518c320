"""The provisioner proper: requests in, cloud calls out, every transition stored then told.

This is the imperative shell around ``states`` (the rules) and ``store`` (the memory). Its
contract with the message loop: ``handle_launch``/``handle_terminate`` return once the
intent is stored — the caller acks then — and the cloud work runs on the site's threads.

Crash safety, step by step for a launch:

1. ``record_launch`` stores launch + instance (``requested``) — before any cloud call.
2. ``note_cloud_attempt`` counts the call before making it.
3. ``create_node`` with the launch id as client token (where supported) and as tags.
4. ``advance`` to ``pending``/``started`` with the cloud id.

Killed between 3 and 4, the restarted provisioner's reconciliation finds the node by its
launch-id tag and adopts it; a launch that never reached the cloud is sent again; and a
second create for the same launch id is answered with the same node by the client token
(or avoided by looking the tag up first where a provider has no token).

What the poll loop and reconciliation conclude from a listing — follow, presume gone,
re-adopt, adopt, sweep (capped), re-drive — is decided by the pure functions of
``reconcile``; this shell lists, reads the store, and carries their plan out.

The terminate path and every destroy live in ``terminations`` (the one door to a site's
destroy, each call under a proof and recorded): ``handle_terminate`` delegates there, and the
destroys this shell's own rules decide (a failed launch's node, a closed record's, a duplicate,
an orphan) go through the same door.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from epu.common.clock import Clock, RealClock
from epu.common.config.catalogue import launch_type
from epu.common.messages import (
    INTERRUPTION_REASON,
    InstanceEvent,
    LaunchRequest,
    ProvisionerAlert,
    TerminateRequest,
)
from epu.common.retire import Proof
from epu.common.senders import SenderPolicy
from epu.services.provisioner import reconcile as core
from epu.services.provisioner.cloud import CloudNode, LaunchSpec, Site, launch_node
from epu.services.provisioner.discovery import Catalogues
from epu.services.provisioner.errors import (
    CloudError,
    classify,
    describe,
    is_throttled,
    may_have_taken_effect,
)
from epu.services.provisioner.inflight import InFlight
from epu.services.provisioner.ports import ProvisionerStore
from epu.services.provisioner.records import (
    InstanceRecord,
    Miss,
    Sighting,
    Transition,
    new_identity_value,
)
from epu.services.provisioner.runner import CallObserver, RetryPolicy, SiteRunner
from epu.services.provisioner.terminations import DestroyObserver, Terminations
from epu.services.provisioner.userdata import UserdataError, UserdataRenderer

log = logging.getLogger("epu.provisioner")


#: Test hook: ``EPU_PROVISIONER_CRASH_AT=after_cloud_call`` SIGKILLs this process right after
#: a create call returned and before the store knows (the window the design worries about).
CRASH_ENV = "EPU_PROVISIONER_CRASH_AT"


class _OutcomeUnknown(CloudError):
    """A create on a site without client tokens failed in a way that may have made the node
    (a timeout, a 5xx): never retried blindly (``_do_launch``)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "permanent")


@dataclass
class ProvisionerSettings:
    deployment: str | None = None
    """This deployment's identity, named explicitly (``provisioner.deployment``). ``None``: the
    store's own, made at its first start — provisioners sharing a store share it."""
    orphan_grace_seconds: float = 600.0
    """An orphan is destroyed this long after this store first saw it."""
    vanish_misses: int = 3
    """Consecutive listings without a record's node before it is presumed gone."""
    vanish_min_seconds: float = 60.0
    """... spanning at least this long."""
    max_destroys_per_reconcile: int = 5
    """Most nodes one reconciliation destroys; more orphans than this are refused (an alert)."""
    resume_after_seconds: float = 30.0
    """A ``requested`` record with no launch in flight here is re-driven after this long."""
    outbox_delay_seconds: float = 10.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    new_id: Callable[[], str] = new_identity_value
    """Makes the store id and a generated deployment identity (a simulator passes a seeded one)."""


@dataclass
class ReconcileReport:
    site: str
    adopted: list[str] = field(default_factory=list)
    swept: list[str] = field(default_factory=list)
    waiting_orphans: list[str] = field(default_factory=list)
    vanished: list[str] = field(default_factory=list)
    """Records closed because the node of a terminate we asked for is no longer listed."""
    resumed: list[str] = field(default_factory=list)
    presumed_gone: list[str] = field(default_factory=list)
    readopted: list[str] = field(default_factory=list)
    withheld: list[str] = field(default_factory=list)
    """Cloud ids whose destruction the cap refused or deferred."""
    alerts: list[str] = field(default_factory=list)
    """Kinds of the alerts raised."""
    transitions: int = 0


@dataclass(frozen=True)
class PollResult:
    """What ``Provisioner.poll`` did."""

    transitions: int
    """Records moved (each published once)."""
    steady: bool
    """The plan was ``reconcile.Plan.steady``: every watched record's node listed, nothing to do."""


class Provisioner:
    def __init__(self, store: ProvisionerStore, sites: dict[str, Site], publish: Callable[[InstanceEvent], Any], *,
                 clock: Clock | None = None, settings: ProvisionerSettings | None = None,
                 renderers: dict[str, UserdataRenderer] | None = None,
                 sleep: Callable[[float], None] | None = None, on_cloud_call: CallObserver | None = None,
                 alert: Callable[[ProvisionerAlert], Any] | None = None, senders: SenderPolicy | None = None,
                 on_destroy: DestroyObserver | None = None) -> None:
        self.store: ProvisionerStore = store
        self.sites = sites
        self._publish = publish
        self._alert = alert
        self.clock = clock or RealClock()
        self.settings = settings or ProvisionerSettings()
        self.identity = store.claim_identity(self.settings.deployment or _named_deployment(sites),
                                             self.settings.new_id)
        for site in sites.values():
            site.bind(self.identity.deployment, self.identity.store_id)
        self.alerts: deque[ProvisionerAlert] = deque(maxlen=200)
        """The latest alerts raised (also published through ``alert`` and logged)."""
        self.renderers = renderers or {}
        self.inflight = InFlight()
        """Launch and terminate tasks queued or running here (shared with ``terminations``)."""
        runners = {
            name: SiteRunner(name, site.config.rate_limit_per_second, site.config.max_in_flight,
                             self.settings.retry, sleep=sleep, on_call=on_cloud_call)
            for name, site in sites.items()
        }
        self.terminations = Terminations(store, sites, runners, self.clock, self.emit, publish, self.inflight,
                                         senders=senders, on_destroy=on_destroy)
        """The terminate path and the one door to destroy."""
        self._runners = runners
        self._noticed: set[str] = set()
        """Instances whose interruption notice was published (``_notice``)."""
        self.catalogues = Catalogues()
        """Instance types of the sites that ``discover`` sizes (``discover_all``)."""
        self._publish_lock = threading.Lock()
        self._crash_at = os.environ.get(CRASH_ENV, "")

    @property
    def runners(self) -> dict[str, SiteRunner]:
        """The sites' runners, by site name (the simulator replaces them with inline ones)."""
        return self._runners

    @runners.setter
    def runners(self, runners: dict[str, SiteRunner]) -> None:
        self._runners = runners
        self.terminations.runners = runners

    # ------------------------------------------------------------------ events
    def emit(self, transition: Transition | None) -> None:
        """Publish a stored transition and mark it published. A failed publish leaves it to
        the outbox sweep; consumers drop repeats by ``seq``."""
        if transition is None:
            return
        try:
            self._publish(transition.event())
        except Exception as exc:
            log.warning("publish failed; the outbox will retry", extra={"instance": transition.record.instance_id,
                                                                        "error": describe(exc)})
            return
        self.store.mark_published([transition.id])

    def flush_outbox(self) -> int:
        """Publish transitions whose publisher died (stored but never announced)."""
        pending = self.store.unpublished(self.clock.now() - self.settings.outbox_delay_seconds)
        done = []
        for t in pending:
            try:
                self._publish(t.event())
            except Exception as exc:
                log.warning("outbox publish failed", extra={"error": describe(exc)})
                break
            done.append(t.id)
        self.store.mark_published(done)
        return len(done)

    def _advance(self, rec_id: str, state: str, **kw: Any) -> Transition | None:
        t = self.store.advance(rec_id, state, self.clock.now(), **kw)
        self.emit(t)
        return t

    # ------------------------------------------------------------------ commands
    def handle_launch(self, req: LaunchRequest) -> InstanceRecord:
        """Store the intent (idempotently) and schedule the cloud call. Returns when stored."""
        site = self.sites.get(req.site)  # the price at launch stays with the record (epu cost)
        price = self.catalogues.price_at_launch(req.site, site.config, req.instance_type) if site else None
        rec, first = self.store.record_launch(req, self.clock.now(), price)
        if first is not None:
            self.emit(first)
            if req.site not in self.sites:
                self._advance(rec.instance_id, "failed", reason=f"unknown site {req.site!r}",
                              error_kind="permanent")
                return rec
            config = self.sites[req.site].config
            try:
                kind = launch_type(req.site, config, req.instance_type)
            except ValueError as exc:
                self._advance(rec.instance_id, "failed", reason=str(exc), error_kind="permanent")
                return rec
            quota = config.quota
            if self.store.active_count(req.site) > quota:  # this launch is already counted
                self._advance(rec.instance_id, "failed", error_kind="capacity",
                              reason=f"site quota reached: {req.site} allows {quota} instances")
                return rec
            if kind.quota is not None and self.store.active_count(req.site, kind.name) > kind.quota:
                self._advance(rec.instance_id, "failed", error_kind="capacity",
                              reason=f"type quota reached: {req.site} allows {kind.quota} {kind.name} instances")
                return rec
            self._schedule_launch(rec.instance_id, req.site)
            return rec
        log.info("duplicate launch request", extra={"launch_id": req.launch_id, "state": rec.state})
        if rec.state == "requested" and rec.site in self.sites:
            self._schedule_launch(rec.instance_id, rec.site)  # a redelivery after a crash: re-drive it
        return rec

    def handle_terminate(self, req: TerminateRequest, sender: str | None = None) -> InstanceRecord | None:
        """A terminate, by its proof: ``terminations.Terminations.handle`` (the one door to
        destroy). Returns once what it decided is stored. ``sender``: the message's validated
        broker user, ``None`` when there is none (the in-memory transport)."""
        return self.terminations.handle(req, sender)

    # ------------------------------------------------------------------ scheduling
    def _schedule_launch(self, instance_id: str, site: str) -> None:
        self.inflight.run(f"launch:{instance_id}", self.runners[site], lambda: self._do_launch(instance_id, site))

    def redrive_unplaced(self) -> int:
        """Terminates of instances unknown here whose node was never looked for: look again."""
        return self.terminations.redrive_unplaced()

    def busy(self) -> bool:
        return self.inflight.busy()

    # ------------------------------------------------------------------ cloud work
    def _find_by_launch_id(self, site: str, launch_id: str) -> CloudNode | None:
        return launch_node(self.runners[site].call(self.sites[site].nodes, "list"), launch_id)

    def _userdata(self, rec: InstanceRecord, attributes: dict[str, str]) -> str:
        renderer = self.renderers.get(rec.site)
        if renderer is None:
            return ""
        values: dict[str, object] = dict(attributes)
        values.update(instance_id=rec.instance_id, launch_id=rec.instance_id, node_name=rec.node_name,
                      domain=rec.domain, site=rec.site, deployment=self.identity.deployment, cores=rec.cores,
                      instance_type=rec.instance_type)
        return renderer.render(values)

    def _do_launch(self, instance_id: str, site_name: str) -> None:
        rec, launch = self.store.begin_attempt(instance_id, self.clock.now())
        if rec is None or launch is None:
            return
        if rec.state != "requested":
            if rec.state == "terminating" and rec.cloud_id is None:
                self._advance(instance_id, "terminated", reason="terminated before it was launched")
            return
        site, runner = self.sites[site_name], self.runners[site_name]
        try:
            if launch.cloud_attempts > 0:
                # an earlier attempt may have reached the cloud: look before creating again
                found = self._find_by_launch_id(site_name, instance_id)
                if found is not None:
                    self._land(instance_id, site_name, found, "adopted after an interrupted launch")
                    return
            userdata = self._userdata(rec, launch.attributes)
            kind = launch_type(site_name, site.config, rec.instance_type)
            spec = LaunchSpec(launch_id=instance_id, node_name=rec.node_name, domain=rec.domain,
                              userdata=userdata, size=kind.size, image=kind.image)
            idempotent = site.idempotent_create
            # attempts that may have made the node (their errors); an earlier attempt of this
            # launch always may have (it is re-driven only when its outcome was unknown)
            ambiguous: list[str] = ["an earlier attempt"] if launch.cloud_attempts > 0 else []

            def create() -> CloudNode:
                try:
                    return site.launch(spec)
                except Exception as exc:
                    if not idempotent and classify(exc) == "transient" and not is_throttled(exc):
                        raise _OutcomeUnknown(describe(exc)) from exc
                    if may_have_taken_effect(exc):
                        ambiguous.append(describe(exc))
                    raise

            node = runner.call(create, "create")
        except UserdataError as exc:
            self._advance(instance_id, "failed", reason=str(exc), error_kind="permanent")
            return
        except _OutcomeUnknown as exc:
            # Without client tokens a second create after a timeout or a 5xx may make a second
            # node, and a lookup by tag right away may miss the first (listings lag creates).
            # The launch stays ``requested``: reconciliation adopts its node by the launch-id tag
            # once listed, or — nothing listed ``resume_after_seconds`` later — looks again and
            # creates it then.
            log.warning("create outcome unknown: left to reconciliation",
                        extra={"site": site_name, "launch_id": instance_id, "error": str(exc)})
            self.store.touch(instance_id, self.clock.now(), f"create outcome unknown ({exc}): waiting for a listing")
            return
        except Exception as exc:
            kind = classify(exc)
            if kind == "transient" and ambiguous:
                # The retries ran out, but an attempt may have made the node (its answer lost).
                # Closing the launch ``failed`` would have the engine replace it while the node
                # boots (on HTCondor it joins by itself): more nodes than max_nodes allows. Look
                # once; not listed (listings lag creates): the outcome is unknown, and the launch
                # stays ``requested`` — reconciliation adopts its node by the launch-id tag, or
                # re-drives it (the client token makes a second create return the same node).
                if not self._landed_after_all(instance_id, site_name):
                    log.warning("create outcome unknown after its retries: left to reconciliation",
                                extra={"site": site_name, "launch_id": instance_id, "error": ambiguous[-1]})
                    self.store.touch(instance_id, self.clock.now(),
                                     f"create outcome unknown ({ambiguous[-1]}, then {describe(exc)}): "
                                     "waiting for a listing")
                return
            log.warning("launch failed", extra={"site": site_name, "launch_id": instance_id, "kind": kind,
                                                "error": describe(exc)})
            self._advance(instance_id, "failed", reason=f"{kind}: {describe(exc)}", error_kind=kind)
            return
        if self._crash_at == "after_cloud_call":
            os.kill(os.getpid(), signal.SIGKILL)
        self._land(instance_id, site_name, node, "launched", expect=rec)

    def _landed_after_all(self, instance_id: str, site_name: str) -> bool:
        """The retries of a create ran out after an attempt that may have made the node (a lost
        answer): look for it by its launch-id tag once, and record it if found."""
        try:
            found = self._find_by_launch_id(site_name, instance_id)
        except Exception as exc:  # the API is still failing: reconciliation looks later
            log.info("no lookup after a failed create", extra={"launch_id": instance_id, "error": describe(exc)})
            return False
        if found is None:
            return False
        self._land(instance_id, site_name, found, "found after its create's retries ran out")
        return True

    def _land(self, instance_id: str, site_name: str, node: CloudNode, why: str,
              expect: InstanceRecord | None = None) -> None:
        """Record the cloud node of a launch (``requested`` → ``pending``/``started``). A node the
        create's own answer (``expect``) shows failed is closed and destroyed at once; one a listing
        shows so is recorded ``pending``, and the next listings judge it (``reconcile._absent``)."""
        state = node.state if node.state in ("pending", "started", "failed") else "pending"
        if state == "failed" and expect is None:
            state = "pending"
        reason = f"{why} as {node.cloud_id}" if state != "failed" else f"boot failed: node {node.native_state}"
        t = self._advance(instance_id, state, cloud_id=node.cloud_id, ip=node.ip, reason=reason,
                          error_kind=None, expect=expect)
        if t is not None:
            if state == "failed":  # it holds a quota slot (and is billed) until destroyed
                self.terminations.destroy(site_name, node.cloud_id, Proof.FAILED_LAUNCH,
                                          f"record {instance_id} failed: {reason}", instance_id=instance_id)
            return
        rec = self.store.get(instance_id)
        if rec is None:
            return
        if rec.cloud_id is None:
            self.store.set_cloud_fields(instance_id, cloud_id=node.cloud_id, ip=node.ip)
        # told to terminate (or given up) while the create was in flight: don't leave it running
        if rec.state == "terminating":
            self.terminations.schedule(instance_id, site_name)
        elif rec.state == "failed" and rec.cloud_id in (None, node.cloud_id) and node.live:
            self._reopen(instance_id, node, "started" if node.state == "started" else "pending")
        elif rec.terminal and rec.cloud_id in (None, node.cloud_id):
            self.terminations.destroy(site_name, node.cloud_id, Proof.CLOSED_RECORD,
                                      f"record {instance_id} is {rec.state}", instance_id=instance_id)

    def _reopen(self, instance_id: str, node: CloudNode, state: str) -> bool:
        """Reopen a ``failed`` record whose node is alive (``reconcile.Reopen``) and announce it."""
        t = self.store.reopen(instance_id, state, self.clock.now(),
                              f"reopened: node {node.cloud_id} of this failed launch is listed {node.native_state}; "
                              "handed to the engine", cloud_id=node.cloud_id, ip=node.ip)
        if t is None:
            return False
        self.emit(t)
        log.warning("failed launch found alive: reopened", extra={"instance": instance_id, "cloud_id": node.cloud_id,
                                                                  "state": state})
        return True

    # ------------------------------------------------------------------ observation
    def rules(self, resume_after: float | None = None) -> core.Rules:
        """The rules of ``reconcile`` from the identity and the settings now (which a caller may
        change between polls); ``resume_after`` overrides the settings' resume delay."""
        st = self.settings
        return core.Rules(
            deployment=self.identity.deployment, store_id=self.identity.store_id,
            vanish_misses=st.vanish_misses, vanish_min_seconds=st.vanish_min_seconds,
            orphan_grace_seconds=st.orphan_grace_seconds, max_destroys=st.max_destroys_per_reconcile,
            resume_after_seconds=st.resume_after_seconds if resume_after is None else resume_after)

    def _list(self, site_name: str, what: str) -> tuple[list[CloudNode], float] | None:
        listed_at = self.clock.now()
        try:
            return self.runners[site_name].call(self.sites[site_name].nodes, "list"), listed_at
        except Exception as exc:
            log.warning(f"{what} failed: cannot list the site", extra={"site": site_name, "error": describe(exc)})
            return None

    def _world(self, site_name: str, nodes: list[CloudNode], listed_at: float, *,
               sightings: bool) -> core.World:
        """The store's side, read after the listing (so a record that changed since is seen as such)."""
        busy = self.inflight.snapshot()
        launch_ids = [n.launch_id for n in nodes if n.launch_id] if sightings else []
        return core.World(
            site=site_name, nodes=tuple(nodes), listed_at=listed_at, now=self.clock.now(),
            records=self.store.records_for(site_name, launch_ids), misses=self.store.misses(site_name),
            sightings=self.store.sightings(site_name) if sightings else {}, busy=busy)

    def poll(self, site_name: str) -> PollResult:
        """List the site's nodes once and move records to what the cloud says. Returns the
        number of transitions and whether the plan was steady (every node listed, nothing to
        do: a caller that knows its inputs did not change may take that as the next poll's
        answer too; the simulator does, see ``epu.sim.processes.ProvisionerProc``)."""
        listing = self._list(site_name, "poll")
        if listing is None:
            return PollResult(0, False)
        world = self._world(site_name, *listing, sightings=False)
        plan = core.observe(world, self.rules())
        report = ReconcileReport(site_name)
        self._carry_out(site_name, plan, report)
        return PollResult(report.transitions, plan.steady)

    def reconcile(self, site_name: str, resume_after: float | None = None) -> ReconcileReport:
        """Make the store and the cloud agree (on start and every few minutes)."""
        report = ReconcileReport(site_name)
        listing = self._list(site_name, "reconcile")
        if listing is None:
            return report
        world = self._world(site_name, *listing, sightings=True)
        plan = core.reconcile(world, self.rules(resume_after))
        report.waiting_orphans, report.withheld = list(plan.waiting_orphans), list(plan.withheld)
        self._carry_out(site_name, plan, report)
        log.info("reconciled", extra={"site": site_name, "adopted": len(report.adopted),
                                      "swept": len(report.swept), "vanished": len(report.vanished),
                                      "presumed_gone": len(report.presumed_gone),
                                      "readopted": len(report.readopted), "withheld": len(report.withheld),
                                      "resumed": len(report.resumed)})
        return report

    def _carry_out(self, site_name: str, plan: core.Plan, report: ReconcileReport) -> None:
        """Act on a plan, in its order. Every store move is a compare-and-set, so an action made
        stale by a racing thread or process is refused by the store, not applied."""
        now = self.clock.now()
        put_misses: list[Miss] = []
        clear_misses: list[str] = []
        put_sightings: list[Sighting] = []
        forget: list[str] = []
        for a in plan.actions:
            if isinstance(a, core.Follow):
                if self._advance(a.instance_id, a.state, ip=a.ip, reason=a.reason, error_kind=a.error_kind):
                    report.transitions += 1
            elif isinstance(a, core.NoteIp):
                self.store.set_cloud_fields(a.instance_id, ip=a.ip)
            elif isinstance(a, core.Notice):
                self._notice(site_name, a)
            elif isinstance(a, core.CountMiss):
                put_misses.append(a.miss)
            elif isinstance(a, core.ClearMiss):
                clear_misses.append(a.instance_id)
            elif isinstance(a, core.PresumeGone | core.Readopt):
                gone = isinstance(a, core.PresumeGone)
                t = self.store.note_presence(a.instance_id, gone, now, a.reason)
                if t is not None:
                    self.emit(t)
                    report.transitions += 1
                    (report.presumed_gone if gone else report.readopted).append(a.instance_id)
                    log.warning(a.reason, extra={"site": site_name, "instance": a.instance_id})
            elif isinstance(a, core.CloseGone):
                if self._advance(a.instance_id, "terminated", reason=a.reason):
                    report.transitions += 1
                    report.vanished.append(a.instance_id)
            elif isinstance(a, core.Adopt):
                self._land(a.instance_id, site_name, a.node, "adopted by reconciliation")
                report.adopted.append(a.instance_id)
            elif isinstance(a, core.Reopen):
                if self._reopen(a.instance_id, a.node, a.state):
                    report.adopted.append(a.instance_id)
                    report.transitions += 1
            elif isinstance(a, core.AdoptFound):
                node = a.node
                state = node.state if node.state in ("pending", "started", "failed") else "pending"
                _, t = self.store.record_found(a.instance_id, a.domain, state, now,
                                               f"adopted: node {node.cloud_id} carries this store's tags, its launch "
                                               "was unknown here", site=site_name, node_name=node.name,
                                               cloud_id=node.cloud_id, ip=node.ip)
                if t is not None:  # None: its launch arrived since the listing
                    self.emit(t)
                    report.adopted.append(a.instance_id)
                    report.transitions += 1
            elif isinstance(a, core.Destroy):
                if a.proof is Proof.ORPHAN and self.store.launch_ids([a.launch_id]):
                    continue  # its launch arrived since the listing: no longer an orphan
                if self.terminations.destroy(site_name, a.cloud_id, a.proof, a.why,
                                             instance_id=a.launch_id) != "failed":
                    report.swept.append(a.cloud_id)
                    if a.proof is Proof.ORPHAN:
                        forget.append(a.cloud_id)
            elif isinstance(a, core.Sight):
                put_sightings.append(a.sighting)
            elif isinstance(a, core.Forget):
                forget.append(a.cloud_id)
            elif isinstance(a, core.ResumeLaunch):
                self._schedule_launch(a.instance_id, site_name)
                report.resumed.append(a.instance_id)
            elif isinstance(a, core.ResumeTerminate):
                self.terminations.schedule(a.instance_id, site_name)
                report.resumed.append(a.instance_id)
            elif isinstance(a, core.Alert):
                self._raise_alert(site_name, a)
                report.alerts.append(a.kind)
        self.store.save_misses(put_misses, clear_misses)
        self.store.save_sightings(site_name, [x for x in put_sightings if x.cloud_id not in forget], forget)

    def _raise_alert(self, site_name: str, a: core.Alert) -> None:
        msg = ProvisionerAlert(site=site_name, kind=a.kind, message=a.message,  # type: ignore[arg-type]
                               deployment=self.identity.deployment, cloud_ids=list(a.cloud_ids), count=a.count,
                               at=self.clock.now())
        self.alerts.append(msg)
        log.warning(a.message, extra={"site": site_name, "alert": a.kind, "count": a.count})
        if self._alert is not None:
            try:
                self._alert(msg)
            except Exception as exc:  # an alert lost with the broker is logged above; a refusal recurs
                log.warning("alert publish failed", extra={"error": describe(exc)})

    def start(self) -> None:
        """On start: reconcile every site (adopting, sweeping, re-driving), concurrently. Nothing
        is in flight in a fresh process, so stalled work is re-driven at once."""
        for name in self.sites:
            self.runners[name].observe("reconcile", lambda name=name: self.reconcile(name, resume_after=0.0))
        self.redrive_unplaced()

    def poll_all(self) -> None:
        for name in self.sites:
            self.runners[name].observe("poll", lambda name=name: self.poll(name))

    def _notice(self, site_name: str, notice: core.Notice) -> None:
        """Tell the engine the cloud will reclaim an instance (``InstanceEvent.interruption_at``),
        once per instance and process: the event carries the record's current state and seq, so
        the store changes nothing; a restarted provisioner tells again (the engine acts once)."""
        if notice.instance_id in self._noticed:
            return
        rec = self.store.get(notice.instance_id)
        if rec is None or rec.terminal:
            return
        reason = f"{INTERRUPTION_REASON}: reclaimed at about {notice.at:.0f} (node {rec.cloud_id})"
        try:
            self._publish(InstanceEvent(
                instance_id=rec.instance_id, domain=rec.domain, site=rec.site or site_name, state=rec.state,
                seq=rec.seq, node_name=rec.node_name, ip=rec.ip, cloud_id=rec.cloud_id, cores=rec.cores,
                reason=reason, instance_type=rec.instance_type, at=self.clock.now(), interruption_at=notice.at))
        except Exception as exc:  # told again at the next poll
            log.warning("publish failed (interruption notice)", extra={"instance": rec.instance_id,
                                                                       "error": describe(exc)})
            return
        self._noticed.add(notice.instance_id)
        log.warning("interruption notice", extra={"site": site_name, "instance": rec.instance_id, "at": notice.at})

    def discover_all(self) -> None:
        """List the sizes of every site that ``discover``s them, on its observer thread."""
        for name, site in self.sites.items():
            if site.config.discover:
                self.runners[name].observe("discover", lambda name=name, site=site: self._discover(name, site))

    def _discover(self, name: str, site: Site) -> None:
        runner = self.runners[name]
        try:
            self.catalogues.discover(name, site, lambda: runner.call(site.sizes, "list_sizes"))
        except NotImplementedError:  # ``Site.sizes`` is optional: its catalogue is its configuration's
            log.warning("site cannot list its sizes: its instance types are its configuration's",
                        extra={"site": name})

    def reconcile_all(self) -> None:
        for name in self.sites:
            self.runners[name].observe("reconcile", lambda name=name: self.reconcile(name))
        self.redrive_unplaced()

    def health(self) -> dict[str, Any]:
        return {name: {"in_flight": r.in_flight} for name, r in self.runners.items()}

    def wait_idle(self, timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.busy():
                return True
            time.sleep(0.01)
        return False

    def shutdown(self, wait: bool = True) -> None:
        for r in self.runners.values():
            r.shutdown(wait=wait)


def _named_deployment(sites: dict[str, Site]) -> str | None:
    """The deployment the caller built the sites for, if it named one (all must agree)."""
    named = {d for s in sites.values() if (d := s.deployment)}
    if len(named) > 1:
        raise ValueError(f"sites were built for different deployments: {sorted(named)}")
    return named.pop() if named else None
