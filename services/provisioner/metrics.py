"""The provisioner's Prometheus metrics, beside the runtime's message counters.

Why these: an operator of a cloud-bursting cluster asks how fast each cloud answers (API
latency by call and outcome: a site turning slow or refusing shows here first), how long
instances take to boot (requested → started, per site), how much work is queued on each
site's threads, how many instances moved through which state, how often the cloud stopped
listing a node (presumed gone) or listed it again, which alerts the destroy paths raised, and
every destroy call by the proof that allowed it (``terminations``: a sweep of orphans or a run of
bookkeeping destroys shows here before anyone reads a log).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, get_args

from epu.common.messages import ErrorKind, InstanceEvent, ProvisionerAlert, ProvisionerAlertKind
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

CLOUD_CALL_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60)
BOOT_BUCKETS = (1, 5, 10, 30, 60, 120, 300, 600, 1200)
PROVISIONER_STATES = ("requested", "pending", "started", "terminating", "terminated", "failed")
"""The instance states a provisioner publishes (joined and draining are the engine's)."""


class ProvisionerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.transitions = Counter("epu_provisioner_transitions_total",
                                   "Instance transitions published, by site and state",
                                   ["site", "state"], registry=registry)
        self.failures = Counter("epu_provisioner_failures_total", "Failed instances, by site and error kind",
                                ["site", "kind"], registry=registry)
        self.cloud_calls = Histogram("epu_provisioner_cloud_call_seconds",
                                     "Cloud API call attempts by site, call (create, destroy, list) and outcome "
                                     "(ok, transient, capacity, permanent)",
                                     ["site", "call", "outcome"], buckets=CLOUD_CALL_BUCKETS, registry=registry)
        self.boot = Histogram("epu_provisioner_boot_seconds", "Seconds from launch requested to started, by site",
                              ["site"], buckets=BOOT_BUCKETS, registry=registry)
        self.in_flight = Gauge("epu_provisioner_site_in_flight", "Launch and terminate tasks running on a site",
                               ["site"], registry=registry)
        self.presence = Counter("epu_provisioner_presence_changes_total",
                                "Instances presumed gone (no longer listed) or re-adopted (listed again), "
                                "by site and change", ["site", "change"], registry=registry)
        self.alerts = Counter("epu_provisioner_alerts_total", "provisioner.alert events raised, by site and kind",
                              ["site", "kind"], registry=registry)
        self.destroys = Counter("epu_provisioner_destroys_total",
                                "Destroy calls by site, the proof that allowed them (removed, forced, unstarted, "
                                "bookkeeping, failed-launch, duplicate, orphan, closed-record) and outcome "
                                "(destroyed, gone, failed)", ["site", "proof", "outcome"], registry=registry)
        self._requested_at: dict[str, float] = {}

    def known_sites(self, sites: Iterable[str]) -> None:
        """Export every counter series of each configured site at 0 now: a labelled counter exists
        only from its first increment, and ``increase()`` reads a series born at 1 as no increase
        (issue 34: an alert missed the first events). The states a provisioner publishes, the
        error kinds of a failure, the presence changes and the alert kinds are all known."""
        for site in sites:
            for state in PROVISIONER_STATES:
                self.transitions.labels(site, state)
            for kind in (*get_args(ErrorKind), "none"):
                self.failures.labels(site, kind)
            for change in ("presumed_gone", "readopted"):
                self.presence.labels(site, change)
            for kind in get_args(ProvisionerAlertKind):
                self.alerts.labels(site, kind)

    def cloud_call(self, site: str, call: str, seconds: float, outcome: str) -> None:
        self.cloud_calls.labels(site, call, outcome).observe(seconds)

    def published(self, event: InstanceEvent) -> None:
        """Count a published transition; time the boot from this process's own ``requested``
        (an instance requested before a restart is not timed rather than timed wrong). A presence
        change (same state, new ``seq``) is counted as such, not as a transition."""
        if event.previous == event.state:
            self.presence.labels(event.site, "presumed_gone" if event.presumed_gone else "readopted").inc()
            return
        self.transitions.labels(event.site, event.state).inc()
        if event.state == "requested":
            self._requested_at[event.instance_id] = event.at
        elif event.state == "started":
            at = self._requested_at.pop(event.instance_id, None)
            if at is not None:
                self.boot.labels(event.site).observe(max(0.0, event.at - at))
        elif event.state in ("failed", "terminated"):
            self._requested_at.pop(event.instance_id, None)
        if event.state == "failed":
            self.failures.labels(event.site, event.error_kind or "none").inc()

    def alerted(self, alert: ProvisionerAlert) -> None:
        self.alerts.labels(alert.site, alert.kind).inc()

    def destroyed(self, site: str, proof: str, outcome: str) -> None:
        """A destroy call (``terminations.DestroyObserver``)."""
        self.destroys.labels(site, proof, outcome).inc()

    def watch_runners(self, runners: Mapping[str, Any]) -> None:
        for name, runner in runners.items():
            self.in_flight.labels(name).set_function(lambda r=runner: r.in_flight)
