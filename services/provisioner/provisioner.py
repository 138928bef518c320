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
(or avoided by looking the tag up first where a provider has no token). A node tagged with
this deployment whose launch id the store does not know is swept after a grace period.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from common.clock import Clock, RealClock
from common.messages import InstanceEvent, LaunchRequest, TerminateRequest
from services.provisioner.cloud import CloudNode, LaunchSpec, Site, is_not_found
from services.provisioner.errors import classify, describe
from services.provisioner.runner import CallObserver, RetryPolicy, SiteRunner
from services.provisioner.states import check_transition
from services.provisioner.store import InstanceRecord, Store, Transition
from services.provisioner.userdata import UserdataError, UserdataRenderer

log = logging.getLogger("epu.provisioner")

#: Test hook: ``EPU_PROVISIONER_CRASH_AT=after_cloud_call`` SIGKILLs this process right after
#: a create call returned and before the store knows (the window the design worries about).
CRASH_ENV = "EPU_PROVISIONER_CRASH_AT"


@dataclass
class ProvisionerSettings:
    deployment: str = "epu"
    orphan_grace_seconds: float = 600.0
    vanish_misses: int = 2
    """Consecutive polls a node must be missing before its record is marked terminated."""
    resume_after_seconds: float = 30.0
    """A ``requested`` record with no launch in flight here is re-driven after this long."""
    outbox_delay_seconds: float = 10.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)


@dataclass
class ReconcileReport:
    site: str
    adopted: list[str] = field(default_factory=list)
    swept: list[str] = field(default_factory=list)
    waiting_orphans: list[str] = field(default_factory=list)
    vanished: list[str] = field(default_factory=list)
    resumed: list[str] = field(default_factory=list)


