"""A scale-up on the simulated cloud over a real three-node RabbitMQ cluster (quorum queues
replicated on all three), losing one node and then another: no command lost, no duplicate
launch, every service reconnects within a measured bound, the scale-up completes.

The composition is the demo's (sensor, decision engine, provisioner, context broker, wired as in
production)
given the three node URLs. The first node is stopped while instances are being launched (every
service is connected to it: it is first in their lists), started again; once it is back in the
cluster the second node is killed (``kill -9``, a crash) and started again."""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from epu.common.runtime import Service
from epu.common.testing import wait_for

from epu.demo import Demo, DemoSettings
from tests.support.rabbitnodes import RabbitCluster

pytestmark = [pytest.mark.rabbitmq, pytest.mark.cluster]

#: A service must be serving again this soon after its node went away (measured: well under it).
RECONNECT_BOUND_SECONDS = 10.0


def services_of(demo: Demo) -> list[Service]:
    """Every runtime of the composition (the context broker wraps its own)."""
    return [s if isinstance(s, Service) else s.service for s in demo.services
            if isinstance(s, Service) or isinstance(getattr(s, "service", None), Service)]


def cloud_launch_ids(demo: Demo) -> Counter[str]:
    """Every VM the simulated clouds ever created, by the launch id tagged on it."""
    seen: Counter[str] = Counter()
    prov = next(s for s in demo.services if hasattr(s, "provisioner")).provisioner
    for site in prov.sites.values():
        with sqlite3.connect(site.driver.path) as db:
            for (tags,) in db.execute("SELECT tags FROM nodes"):
                seen[json.loads(tags).get("epu-launch-id", "?")] += 1
    return seen


def lose_node(cluster: RabbitCluster, index: int, demo: Demo, how: str) -> dict[str, float]:
    """Take node ``index`` away; return per service the seconds until it served again
    (services not connected to that node keep serving and are not listed)."""
    node = cluster.nodes[index]
    port = f":{node.port}/"
    affected = [s for s in services_of(demo) if port in s.broker.current_url]
    before = {s.name: s.reconnect_count for s in affected}
    t0 = time.monotonic()
    node.stop() if how == "stop" else node.kill()
    took: dict[str, float] = {}

    def back() -> bool:
        for s in affected:
            if s.name not in took and s.reconnect_count > before[s.name] and s.connected:
                took[s.name] = round(time.monotonic() - t0, 2)
        return len(took) == len(affected)

    wait_for(back, 60, message=f"services reconnected after node {index + 1} was lost ({how})")
    for s in affected:
        assert port not in s.broker.current_url, f"{s.name} failed over to another node"
    return took


def test_scale_up_survives_losing_nodes_one_after_another(rabbit_cluster: RabbitCluster, tmp_path: Path) -> None:
    cluster = rabbit_cluster
    vhost = f"failover-{uuid.uuid4().hex[:6]}"
    first = cluster.nodes[0]
    first.ctl("add_vhost", vhost)
    first.ctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
    settings = DemoSettings(jobs=36, job_seconds=10.0, cores_per_node=2, max_nodes=8, boot_seconds=2.0,
                            idle_seconds=1.0, stall_seconds=60.0, quota_a=4, timeout=240, seed=7,
                            with_ctxbroker=True, broker_url=cluster.urls(vhost), prefix="")
    demo = Demo(settings)
    reconnects: dict[str, dict[str, float]] = {}
    try:
        demo.start()
        prov = next(s for s in demo.services if hasattr(s, "provisioner")).provisioner
        for site in prov.sites.values():
            site.driver.client_tokens = False  # so a duplicate delivery would show as a second VM
        engine = next(s for s in demo.services if hasattr(s, "engine")).engine
        assert all(f":{first.port}/" in s.broker.current_url for s in services_of(demo))
        demo.submit_burst()
        # node 1 goes while the engine is launching (every service is connected to it)
        wait_for(lambda: len(engine.store.actions(kind="launch")) >= 2, 60, message="launches under way")
        reconnects["stop node 1"] = lose_node(cluster, 0, demo, "stop")
        first.start()
        cluster.wait_running(3)
        # then node 2 crashes, while instances are still being launched or run jobs
        reconnects["kill -9 node 2"] = lose_node(cluster, 1, demo, "kill")
        cluster.nodes[1].start()
        cluster.wait_running(3)

        def done() -> bool:
            live = prov.store.list(active_only=True)
            return demo.batch.completed == settings.jobs and not live and not demo.batch.node_names()

        wait_for(done, settings.timeout, interval=0.5, message="every job done and the cluster back to zero")
        demo.stop()
        launches = {a["action_id"] for a in engine.store.actions(kind="launch")}
        recorded = {r.instance_id for r in prov.store.list()}
        vms = cloud_launch_ids(demo)
    finally:
        demo.close()
    summary = {"launches": len(launches), "vms": sum(vms.values()), "reconnect_seconds": reconnects}
    print(json.dumps(summary))
    assert launches, "the scale-up launched instances"
    assert launches <= recorded, f"commands lost: {sorted(launches - recorded)}"
    assert all(n == 1 for n in vms.values()), f"duplicate launches: {[k for k, n in vms.items() if n > 1]}"
    assert set(vms) == recorded & set(vms) and len(vms) <= len(recorded)
    for event, took in reconnects.items():
        assert took, f"{event}: some service was connected to the lost node"
        assert max(took.values()) < RECONNECT_BOUND_SECONDS, (event, took)
