"""The provisioner service: the message loop around ``Provisioner``.

``build_service(config)`` wires the configured sites, the store and the shared work queue
(``topology.provisioner_spec()``; competing consumers, so several provisioners may run).
Handlers return once the intent is stored, so the runtime acks only then (rule 5); cloud
calls run on each site's own threads and publish through the thread-safe publisher. Timers
drive the poll loop, reconciliation and the outbox sweep; reconciliation also runs on start.
"""

from __future__ import annotations

import math
import operator
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import compress, repeat
from typing import Any

from epu.common.clock import Clock, RealClock
from epu.common.config import EpuConfig
from epu.common.messages import (
    TERMINAL_INSTANCE_STATES,
    Envelope,
    InstanceEvent,
    InstanceReport,
    LaunchRequest,
    Message,
    ProvisionerAlert,
    TerminateRequest,
)
from epu.common.runtime import Reject, RuntimeSettings, Service
from epu.services.provisioner.cloud import LibcloudSite, Site
from epu.services.provisioner.discovery import Catalogues, domain_sites
from epu.services.provisioner.drivers import make_driver
from epu.services.provisioner.metrics import ProvisionerMetrics
from epu.services.provisioner.provisioner import Provisioner, ProvisionerSettings
from epu.services.provisioner.runner import CallObserver, RetryPolicy
from epu.services.provisioner.store import InstanceRecord, Store
from epu.services.provisioner.userdata import UserdataRenderer, worker_contexts
from libcloud.compute.base import NodeDriver


class ProvisionerService(Service):
    """A ``Service`` that also stops its site threads and closes its store when it stops."""

    provisioner: Provisioner

    def run(self) -> None:
        try:
            super().run()
        finally:
            self.provisioner.shutdown(wait=False)
            self.provisioner.store.close()


def build_sites(config: EpuConfig, *, clock: Clock | None = None,
                drivers: dict[str, NodeDriver] | None = None) -> dict[str, Site]:
    """The configured sites; the provisioner binds its store's deployment identity to them."""
    sites: dict[str, Site] = {}
    for name, site_cfg in config.sites.items():
        driver = (drivers or {}).get(name) or make_driver(name, site_cfg, clock=clock)
        sites[name] = LibcloudSite(name, site_cfg, driver)
    return sites


def build_provisioner(config: EpuConfig, publish: Any, *, clock: Clock | None = None,
                      drivers: dict[str, NodeDriver] | None = None, store: Store | None = None,
                      on_cloud_call: CallObserver | None = None, alert: Any = None,
                      new_id: Callable[[], str] | None = None) -> Provisioner:
    """``alert`` receives every ``ProvisionerAlert`` (the service publishes them); ``new_id`` makes
    the store id and a generated deployment identity at a store's first start (default: random;
    a simulator passes a seeded one so a run replays exactly)."""
    pc = config.provisioner
    sites = build_sites(config, clock=clock, drivers=drivers)
    workers = worker_contexts(config)
    renderers = {name: UserdataRenderer.from_path(s.userdata_template, s.userdata_max_bytes, workers)
                 for name, s in config.sites.items()}
    settings = ProvisionerSettings(
        deployment=pc.deployment, orphan_grace_seconds=pc.orphan_grace_seconds,
        vanish_misses=pc.vanish_misses, vanish_min_seconds=pc.vanish_min_seconds,
        max_destroys_per_reconcile=pc.max_destroys_per_reconcile,
        outbox_delay_seconds=pc.outbox_seconds,
        retry=RetryPolicy(attempts=pc.retry_attempts, initial=pc.retry_initial_seconds,
                          maximum=pc.retry_max_seconds),
    )
    if new_id is not None:
        settings.new_id = new_id
    return Provisioner(store or Store(pc.store_url), sites, publish, clock=clock, settings=settings,
                       renderers=renderers, on_cloud_call=on_cloud_call, alert=alert)


