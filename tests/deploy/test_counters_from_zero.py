"""Issue 34, part 4: alerts see the first event. A labelled Prometheus counter exists only from its
first increment, and ``increase()`` reads a series born at 1 as no increase — the shipped
``EpuDeadLettersGrowing`` missed the first 3 dead letters of a queue. Every counter is exported
at 0 for each label set the service knows (its queues and timers, its domains, sites, catalogue
types and reasons) before anything happened; the rules' own unit tests (promtool) show the
difference on the series as the services now export them."""

from __future__ import annotations

import threading

import pytest
from epu.common.broker import Broker, Publisher
from epu.common.messages import Envelope, PolicyChange
from epu.common.retire import RetireReason
from epu.common.runtime import Reject, Service, run_in_thread
from epu.common.testing import wait_for
from prometheus_client import CollectorRegistry

from tests.decision.helpers import config, make_engine


def value(reg: CollectorRegistry, name: str, **labels: str) -> float | None:
    return reg.get_sample_value(name, labels)


@pytest.mark.rabbitmq
def test_a_consumed_queue_exports_its_dead_letters_at_0_before_the_first(broker: Broker) -> None:
    """On the real RabbitMQ: the control queue's counters are there at 0 once its consumer is up;
    three dead letters then read as an increase of 3, not 2."""
    svc = Service("decision", broker)
    spec = broker.topology.decision_control_spec()
    seen: list[str] = []
    lock = threading.Lock()

    def refuse(msg: PolicyChange, _env: Envelope) -> None:
        with lock:
            seen.append(msg.change_id)
        raise Reject("refused for the test")

    svc.consume(spec, refuse)
    svc.every(3600, lambda: None, name="tick")
    queue = broker.topology.kombu_queues(spec)[0].name
    thread = run_in_thread(svc)
    try:
        assert svc.wait_ready(15)
        reg = svc.metrics.registry
        wait_for(lambda: value(reg, "epu_messages_dead_lettered_total", queue=queue) is not None, 10,
                 message="the queue's dead-letter counter exported")
        assert value(reg, "epu_messages_dead_lettered_total", queue=queue) == 0
        assert value(reg, "epu_messages_refused_sender_total", queue=queue) == 0
        assert value(reg, "epu_messages_consumed_total", queue=queue, outcome="dead-lettered") == 0
        assert value(reg, "epu_handler_retries_total", queue=queue, kind="transient") == 0
        assert value(reg, "epu_timer_runs_total", task="tick", outcome="error") == 0
        assert value(reg, "epu_messages_published_total", type="policy.outcome") == 0
        pub = Publisher(broker, "test")
        try:
            for i in range(3):
                pub.publish(PolicyChange(change_id=f"c{i}", domain="alpha", min_nodes=1))
        finally:
            pub.close()
        wait_for(lambda: value(reg, "epu_messages_dead_lettered_total", queue=queue) == 3, 20,
                 message="three dead letters counted")
    finally:
        svc.stop()
        thread.join(15)


def test_the_engines_counters_start_at_0_for_its_domains(tmp_path) -> None:
    from epu.services.decision.app import build_service

    cfg = config(domains={"alpha": {"max_nodes": 4, "sites": ["s1"]}, "beta": {"max_nodes": 4, "sites": ["s2"]}},
                 store_url=f"sqlite:///{tmp_path / 'd.db'}")
    cfg = cfg.model_copy(update={"broker": cfg.broker.model_copy(update={"url": "memory://"})})
    svc = build_service(cfg)
    reg = svc.metrics.registry
    for domain in ("alpha", "beta"):
        assert value(reg, "epu_decision_stale_snapshots_total", domain=domain) == 0
        assert value(reg, "epu_decision_actions_total", domain=domain, kind="launch") == 0
        assert value(reg, "epu_decision_actions_total", domain=domain, kind="terminate") == 0
        assert value(reg, "epu_decision_budget_blocked", domain=domain) == 0


def test_the_fleet_counters_start_at_0_for_each_site_type_and_reason() -> None:
    from epu.services.decision.fleet_metrics import FleetCollector, FleetObserver

    from tests.decision.helpers import snapshot

    cfg = config(domains={"d": {"max_nodes": 4, "sites": ["s1", "t"]}},
                 sites={"s1": {"driver": "epu-sim", "quota": 5, "price_per_hour": 0.1, "size": "sim.2core"},
                        "t": {"driver": "epu-sim", "quota": 5,
                              "types": {"c4": {"cores": 4, "price_per_hour": 0.2},
                                        "g8": {"cores": 8, "gpus": 1, "price_per_hour": 3.0}}}})
    eng, _bus, clock = make_engine(cfg=cfg)
    reg = CollectorRegistry()
    fleet = FleetObserver(eng, clock.now, min_interval=0)
    reg.register(FleetCollector(fleet))
    eng.on_snapshot(snapshot(at=clock.now()))
    fleet.observe()
    for site, typ in (("s1", "sim.2core"), ("t", "c4"), ("t", "g8")):
        assert value(reg, "epu_decision_launches_total", domain="d", site=site, type=typ) == 0, (site, typ)
    for reason in RetireReason:
        assert value(reg, "epu_instances_retired_total", domain="d", reason=reason.value) == 0, reason


def test_the_provisioners_counters_start_at_0_for_each_site() -> None:
    from epu.services.provisioner.metrics import ProvisionerMetrics

    reg = CollectorRegistry()
    ProvisionerMetrics(reg).known_sites(["cloud-a", "cloud-b"])
    for site in ("cloud-a", "cloud-b"):
        assert value(reg, "epu_provisioner_transitions_total", site=site, state="failed") == 0
        assert value(reg, "epu_provisioner_failures_total", site=site, kind="capacity") == 0
        assert value(reg, "epu_provisioner_presence_changes_total", site=site, change="presumed_gone") == 0
        assert value(reg, "epu_provisioner_alerts_total", site=site, kind="orphan-sweep-refused") == 0
