"""The service on kombu's in-memory transport (what the single-process demo uses)."""

from __future__ import annotations

from epu.common.broker import Publisher
from epu.common.config import parse_config
from epu.common.runtime import run_in_thread
from epu.common.testing import wait_for
from epu.common.topology import PROVISIONER_QUEUE
from epu.services.decision.app import build_service

from tests.decision.busutil import read_queue
from tests.decision.helpers import jobs, snapshot


def test_launches_over_memory_transport(memory_broker, prefix):
    cfg = parse_config({
        "broker": {"url": "memory://", "prefix": prefix, "quorum": False},
        "decision": {"store_url": "sqlite://", "iteration_seconds": 0.05},
        "domains": {"d": {"max_nodes": 4, "sites": ["s1"]}},
        "sites": {"s1": {"driver": "epu-sim"}},
    }, environ={})
    service = build_service(cfg)
    thread = run_in_thread(service)
    pub = Publisher(memory_broker, source="test")
    try:
        assert service.wait_ready(10)
        pub.publish(snapshot(queued=jobs(6), at=service.clock.now()))
        got: list = []
        wait_for(lambda: got.extend(read_queue(memory_broker, PROVISIONER_QUEUE)) or len(got) >= 4, 10,
                 message="4 launches (max_nodes)")
        assert {m.site for m in got} == {"s1"} and len({m.launch_id for m in got}) == 4
    finally:
        service.stop()
        thread.join(10)
        pub.close()


def test_observe_mode_has_its_own_metrics_and_a_mode_gauge(memory_broker, prefix):
    """Issue 34: in observe mode ``epu_decision_launches_total`` reached 2,473 against 13 real
    launches (every iteration's shadow counted), and no gauge showed the mode. Now a shadow plan
    is counted once per change under its own name, the real counters stay at what was sent, and
    ``epu_decision_domain_mode`` says which mode each domain is in."""
    cfg = parse_config({
        "broker": {"url": "memory://", "prefix": prefix, "quorum": False},
        "decision": {"store_url": "sqlite://", "iteration_seconds": 0.05},
        "domains": {"d": {"max_nodes": 4, "sites": ["s1"], "mode": "observe"}},
        "sites": {"s1": {"driver": "epu-sim"}},
    }, environ={})
    service = build_service(cfg)
    thread = run_in_thread(service)
    pub = Publisher(memory_broker, source="test")

    def value(name: str, **labels: str) -> float:
        total = 0.0
        for fam in service.metrics.registry.collect():
            for s in fam.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    total += s.value
        return total

    try:
        assert service.wait_ready(10)
        pub.publish(snapshot(queued=jobs(3), at=service.clock.now()))
        wait_for(lambda: value("epu_decision_shadow_actions_total", domain="d", kind="launch") == 3, 10,
                 message="the shadow plan counted")
        iterations = service.engine.iterations
        wait_for(lambda: service.engine.iterations > iterations + 20, 10, message="20 more iterations")
        assert value("epu_decision_shadow_actions_total", domain="d", kind="launch") == 3  # once, not per iteration
        assert value("epu_decision_actions_total", domain="d") == 0
        assert value("epu_decision_launches_total", domain="d") == 0
        assert value("epu_decision_domain_mode", domain="d", mode="observe") == 1
        assert value("epu_decision_domain_mode", domain="d", mode="act") == 0
        assert read_queue(memory_broker, PROVISIONER_QUEUE) == []
    finally:
        service.stop()
        thread.join(10)
        pub.close()