class Provisioner:
    def __init__(self, store: Store, sites: dict[str, Site], publish: Callable[[InstanceEvent], Any], *,
                 clock: Clock | None = None, settings: ProvisionerSettings | None = None,
                 renderers: dict[str, UserdataRenderer] | None = None,
                 sleep: Callable[[float], None] | None = None, on_cloud_call: CallObserver | None = None) -> None:
        self.store = store
        self.sites = sites
        self._publish = publish
        self.clock = clock or RealClock()
        self.settings = settings or ProvisionerSettings()
        self.renderers = renderers or {}
        self.runners = {
            name: SiteRunner(name, site.config.rate_limit_per_second, site.config.max_in_flight,
                             self.settings.retry, sleep=sleep, on_call=on_cloud_call)
            for name, site in sites.items()
        }
        self._lock = threading.Lock()
        self._inflight: set[str] = set()
        self._misses: dict[str, int] = {}
        self._orphans_seen: dict[str, float] = {}
        self._publish_lock = threading.Lock()
        self._crash_at = os.environ.get(CRASH_ENV, "")

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
        rec, first = self.store.record_launch(req, self.clock.now())
        if first is not None:
            self.emit(first)
            if req.site not in self.sites:
                self._advance(rec.instance_id, "failed", reason=f"unknown site {req.site!r}",
                              error_kind="permanent")
                return rec
            quota = self.sites[req.site].config.quota
            if self.store.active_count(req.site) > quota:  # this launch is already counted
                self._advance(rec.instance_id, "failed", error_kind="capacity",
                              reason=f"site quota reached: {req.site} allows {quota} instances")
                return rec
            self._schedule_launch(rec.instance_id, req.site)
            return rec
        log.info("duplicate launch request", extra={"launch_id": req.launch_id, "state": rec.state})
        if rec.state == "requested" and rec.site in self.sites:
            self._schedule_launch(rec.instance_id, rec.site)  # a redelivery after a crash: re-drive it
        return rec

    def handle_terminate(self, req: TerminateRequest) -> InstanceRecord:
        now = self.clock.now()
        rec = self.store.get(req.instance_id)
        if rec is None:
            rec, t = self.store.record_unknown_terminated(req.instance_id, req.domain, now,
                                                          "terminate for an unknown instance: recorded as terminated")
            self.emit(t)
            return rec
        if rec.terminal:
            return rec
        t = self.store.advance(rec.instance_id, "terminating", now,
                               reason=req.reason or "terminate requested")
        self.emit(t)
        if rec.site in self.sites:
            self._schedule_terminate(rec.instance_id, rec.site)
        return self.store.get(rec.instance_id) or rec

    # ------------------------------------------------------------------ scheduling
    def _claim(self, key: str) -> bool:
        with self._lock:
            if key in self._inflight:
                return False
            self._inflight.add(key)
            return True

    def _release(self, key: str) -> None:
        with self._lock:
            self._inflight.discard(key)

    def _schedule_launch(self, instance_id: str, site: str) -> None:
        key = f"launch:{instance_id}"
        if not self._claim(key):
            return

        def task() -> None:
            try:
                self._do_launch(instance_id, site)
            finally:
                self._release(key)

        self.runners[site].submit(task)

    def _schedule_terminate(self, instance_id: str, site: str) -> None:
        key = f"terminate:{instance_id}"
        if not self._claim(key):
            return

        def task() -> None:
            try:
                self._do_terminate(instance_id, site)
            finally:
                self._release(key)

        self.runners[site].submit(task)

    def busy(self) -> bool:
        with self._lock:
            return bool(self._inflight)

    # ------------------------------------------------------------------ cloud work
    def _find_by_launch_id(self, site: str, launch_id: str) -> CloudNode | None:
        runner, s = self.runners[site], self.sites[site]
        for node in runner.call(s.nodes, "list"):
            if node.launch_id == launch_id and node.live:
                return node
        return None

    def _userdata(self, rec: InstanceRecord, attributes: dict[str, str]) -> str:
        renderer = self.renderers.get(rec.site)
        if renderer is None:
            return ""
        values: dict[str, object] = dict(attributes)
        values.update(instance_id=rec.instance_id, launch_id=rec.instance_id, node_name=rec.node_name,
                      domain=rec.domain, site=rec.site, deployment=self.settings.deployment, cores=rec.cores)
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
            spec = LaunchSpec(launch_id=instance_id, node_name=rec.node_name, domain=rec.domain,
                              userdata=userdata)
            attempts = [0]

            def create() -> CloudNode:
                # a retried create on a provider without client tokens could make a second
                # node if the first call's answer was lost: look for it by tag first
                attempts[0] += 1
                if attempts[0] > 1 and not getattr(site, "idempotent_create", True):
                    found = self._find_by_launch_id(site_name, instance_id)
                    if found is not None:
                        return found
                return site.launch(spec)

            node = runner.call(create, "create")
        except UserdataError as exc:
            self._advance(instance_id, "failed", reason=str(exc), error_kind="permanent")
            return
        except Exception as exc:
            kind = classify(exc)
            log.warning("launch failed", extra={"site": site_name, "launch_id": instance_id, "kind": kind,
                                                "error": describe(exc)})
            self._advance(instance_id, "failed", reason=f"{kind}: {describe(exc)}", error_kind=kind)
            return
        if self._crash_at == "after_cloud_call":
            os.kill(os.getpid(), signal.SIGKILL)
        self._land(instance_id, site_name, node, "launched", expect=rec)

    def _land(self, instance_id: str, site_name: str, node: CloudNode, why: str,
              expect: InstanceRecord | None = None) -> None:
        """Record the cloud node of a launch (``requested`` → ``pending``/``started``)."""
        state = node.state if node.state in ("pending", "started", "failed") else "pending"
        reason = f"{why} as {node.cloud_id}" if state != "failed" else f"boot failed: node {node.native_state}"
        t = self._advance(instance_id, state, cloud_id=node.cloud_id, ip=node.ip, reason=reason,
                          error_kind=None, expect=expect)
        if t is not None:
            return
        rec = self.store.get(instance_id)
        if rec is None:
            return
        if rec.cloud_id is None:
            self.store.set_cloud_fields(instance_id, cloud_id=node.cloud_id, ip=node.ip)
        # told to terminate (or given up) while the create was in flight: don't leave it running
        if rec.state == "terminating":
            self._schedule_terminate(instance_id, site_name)
        elif rec.terminal and rec.cloud_id in (None, node.cloud_id):
            self._destroy_quietly(site_name, node.cloud_id, f"record {instance_id} is {rec.state}")

    def _destroy_quietly(self, site_name: str, cloud_id: str, why: str) -> bool:
        try:
            self.runners[site_name].call(lambda: self.sites[site_name].terminate(cloud_id), "destroy")
        except Exception as exc:
            if not is_not_found(exc):
                log.warning("sweep failed", extra={"site": site_name, "cloud_id": cloud_id, "error": describe(exc)})
                return False
        log.info("node swept", extra={"site": site_name, "cloud_id": cloud_id, "why": why})
        return True

    def _do_terminate(self, instance_id: str, site_name: str) -> None:
        rec = self.store.get(instance_id)
        if rec is None or rec.terminal:
            return
        cloud_id = rec.cloud_id
        try:
            if cloud_id is None:
                if f"launch:{instance_id}" in self._inflight:
                    return  # the launch task will see "terminating" and finish the job
                found = self._find_by_launch_id(site_name, instance_id)
                if found is None:
                    self._advance(instance_id, "terminated", reason="terminated before a node existed")
                    return
                cloud_id = found.cloud_id
                self.store.set_cloud_fields(instance_id, cloud_id=cloud_id)
            self.runners[site_name].call(lambda: self.sites[site_name].terminate(cloud_id), "destroy")
        except Exception as exc:
            if is_not_found(exc):
                self._advance(instance_id, "terminated", reason=f"node {cloud_id} already gone")
                return
            log.warning("terminate failed; reconciliation will retry",
                        extra={"site": site_name, "instance": instance_id, "error": describe(exc)})
            return
        # the poll confirms "terminated" when the cloud lists the node so (or no longer lists it)

    # ------------------------------------------------------------------ observation
    def poll(self, site_name: str) -> int:
        """List the site's nodes once and move records to what the cloud says. Returns the
        number of transitions."""
        listed_at = self.clock.now()
        try:
            nodes = self.runners[site_name].call(self.sites[site_name].nodes, "list")
        except Exception as exc:
            log.warning("poll failed", extra={"site": site_name, "error": describe(exc)})
            return 0
        return self._apply_observation(site_name, nodes, self.settings.vanish_misses, listed_at)

    def _apply_observation(self, site_name: str, nodes: list[CloudNode], misses_needed: int,
                           listed_at: float) -> int:
        by_cloud = {n.cloud_id: n for n in nodes}
        moved = 0
        for rec in self.store.list(site=site_name, active_only=True):
            if rec.cloud_id is None:
                continue  # a launch in flight owns it
            node = by_cloud.get(rec.cloud_id)
            if node is None and rec.updated_at > listed_at:
                continue  # landed after the list was taken: its absence means nothing
            if node is None:
                misses = self._misses.get(rec.instance_id, 0) + 1
                self._misses[rec.instance_id] = misses
                if misses >= misses_needed:
                    if self._advance(rec.instance_id, "terminated",
                                     reason=f"vanished: node {rec.cloud_id} no longer listed by site {site_name}"):
                        moved += 1
                    self._misses.pop(rec.instance_id, None)
                continue
            self._misses.pop(rec.instance_id, None)
            target = node.state
            if target == "failed":
                reason, kind = f"node in state {node.native_state}", "transient"
            elif target == "terminated":
                reason, kind = ("terminated" if rec.state == "terminating"
                                else f"terminated by the cloud (node {node.cloud_id})"), None
            else:
                reason, kind = f"node {node.native_state}", None
            if target and check_transition(rec.state, target).allowed:
                if self._advance(rec.instance_id, target, ip=node.ip, reason=reason, error_kind=kind):
                    moved += 1
            elif node.ip and node.ip != rec.ip:
                self.store.set_cloud_fields(rec.instance_id, ip=node.ip)
        return moved

    def reconcile(self, site_name: str, resume_after: float | None = None) -> ReconcileReport:
        """Make the store and the cloud agree (on start and every few minutes)."""
        report = ReconcileReport(site_name)
        site, runner = self.sites[site_name], self.runners[site_name]
        listed_at = self.clock.now()
        try:
            nodes = runner.call(site.nodes, "list")
        except Exception as exc:
            log.warning("reconcile failed", extra={"site": site_name, "error": describe(exc)})
            return report
        now = self.clock.now()
        resume_after = self.settings.resume_after_seconds if resume_after is None else resume_after
        tagged = [n for n in nodes if n.launch_id]
        known = self.store.launch_ids([n.launch_id for n in tagged if n.launch_id])
        for node in tagged:
            lid = node.launch_id
            assert lid is not None
            rec = self.store.get(lid) if lid in known else None
            if rec is None:
                if not node.live:
                    continue
                first = self._orphans_seen.setdefault(node.cloud_id, node.created_at or now)
                if now - first >= self.settings.orphan_grace_seconds:
                    if self._destroy_quietly(site_name, node.cloud_id, f"orphan: launch id {lid} unknown"):
                        report.swept.append(node.cloud_id)
                        self._orphans_seen.pop(node.cloud_id, None)
                else:
                    report.waiting_orphans.append(node.cloud_id)
                continue
            if rec.cloud_id is None and not rec.terminal:
                if f"launch:{lid}" in self._inflight:
                    continue
                self._land(lid, site_name, node, "adopted by reconciliation")
                report.adopted.append(lid)
            elif (rec.terminal and node.state != "terminated") or (
                    node.live and rec.cloud_id and rec.cloud_id != node.cloud_id):
                why = (f"record {lid} is {rec.state}" if rec.terminal
                       else f"duplicate node for launch {lid} (tracked: {rec.cloud_id})")
                if self._destroy_quietly(site_name, node.cloud_id, why):
                    report.swept.append(node.cloud_id)
        # records whose node is gone, or whose work stalled
        by_cloud = {n.cloud_id: n for n in nodes}
        for rec in self.store.list(site=site_name, active_only=True):
            if rec.cloud_id and rec.cloud_id not in by_cloud and rec.updated_at <= listed_at:
                if self._advance(rec.instance_id, "terminated",
                                 reason=f"vanished: node {rec.cloud_id} not found by reconciliation"):
                    report.vanished.append(rec.instance_id)
            elif rec.state == "requested" and rec.cloud_id is None \
                    and now - rec.updated_at >= resume_after \
                    and f"launch:{rec.instance_id}" not in self._inflight:
                self._schedule_launch(rec.instance_id, site_name)
                report.resumed.append(rec.instance_id)
            elif rec.state == "terminating" and f"terminate:{rec.instance_id}" not in self._inflight:
                node = by_cloud.get(rec.cloud_id or "")
                if node is None or node.live:
                    self._schedule_terminate(rec.instance_id, site_name)
                    report.resumed.append(rec.instance_id)
        log.info("reconciled", extra={"site": site_name, "adopted": len(report.adopted),
                                      "swept": len(report.swept), "vanished": len(report.vanished),
                                      "resumed": len(report.resumed)})
        return report

    def start(self) -> None:
        """On start: reconcile every site (adopting, sweeping, re-driving), concurrently. Nothing
        is in flight in a fresh process, so stalled work is re-driven at once."""
        for name in self.sites:
            self.runners[name].observe("reconcile", lambda name=name: self.reconcile(name, resume_after=0.0))

    def poll_all(self) -> None:
        for name in self.sites:
            self.runners[name].observe("poll", lambda name=name: self.poll(name))

    def reconcile_all(self) -> None:
        for name in self.sites:
            self.runners[name].observe("reconcile", lambda name=name: self.reconcile(name))

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
