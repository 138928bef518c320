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
