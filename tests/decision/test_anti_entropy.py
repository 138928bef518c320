"""Anti-entropy over the real broker: the provisioner's periodic ``instance.report`` repairs the
engine's instance table after an ``instance.state`` event was lost."""

from __future__ import annotations

import pytest
from epu.common.config import parse_config
from epu.common.messages import LaunchRequest
from epu.common.runtime import Service, run_in_thread
from epu.common.testing import wait_for
from epu.services.decision.app import build_service
from epu.services.provisioner.app import publish_reports
from epu.services.provisioner.store import Store

pytestmark = pytest.mark.rabbitmq


def test_a_lost_event_is_repaired_by_the_next_report(broker, tmp_path) -> None:
    cfg = parse_config({
        "broker": {"url": broker.url, "prefix": broker.topology.prefix},
        "decision": {"store_url": f"sqlite:///{tmp_path / 'decision.db'}", "iteration_seconds": 0.5},
        "domains": {"d": {"max_nodes": 4, "sites": ["s1"]}},
        "sites": {"s1": {"driver": "epu-sim", "quota": 10}},
    }, environ={})
    engine_service = build_service(cfg)
    t = run_in_thread(engine_service)
    # the provisioner knows two instances whose events never reached the engine
    pstore = Store(f"sqlite:///{tmp_path / 'prov.db'}")
    for i in (1, 2):
        pstore.record_launch(LaunchRequest(launch_id=f"i{i}", domain="d", site="s1", node_name=f"w{i}"), 100.0)
    pstore.advance("i1", "pending", 101.0)
    pstore.advance("i1", "started", 102.0, cloud_id="c-1", ip="10.0.0.1")
    pstore.advance("i2", "failed", 103.0, reason="boot failed", error_kind="permanent")
    prov = Service("provisioner", broker)
    try:
        assert engine_service.wait_ready(15)
        assert engine_service.engine.store.instance("i1") is None
        assert publish_reports(prov, pstore, horizon=3600.0) == 1
        store = engine_service.engine.store
        wait_for(lambda: store.instance("i1") and store.instance("i1").state == "started", 10,
                 message="i1 adopted as started")
        assert store.instance("i1").ip == "10.0.0.1"
        assert store.instance("i2") is None, "a failed instance the engine never knew needs no row"
        assert store.site_health() == {} or not any(h.failures for h in store.site_health().values()), \
            "a report repairs; it does not back a site off"
    finally:
        engine_service.stop()
        t.join(15)
        prov.publisher.close()
        pstore.close()