def build_service(config: EpuConfig, *, clock: Clock | None = None,
                  drivers: dict[str, NodeDriver] | None = None) -> ProvisionerService:
    """``drivers`` lets a caller (the demo, tests) hand in driver objects by site name, e.g.
    one simulated cloud shared with something else in the process."""
    clock = clock or RealClock()
    pc = config.provisioner
    service = ProvisionerService(
        "provisioner", config.broker_obj(), clock=clock,
        settings=RuntimeSettings(metrics_port=pc.metrics_port, metrics_host=pc.metrics_host),
    )
    metrics = ProvisionerMetrics(service.metrics.registry)

    def publish(event: InstanceEvent) -> None:
        service.publish(event)
        metrics.published(event)

    def alert(message: ProvisionerAlert) -> None:
        metrics.alerted(message)
        service.publish(message)

    prov = build_provisioner(config, publish, clock=clock, drivers=drivers, on_cloud_call=metrics.cloud_call,
                             alert=alert)
    metrics.watch_runners(prov.runners)
    service.provisioner = prov
    service.settings.extra_health["sites"] = prov.health

    def handle(message: Message, envelope: Envelope) -> None:
        if isinstance(message, LaunchRequest):
            prov.handle_launch(message)
        elif isinstance(message, TerminateRequest):
            prov.handle_terminate(message)
        else:  # the runtime filters by type; this guards a future topology change
            raise Reject(f"provisioner does not handle {envelope.type}")

    service.consume(service.broker.topology.provisioner_spec(), handle,
                    types={LaunchRequest.TYPE, TerminateRequest.TYPE})
    service.on_start.append(prov.start)
    service.every(pc.poll_seconds, prov.poll_all, name="poll")
    service.every(pc.reconcile_seconds, prov.reconcile_all, name="reconcile")
    service.every(pc.outbox_seconds, prov.flush_outbox, name="outbox")
    service.on_start.append(prov.discover_all)
    service.every(pc.discover_seconds, prov.discover_all, name="discover")
    offered = domain_sites(config.domains, config.sites)
    reported = ReportCache()
    service.every(pc.report_seconds, lambda: publish_reports(service, prov.store, pc.report_horizon_seconds,
                                                             prov.catalogues, offered, reported),
                  name="report")
    return service


@dataclass
class ReportCache:
    """What ``publish_reports`` keeps between calls (the caller's; a restart starts empty)."""

    events: dict[str, tuple[InstanceRecord, InstanceEvent]] = field(default_factory=dict)
    """Each record's event of the last report, by instance id: handed out again while the
    store returns the same record object (records are immutable: a change is a new object).
    A quiet cluster's report was mostly rebuilding these events; the events are frozen, so
    sharing one between reports changes nothing a receiver sees."""
    listing: tuple[list[InstanceRecord], float, float, dict[str, list[InstanceEvent]]] | None = None
    """(the records the store listed, the earliest ``updated_at`` of the ended ones the report
    kept, the latest of those it left out as older than the horizon, the events per domain) of
    the last report: the same events again while the store lists the very same records and no
    ended one crossed the horizon since — every kept one still at or after the cutoff (the
    earliest is) and every left-out one still before it (the latest is): two comparisons
    instead of one per ended record."""


_Events = tuple[defaultdict[str, list[InstanceEvent]], dict[str, tuple[InstanceRecord, InstanceEvent]], float, float]
"""(the events per domain, each record's (record, event) by instance id, the earliest ``updated_at``
of the ended records kept, the latest of those left out): what a report is built from."""

_RECORD = operator.itemgetter(0)
_EVENT = operator.itemgetter(1)
_NO_EVENT: tuple[None, None] = (None, None)
_ID = operator.attrgetter("instance_id")
_STATE = operator.attrgetter("state")
_DOMAIN = operator.attrgetter("domain")
_UPDATED_AT = operator.attrgetter("updated_at")


def _event_of(r: InstanceRecord) -> InstanceEvent:
    """A record's entry in a report."""
    return InstanceEvent(instance_id=r.instance_id, domain=r.domain, site=r.site, state=r.state, seq=r.seq,
                         node_name=r.node_name, ip=r.ip, cloud_id=r.cloud_id, cores=r.cores, reason=r.reason,
                         error_kind=r.error_kind, at=r.updated_at)


