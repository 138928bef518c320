"""Snapshots are latest-value messages: a domain's snapshot queue holds only the newest (a new one
drops the old, without dead-lettering it), an engine that was away never works through a
backlog, and after a restart it does not act on a snapshot that is too old. On the real broker."""

from __future__ import annotations

import time

import pytest
from epu.common.broker import Publisher
from epu.common.config import parse_config
from epu.common.runtime import Service, run_in_thread
from epu.common.testing import queue_depth, wait_for
from epu.common.topology import PROVISIONER_QUEUE
from epu.services.decision.app import build_service

from tests.decision.busutil import read_queue
from tests.decision.helpers import jobs, snapshot

pytestmark = pytest.mark.rabbitmq


def make_config(broker, tmp_path, window: float = 30.0):
    return parse_config({
        "broker": {"url": broker.url, "prefix": broker.topology.prefix},
        "decision": {"store_url": f"sqlite:///{tmp_path / 'decision.db'}", "iteration_seconds": 0.2,
                     "active_window_seconds": window},
        "domains": {"d": {"max_nodes": 20, "sites": ["s1"]}},
        "sites": {"s1": {"driver": "epu-sim", "quota": 50}},
    }, environ={})


def declare_only(broker, cfg) -> None:
    """The queues exist (as the definitions would make them) while no engine runs."""
    svc = Service("declarer", broker)
    svc.declare(broker.topology.decision_snapshot_spec("d"))
    svc.declare(broker.topology.provisioner_spec())
    t = run_in_thread(svc)
    assert svc.wait_ready(15)
    svc.stop()
    t.join(10)


def test_an_engine_that_was_away_gets_only_the_newest_snapshot(broker, tmp_path) -> None:
    cfg = make_config(broker, tmp_path)
    declare_only(broker, cfg)
    pub = Publisher(broker, "sensor")
    try:
        now = time.time()
        for i in range(50):  # a sensor kept publishing while no engine ran
            pub.publish(snapshot(queued=jobs(i + 1), at=now))
        assert queue_depth(broker, broker.topology.n("epu.decision.snapshot.d")) == 1
        assert queue_depth(broker, broker.topology.n("epu.dead")) == 0
        service = build_service(cfg)
        seen: list[int] = []
        original = service.engine.on_snapshot
        service.engine.on_snapshot = lambda s: (seen.append(len(s.queued_demand())), original(s))[1]
        t = run_in_thread(service)
        try:
            assert service.wait_ready(15)
            got: set[str] = set()
            wait_for(lambda: got.update(m.launch_id for m in read_queue(broker, PROVISIONER_QUEUE))
                     or len(got) >= 20, 20, message="launches for the newest demand")
        finally:
            service.stop()
            t.join(15)
    finally:
        pub.close()
    assert seen[:1] == [50], f"the first (and only) snapshot handed over was the newest: {seen[:5]}"


def test_after_a_restart_an_old_snapshot_is_not_acted_on(broker, tmp_path) -> None:
    cfg = make_config(broker, tmp_path, window=5.0)
    declare_only(broker, cfg)
    pub = Publisher(broker, "sensor")
    try:
        pub.publish(snapshot(queued=jobs(4), at=time.time() - 60))  # left behind a minute ago
        service = build_service(cfg)
        t = run_in_thread(service)
        try:
            assert service.wait_ready(15)
            wait_for(lambda: service.metrics.registry.get_sample_value(
                "epu_decision_stale_snapshots_total", {"domain": "d"}) == 1, 10, message="the stale one counted")
            def iterations() -> float:
                return service.metrics.registry.get_sample_value(
                    "epu_timer_runs_total", {"task": "iteration", "outcome": "ok"}) or 0.0

            seen = iterations()
            wait_for(lambda: iterations() >= seen + 3, 10, message="three iterations after the stale snapshot")
            assert read_queue(broker, PROVISIONER_QUEUE) == []
            assert service.health()["domains"] == {"d": "standby"}
            pub.publish(snapshot(queued=jobs(2), at=time.time()))  # a fresh one: now it acts
            wait_for(lambda: len(read_queue(broker, PROVISIONER_QUEUE)) >= 2, 10, message="launches")
            assert service.health()["domains"] == {"d": "active"}
        finally:
            service.stop()
            t.join(15)
    finally:
        pub.close()


