"""A pending VM still before its boot time is listed as the very Node it was last listed as
(``SimNodeDriver._node`` and ``list_nodes``' inline test), and that Node is the one a driver
that kept nothing builds — over random creates, destroys, notices, boot failures and time.
``test_cloud_listing`` checks every listing against a fresh look; this adds the identity."""

from __future__ import annotations

import random

import pytest
from libcloud.compute.base import NodeImage, NodeSize
from libcloud.compute.types import NodeState

from epu.sim.cloud import CloudFaults, SimCloud
from epu.sim.world import World


@pytest.mark.parametrize("seed", range(6))
def test_a_pending_node_before_its_boot_is_its_last_node(seed: int) -> None:
    rng = random.Random(seed)
    world = World(seed)
    cloud = SimCloud(world, "site", boot_seconds=(30.0, 300.0), terminated_linger=120.0,
                     faults=CloudFaults(boot_failure_rate=0.2))
    driver = cloud.driver("prov")
    size, image = NodeSize("m", "m", 0, 0, 0, 0, driver), NodeImage("sim-image", "sim-image", driver)
    previous: dict[str, object] = {}
    kept = 0
    for i in range(200):
        op = rng.random()
        live = [v for v in cloud.vms.values() if v.terminated_at is None]
        if op < 0.3:
            driver.create_node(f"n{i}", size, image, ex_metadata={"epu-launch": f"l{i}"}, ex_clienttoken=f"t{i}")
        elif op < 0.38 and live:
            cloud.destroy("prov", rng.choice(live).cloud_id)
        elif op < 0.42 and live:
            cloud._announce(rng.choice(live), world.t + 120.0)
        else:
            world.t += rng.choice((0.0, 1.0, 10.0, 30.0))
        nodes = driver.list_nodes()
        vms = {v.cloud_id: v for v in cloud.list("other")}
        for n in nodes:
            built = cloud.driver("other")._node(vms[n.id])
            assert (n.state, n.public_ips, n.private_ips, n.extra) == \
                   (built.state, built.public_ips, built.private_ips, built.extra)
            before = previous.get(n.id)
            if before is not None and n.state is NodeState.PENDING and before.state is NodeState.PENDING \
                    and before.extra == n.extra:
                assert n is before  # still pending, same notice: the very Node
                kept += 1
        previous = {n.id: n for n in nodes}
    assert kept > 50