def _events(records: list[InstanceRecord], cutoff: float,
            seen: dict[str, tuple[InstanceRecord, InstanceEvent]]) -> _Events:
    """A report's events from the records listed: each ended record older than ``cutoff`` left
    out, each kept one's event taken from ``seen`` while it is the very record it was made from."""
    by_domain: defaultdict[str, list[InstanceEvent]] = defaultdict(list)
    kept: dict[str, tuple[InstanceRecord, InstanceEvent]] = {}
    earliest_kept, latest_out = math.inf, -math.inf
    for r in records:  # one pass: which ended ones the horizon leaves out, and the events
        if r.state in TERMINAL_INSTANCE_STATES:  # ``r.terminal``
            at = r.updated_at
            if at < cutoff:
                if at > latest_out:
                    latest_out = at
                continue
            if at < earliest_kept:
                earliest_kept = at
        hit = seen.get(r.instance_id)
        if hit is None or hit[0] is not r:
            hit = (r, _event_of(r))
        kept[r.instance_id] = hit
        by_domain[r.domain].append(hit[1])
    return by_domain, kept, earliest_kept, latest_out


def _events_fast(records: list[InstanceRecord], cutoff: float,
                 seen: dict[str, tuple[InstanceRecord, InstanceEvent]]) -> _Events | None:
    """``_events``' answer for the common listing — no ended record older than ``cutoff`` (the
    store leaves those out: ``live_or_updated_since``), every record of one domain — with the
    per-record steps done in C (a busy site's report was mostly that loop) and only the records
    new or changed since ``seen`` made into events. ``None``: not that listing (``_events``)."""
    n = len(records)
    ids = list(map(_ID, records))
    hits = list(map(seen.get, ids, repeat(_NO_EVENT)))
    ended = list(map(_UPDATED_AT, compress(records, map(TERMINAL_INSTANCE_STATES.__contains__,
                                                           map(_STATE, records)))))
    earliest_kept = min(ended) if ended else math.inf
    if earliest_kept < cutoff:
        return None  # some ended record is left out
    domains = list(map(_DOMAIN, records))
    if n and domains.count(domains[0]) != n:
        return None
    for i in compress(range(n), map(operator.is_not, map(_RECORD, hits), records)):
        r = records[i]
        hits[i] = (r, _event_of(r))
    by_domain: defaultdict[str, list[InstanceEvent]] = defaultdict(list)
    if n:
        by_domain[domains[0]] = list(map(_EVENT, hits))
    return by_domain, dict(zip(ids, hits, strict=True)), earliest_kept, -math.inf


def publish_reports(service: Service, store: Store, horizon: float, catalogues: Catalogues | None = None,
                    domain_sites: dict[str, list[str]] | None = None, cache: ReportCache | None = None) -> int:
    """Anti-entropy: per domain, the current state of every instance this provisioner knows
    (live, or ended within ``horizon``) as one ``instance.report``, with the instance types its
    sites were found to offer (``catalogues``, for the domains of ``domain_sites``: a domain
    without instances gets a report when one of its sites discovered types). Returns how many
    were sent. ``cache``: see ``ReportCache`` (what a report is built from is a function of the
    records listed, each by its object, and of which ended ones the horizon leaves out)."""
    now = service.clock.now()
    cutoff = now - horizon
    records = store.list(live_or_updated_since=cutoff)  # not every record ever (O(history))
    last = cache.listing if cache is not None else None
    if (last is not None and last[1] >= cutoff and last[2] < cutoff and len(last[0]) == len(records)
            and all(map(operator.is_, last[0], records))):
        by_domain = last[3]
    else:
        seen = cache.events if cache is not None else {}
        built = _events_fast(records, cutoff, seen)
        if built is None:
            built = _events(records, cutoff, seen)
        by_domain, kept, earliest_kept, latest_out = built
        if cache is not None:
            cache.events = kept
            cache.listing = (records, earliest_kept, latest_out, by_domain)
    offered = {d: catalogues.offered(names) for d, names in (domain_sites or {}).items()} if catalogues else {}
    sent = 0
    for domain in [*by_domain, *(d for d, o in offered.items() if o and d not in by_domain)]:
        service.publish(InstanceReport(domain=domain, as_of=now, horizon_seconds=horizon,
                                       instances=by_domain.get(domain, []), offered=offered.get(domain, {})))
        sent += 1
    return sent
