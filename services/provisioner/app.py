"""The provisioner service: the message loop around ``Provisioner``.

``build_service(config)`` wires the configured sites, the store and the shared work queue
(``topology.provisioner_spec()``; competing consumers, so several provisioners may run).
Handlers return once the intent is stored, so the runtime acks only then (rule 5); cloud
calls run on each site's own threads and publish through the thread-safe publisher. Timers
drive the poll loop, reconciliation and the outbox sweep; reconciliation also runs on start.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
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
from epu.common.senders import SenderPolicy
from epu.services.provisioner.cloud import LibcloudSite, NodeConversion, Site, to_cloud_nodes
from epu.services.provisioner.discovery import Catalogues, domain_sites
from epu.services.provisioner.drivers import make_driver
from epu.services.provisioner.metrics import ProvisionerMetrics
from epu.services.provisioner.provisioner import Provisioner, ProvisionerSettings
from epu.services.provisioner.records import InstanceRecord
from epu.services.provisioner.runner import CallObserver, RetryPolicy
from epu.services.provisioner.store import Store
from epu.services.provisioner.terminations import DestroyObserver
from epu.services.provisioner.userdata import UserdataRenderer, worker_contexts
from libcloud.compute.base import NodeDriver
from pydantic import ValidationError

log = logging.getLogger("epu.provisioner")


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
                drivers: dict[str, NodeDriver] | None = None,
                convert: dict[str, NodeConversion] | None = None) -> dict[str, Site]:
    """The configured sites; the provisioner binds its store's deployment identity to them.
    ``convert``: by site name, a function equal to ``to_cloud_nodes`` (``LibcloudSite.convert``)."""
    sites: dict[str, Site] = {}
    for name, site_cfg in config.sites.items():
        driver = (drivers or {}).get(name) or make_driver(name, site_cfg, clock=clock)
        sites[name] = LibcloudSite(name, site_cfg, driver, convert=(convert or {}).get(name, to_cloud_nodes))
    return sites


def build_provisioner(config: EpuConfig, publish: Any, *, clock: Clock | None = None,
                      drivers: dict[str, NodeDriver] | None = None, store: Store | None = None,
                      on_cloud_call: CallObserver | None = None, alert: Any = None,
                      new_id: Callable[[], str] | None = None,
                      convert: dict[str, NodeConversion] | None = None,
                      on_destroy: DestroyObserver | None = None) -> Provisioner:
    """``alert`` receives every ``ProvisionerAlert`` (the service publishes them); ``new_id`` makes
    the store id and a generated deployment identity at a store's first start (default: random;
    a simulator passes a seeded one so a run replays exactly); ``on_destroy`` is told every
    destroy call (site, proof, outcome). The broker's sender rules (``user_prefix``) tell the
    terminate gate who the operator is (``terminations.may_force``)."""
    pc = config.provisioner
    sites = build_sites(config, clock=clock, drivers=drivers, convert=convert)
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
    senders = SenderPolicy(config.broker.user_prefix, config.broker.require_sender_user)
    return Provisioner(store or Store(pc.store_url), sites, publish, clock=clock, settings=settings,
                       renderers=renderers, on_cloud_call=on_cloud_call, alert=alert, senders=senders,
                       on_destroy=on_destroy)


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
    metrics.known_sites(config.sites)  # every site's counters from 0 (alerts see the first event)

    def publish(event: InstanceEvent) -> None:
        service.publish(event)
        metrics.published(event)

    def alert(message: ProvisionerAlert) -> None:
        metrics.alerted(message)
        service.publish(message)

    prov = build_provisioner(config, publish, clock=clock, drivers=drivers, on_cloud_call=metrics.cloud_call,
                             alert=alert, on_destroy=metrics.destroyed)
    metrics.watch_runners(prov.runners)
    service.provisioner = prov
    service.settings.extra_health["sites"] = prov.health

    def handle(message: Message, envelope: Envelope) -> None:
        if isinstance(message, LaunchRequest):
            prov.handle_launch(message)
        elif isinstance(message, TerminateRequest):
            prov.handle_terminate(message, sender=service.sender)  # the validated broker user
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
    service.every(pc.report_seconds, lambda: publish_reports(service, prov.store, pc.report_horizon_seconds,
                                                             prov.catalogues, offered),
                  name="report")
    return service


def event_of(r: InstanceRecord) -> InstanceEvent | None:
    """A record's entry in a report: the record's latest event (``InstanceRecord.event``: a record
    without a site names ``unknown``, a reopened one says so). ``None`` — logged, the entry left
    out — for a record no valid event can be made of: one bad record costs its own entry, never
    the report (the engine's safety net: issue 33, where one record without a site stopped every
    report for the horizon)."""
    try:
        return r.event()
    except ValidationError as exc:
        log.error("a record cannot be reported: left out of the report",
                  extra={"instance": r.instance_id, "domain": r.domain, "error": str(exc)[:500]})
        return None


def report_events(records: list[InstanceRecord], cutoff: float) -> dict[str, list[InstanceEvent]]:
    """A report's events per domain, in listing order: every record listed but an ended one older
    than ``cutoff`` (a store may list more than the horizon asks for) and one no entry can be made
    of (``event_of``)."""
    by_domain: defaultdict[str, list[InstanceEvent]] = defaultdict(list)
    for r in records:
        if r.state in TERMINAL_INSTANCE_STATES and r.updated_at < cutoff:
            continue
        event = event_of(r)
        if event is not None:
            by_domain[r.domain].append(event)
    return by_domain


ReportEvents = Callable[[list[InstanceRecord], float], dict[str, list[InstanceEvent]]]
"""``report_events``' type: ``publish_reports`` takes any function equal to it."""


def publish_reports(service: Service, store: Store, horizon: float, catalogues: Catalogues | None = None,
                    domain_sites: dict[str, list[str]] | None = None, events: ReportEvents = report_events) -> int:
    """Anti-entropy: per domain, the current state of every instance this provisioner knows
    (live, or ended within ``horizon``) as one ``instance.report``, with the instance types its
    sites were found to offer (``catalogues``, for the domains of ``domain_sites``: a domain
    without instances gets a report when one of its sites discovered types). Returns how many
    were sent. ``events``: how the listed records become the report's entries — the service uses
    ``report_events``; the simulator passes an equal function that hands out the events it
    already made from the very same record objects (``epu.sim.report_memo``), to save its CPU."""
    now = service.clock.now()
    cutoff = now - horizon
    records = store.list(live_or_updated_since=cutoff)  # not every record ever (O(history))
    by_domain = events(records, cutoff)
    offered = {d: catalogues.offered(names) for d, names in (domain_sites or {}).items()} if catalogues else {}
    sent = 0
    for domain in [*by_domain, *(d for d, o in offered.items() if o and d not in by_domain)]:
        service.publish(InstanceReport(domain=domain, as_of=now, horizon_seconds=horizon,
                                       instances=by_domain.get(domain, []), offered=offered.get(domain, {})))
        sent += 1
    return sent