def test_operator_metrics_of_the_engine(broker, tmp_path) -> None:
    import urllib.request

    cfg = make_config(broker, tmp_path)
    cfg = cfg.model_copy(update={"decision": cfg.decision.model_copy(update={"metrics_port": 0})})
    service = build_service(cfg)
    t = run_in_thread(service)
    pub = Publisher(broker, "sensor")
    try:
        assert service.wait_ready(15)
        pub.publish(snapshot(queued=jobs(3), at=time.time()))
        port = service._health_server.port
        wait_for(lambda: 'epu_decision_queued_demand_jobs{domain="d"} 3.0' in urllib.request.urlopen(
            f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode(), 10, message="demand metric")
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert 'epu_decision_sensor_available{domain="d"} 1.0' in text
        assert 'epu_decision_leadership{domain="d",state="active"} 1.0' in text
        assert 'epu_decision_snapshot_age_seconds{domain="d"}' in text
        assert 'epu_consumer_up{queue="' in text and "epu_broker_reconnects_total" in text
    finally:
        service.stop()
        t.join(15)
        pub.close()


def test_upgrading_removes_the_old_snapshot_binding_of_the_input_queue(broker) -> None:
    """Before the latest-value queues the engine's input queue was bound to every snapshot; a
    durable binding outlives that code. Declaring the topology now unbinds it, so after an
    upgrade snapshots reach the latest-value queue only."""
    from epu.common.topology import DECISION_INPUT_QUEUE
    from kombu import Queue

    topo = broker.topology
    spec = topo.decision_input_spec()
    with broker.connection() as conn:
        channel = conn.channel()
        topo.declare(channel, [])
        old = Queue(topo.n(DECISION_INPUT_QUEUE), exchange=topo.events_exchange, routing_key="sensor.snapshot.*",
                    durable=True, queue_arguments=topo.kombu_queues(spec)[0].queue_arguments)
        old(channel).declare()  # what an earlier version left behind
        topo.declare(channel, [spec, topo.decision_snapshot_spec("d")])
    pub = Publisher(broker, source="sensor-test")
    try:
        pub.publish(snapshot(queued=jobs(1), at=time.time()))
    finally:
        pub.close()
    wait_for(lambda: queue_depth(broker, topo.n(topo.decision_snapshot_spec("d").name)) == 1, 10,
             message="the snapshot in its latest-value queue")
    assert queue_depth(broker, topo.n(DECISION_INPUT_QUEUE)) == 0, "the old binding is gone"


def test_the_unsatisfiable_jobs_gauge(broker, tmp_path) -> None:
    """``epu_decision_unsatisfiable_jobs{domain,constraint}``: the jobs no type of a catalogue
    domain can serve, by what rules them out; the series goes when the jobs do."""
    import urllib.request

    from epu.common.messages import JobShape, SensorSnapshot

    cfg = parse_config({
        "broker": {"url": broker.url, "prefix": broker.topology.prefix},
        "decision": {"store_url": f"sqlite:///{tmp_path / 'decision.db'}", "iteration_seconds": 0.2,
                     "active_window_seconds": 30.0, "metrics_port": 0},
        "domains": {"d": {"max_nodes": 20, "sites": ["s1"]}},
        "sites": {"s1": {"driver": "epu-sim", "quota": 50, "types": {"c4": {"cores": 4, "memory_mb": 8000}}}},
    }, environ={})
    service = build_service(cfg)
    t = run_in_thread(service)
    pub = Publisher(broker, "sensor")

    def metrics() -> str:
        return urllib.request.urlopen(f"http://127.0.0.1:{service._health_server.port}/metrics",
                                      timeout=5).read().decode()

    def publish(*shapes: JobShape) -> None:
        pub.publish(SensorSnapshot(domain="d", backend="test", taken_at=time.time(), shapes=list(shapes)))

    try:
        assert service.wait_ready(15)
        publish(JobShape(count=3, cores=64), JobShape(count=2, memory_mb=100_000))
        wait_for(lambda: 'epu_decision_unsatisfiable_jobs{constraint="cores",domain="d"} 3.0' in metrics(), 30,
                 message="unsatisfiable gauge")
        assert 'epu_decision_unsatisfiable_jobs{constraint="memory",domain="d"} 2.0' in metrics()
        publish(JobShape(count=1))
        wait_for(lambda: "epu_decision_unsatisfiable_jobs{" not in metrics(), 30, message="the series gone")
    finally:
        service.stop()
        t.join(15)
        pub.close()
