"""The provisioner service: the message loop around ``Provisioner``.

``build_service(config)`` wires the configured sites, the store and the shared work queue
(``topology.provisioner_spec()``; competing consumers, so several provisioners may run).
Handlers return once the intent is stored, so the runtime acks only then (rule 5); cloud
calls run on each site's own threads and publish through the thread-safe publisher. Timers
drive the poll loop, reconciliation and the outbox sweep; reconciliation also runs on start.
"""

from __future__ import annotations

from typing import Any

from libcloud.compute.base import NodeDriver

from common.clock import Clock, RealClock
from common.config import EpuConfig
from common.messages import Envelope, InstanceEvent, LaunchRequest, Message, TerminateRequest
from common.runtime import Reject, RuntimeSettings, Service
from services.provisioner.cloud import LibcloudSite, Site
from services.provisioner.drivers import make_driver
from services.provisioner.metrics import ProvisionerMetrics
from services.provisioner.provisioner import Provisioner, ProvisionerSettings
from services.provisioner.runner import CallObserver, RetryPolicy
from services.provisioner.store import Store
from services.provisioner.userdata import UserdataRenderer


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
    deployment = config.provisioner.deployment
    sites: dict[str, Site] = {}
    for name, site_cfg in config.sites.items():
        driver = (drivers or {}).get(name) or make_driver(name, site_cfg, clock=clock)
        sites[name] = LibcloudSite(name, site_cfg, driver, deployment)
    return sites


def build_provisioner(config: EpuConfig, publish: Any, *, clock: Clock | None = None,
                      drivers: dict[str, NodeDriver] | None = None, store: Store | None = None,
                      on_cloud_call: CallObserver | None = None) -> Provisioner:
    pc = config.provisioner
    sites = build_sites(config, clock=clock, drivers=drivers)
    renderers = {name: UserdataRenderer.from_path(s.userdata_template, s.userdata_max_bytes)
                 for name, s in config.sites.items()}
    settings = ProvisionerSettings(
        deployment=pc.deployment, orphan_grace_seconds=pc.orphan_grace_seconds,
        outbox_delay_seconds=pc.outbox_seconds,
        retry=RetryPolicy(attempts=pc.retry_attempts, initial=pc.retry_initial_seconds,
                          maximum=pc.retry_max_seconds),
    )
    return Provisioner(store or Store(pc.store_url), sites, publish, clock=clock, settings=settings,
                       renderers=renderers, on_cloud_call=on_cloud_call)


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

    prov = build_provisioner(config, publish, clock=clock, drivers=drivers, on_cloud_call=metrics.cloud_call)
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
    return service
