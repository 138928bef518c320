"""The engine service on the real broker with a sensor whose clock is off (issue 26, defect 5):
a head node ten minutes slow is acted on, its skew is a metric; a snapshot nobody took within the
active window expires in the queue by the broker's clock, not the head node's."""

from __future__ import annotations

import time

import pytest
from epu.common.broker import Publisher
from epu.common.runtime import run_in_thread
from epu.common.testing import queue_depth, wait_for
from epu.common.topology import PROVISIONER_QUEUE
from epu.services.decision.app import build_service

from tests.decision.busutil import read_queue
from tests.decision.helpers import jobs, snapshot
from tests.decision.test_latest_snapshot import declare_only, make_config

pytestmark = pytest.mark.rabbitmq


def counted(seq: int, at: float, n: int):
    return snapshot(queued=jobs(n), at=at).model_copy(update={"incarnation": "head-1", "sequence": seq})


def test_a_head_node_ten_minutes_slow_is_acted_on_and_its_skew_shown(broker, tmp_path) -> None:
    cfg = make_config(broker, tmp_path, window=180.0)
    service = build_service(cfg)
    t = run_in_thread(service)
    pub = Publisher(broker, "sensor")
    try:
        assert service.wait_ready(15)
        published = time.time()
        pub.publish(counted(1, published - 600, 3))
        wait_for(lambda: len(read_queue(broker, PROVISIONER_QUEUE)) >= 3, 15, message="launches")
        delivered_within = time.time() - published  # skew = taken - received: -600 less the delivery time
        assert service.health()["domains"] == {"d": "active"}
        # the metrics are read after the iteration that published the launches: wait for them
        def read_skew() -> float | None:
            return service.metrics.registry.get_sample_value("epu_decision_sensor_clock_skew_seconds",
                                                             {"domain": "d"})
        wait_for(lambda: read_skew() is not None, 15, message="the skew gauge")
        skew = read_skew()
        assert skew is not None and -600 - delivered_within <= skew <= -600 + 0.01
        stale = service.metrics.registry.get_sample_value("epu_decision_stale_snapshots_total", {"domain": "d"})
        assert not stale
    finally:
        service.stop()
        t.join(15)
        pub.close()


def test_a_snapshot_nobody_took_expires_in_the_queue_by_the_brokers_clock(broker, tmp_path) -> None:
    """The sensor publishes snapshots with the active window as their TTL: one left while no
    engine ran is gone when an engine comes, whatever the head node's clock said."""
    from epu.common.config import parse_config
    from epu.services.sensor.app import build_service as build_sensor

    cfg = make_config(broker, tmp_path, window=1.0)
    declare_only(broker, cfg)
    sensor_cfg = parse_config({
        "broker": {"url": broker.url, "prefix": broker.topology.prefix},
        "decision": {"active_window_seconds": 1.0},
        "sensor": {"domain": "d", "backend": "simulated", "poll_seconds": 3600},
    }, environ={})
    sensor = build_sensor(sensor_cfg)
    assert sensor.publisher.expire_after == {"sensor.snapshot": 1.0}
    sensor.publisher.publish(counted(1, time.time() + 3600, 4))  # as its poll would, with the clock far ahead
    sensor.publisher.close()
    q = broker.topology.n("epu.decision.snapshot.d")
    wait_for(lambda: queue_depth(broker, q) == 0, 15, interval=0.2, message="the snapshot expired in the queue")
    assert queue_depth(broker, broker.topology.n("epu.dead")) == 0, "a replaced value, not a failure"
