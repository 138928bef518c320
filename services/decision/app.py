"""``epu run decision``: the decision engine wired to the broker.

Consumes the single-active-consumer input queue (snapshots, instance events, command
results) and control queue (policy changes), and iterates every ``iteration_seconds``.
Handlers and the iteration timer run on the runtime's one thread, so they never race.
"""

from __future__ import annotations

import time

from prometheus_client import Counter, Gauge, Histogram

from common.clock import Clock
from common.config import EpuConfig
from common.runtime import RuntimeSettings, Service
from services.decision.engine import Engine
from services.decision.store import Store

INPUT_TYPES = {"sensor.snapshot", "instance.state", "node.result"}


def build_service(config: EpuConfig, *, clock: Clock | None = None) -> Service:
    broker = config.broker_obj()
    topo = broker.topology
    settings = RuntimeSettings(metrics_port=config.decision.metrics_port,
                               metrics_host=config.decision.metrics_host)
    service = Service("decision", broker, clock, settings)
    store = Store(config.decision.store_url).create()
    engine = Engine(config, store, service.publish, service.clock, publish_many=service.publish_many)
    settings.extra_health["active_domains"] = lambda: [d for d in engine.domains if engine.is_active(d)]
    service.consume(topo.decision_input_spec(), engine.handle_input, types=INPUT_TYPES)
    service.consume(topo.decision_control_spec(), engine.handle_control, types={"policy.change"}, prefetch=1)
    service.declare(topo.provisioner_spec())
    for domain in config.domains:
        service.declare(topo.sensor_spec(domain))
    r = service.metrics.registry
    actions = Counter("epu_decision_actions_total", "Actions sent by policy iterations", ["domain", "kind"],
                      registry=r)
    seconds = Histogram("epu_decision_iteration_seconds", "Time of one iteration over all domains", registry=r)
    active = Gauge("epu_decision_active_domains", "Domains this engine currently acts for (0 on a standby)",
                   registry=r)

    def iteration() -> None:
        started = time.monotonic()
        for record in engine.iterate():
            for a in record.actions:
                actions.labels(record.domain, a.kind).inc()
        seconds.observe(time.monotonic() - started)
        active.set(sum(1 for d in engine.domains if engine.is_active(d)))

    service.every(config.decision.iteration_seconds, iteration, name="iteration")
    service.engine = engine  # type: ignore[attr-defined]  # tests and the demo look inside
    return service
