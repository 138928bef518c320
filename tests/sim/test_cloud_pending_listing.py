"""The simulated driver's kept listing with pending nodes in it is exact: ``list_nodes`` and
``listing_unchanged`` reuse the last listing while no pending node is due to boot (the earliest
``boot_at`` of them), so over random creates, destroys, reclaim notices, boot failures, never
booting nodes and time steps that land before, on and after boot times, every answer is what a
driver that kept nothing builds, each node the very Node ``_node`` hands out, and a listing said
unchanged is those very Nodes. A pending node shown past its boot would hold its record
``pending`` (the engine would wait for a node that runs)."""

from __future__ import annotations

import random

import pytest
from libcloud.compute.base import NodeImage, NodeSize
from libcloud.compute.types import NodeState

from epu.sim.cloud import CloudFaults, SimCloud
from epu.sim.world import World


def _fields(n):  # type: ignore[no-untyped-def]
    return (n.id, n.name, n.state, n.public_ips, n.private_ips, n.extra, n.created_at)


@pytest.mark.parametrize("seed", range(6))
def test_a_listing_kept_over_pending_nodes_is_a_fresh_one(seed: int) -> None:
    rng = random.Random(seed)
    world = World(seed)
    cloud = SimCloud(world, "site", boot_seconds=(20.0, 60.0), terminated_linger=90.0,
                     faults=CloudFaults(boot_failure_rate=0.15, never_boot_rate=0.05))
    driver = cloud.driver("prov")
    size, image = NodeSize("m", "m", 0, 0, 0, 0, driver), NodeImage("sim-image", "sim-image", driver)
    last: list | None = None
    kept = pending_kept = 0
    for i in range(400):
        op = rng.random()
        live = [v for v in cloud.vms.values() if v.terminated_at is None]
        booting = [v for v in live if v.boot_at > world.t and v.boot_at != float("inf")]
        if op < 0.15:
            driver.create_node(f"n{i}", size, image, ex_metadata={"epu-launch": f"l{i}"}, ex_clienttoken=f"t{i}")
        elif op < 0.2 and live:
            cloud.destroy("prov", rng.choice(live).cloud_id)
        elif op < 0.23 and live:
            cloud._announce(rng.choice(live), world.t + 120.0)
        elif op < 0.45 and booting:  # land just before, on or just after a boot time
            at = rng.choice(booting).boot_at
            world.t = max(world.t, at + rng.choice((-1e-9, 0.0, 0.0, 1e-9)))
        elif op < 0.8:
            world.t += rng.choice((0.0, 0.0, 1.0, 5.0, 15.0, 40.0))
        said = driver.listing_unchanged(last) if last is not None else False
        before = driver._steady
        lists = cloud.stats.lists
        nodes = driver.list_nodes()
        if said:
            assert last is not None and len(nodes) == len(last) and all(a is b for a, b in zip(nodes, last, strict=True))
            assert cloud.stats.lists == lists + 1
        if before is not None and len(before[2]) == len(nodes) and all(a is b for a, b in zip(before[2], nodes, strict=True)):
            kept += 1
            pending_kept += any(n.state is NodeState.PENDING for n in nodes)
        fresh = cloud.driver("fresh").list_nodes()
        assert [_fields(n) for n in nodes] == [_fields(n) for n in fresh]
        for n in nodes:
            assert driver._node(cloud.vms[n.id]) is n
        last = nodes
    assert kept > 30 and pending_kept > 10
