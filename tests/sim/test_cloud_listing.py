"""The simulated cloud's kept listing is exact: over random creates, destroys, vanishings,
preemptions, reclaim notices, boot failures, listing lag and time, every listing shows exactly
the VMs a fresh look at the cloud shows, in creation order, each in its state at that time, and
a running, boot-failed or terminated VM as the very Node it was last listed as (what the provisioner keys
its steady polls on). The listing is what reconcile and the orphan sweep read: a kept one that
missed a VM, or showed a terminated VM as running, would be a safety bug."""

from __future__ import annotations

import random

import pytest
from libcloud.compute.base import NodeImage, NodeSize
from libcloud.compute.types import NodeState

from epu.sim.cloud import VM, CloudFaults, SimCloud, SimNodeDriver
from epu.sim.world import World


def fresh(cloud: SimCloud, now: float) -> list[VM]:
    """What a listing shows at ``now``, from every VM the cloud still knows (nothing kept)."""
    linger = cloud.terminated_linger
    return [v for v in cloud.vms.values()
            if v.listed_from <= now and (v.terminated_at is None or not v.terminated_at <= now - linger)]


def random_step(rng: random.Random, cloud: SimCloud, driver: SimNodeDriver, i: int, tags: dict[str, str]) -> None:
    """One random change of the cloud: a create (with ``tags``), a destroy, a VM vanishing or
    preempted, a reclaim notice, or time passing (also used by ``test_node_memo.py``)."""
    op = rng.random()
    live = [v for v in cloud.vms.values() if v.terminated_at is None]
    if op < 0.2:
        size, image = NodeSize("m", "m", 0, 0, 0, 0, driver), NodeImage("sim-image", "sim-image", driver)
        driver.create_node(f"n{i}", size, image, ex_metadata=tags, ex_clienttoken=f"t{i}")
    elif op < 0.28 and live:
        cloud.destroy("prov", rng.choice(live).cloud_id)
    elif op < 0.32 and live:
        cloud._accident(rng.choice(live), rng.choice(("vanish", "preempt")))
    elif op < 0.36 and live:
        cloud._announce(rng.choice(live), cloud.world.t + 120.0)
    elif op < 0.75:
        cloud.world.t += rng.choice((0.0, 1.0, 10.0, 30.0, 60.0, 200.0))


def state(vm: VM, now: float) -> NodeState:
    if vm.terminated_at is not None:
        return NodeState.TERMINATED
    if vm.boot_fails and now >= vm.boot_at:
        return NodeState.ERROR
    return NodeState.PENDING if now < vm.boot_at else NodeState.RUNNING


@pytest.mark.parametrize("seed", range(6))
def test_a_kept_listing_is_what_a_fresh_look_shows(seed: int) -> None:
    rng = random.Random(seed)
    world = World(seed)
    cloud = SimCloud(world, "site", boot_seconds=(30.0, 120.0), terminated_linger=120.0,
                     faults=CloudFaults(listing_lag_seconds=40.0, boot_failure_rate=0.15))
    driver = cloud.driver("prov")
    steady_hits = unchanged_hits = 0
    last = None
    for i in range(300):
        random_step(rng, cloud, driver, i, {"epu-launch": f"l{i}"})
        before = driver._steady
        said = driver.listing_unchanged(last) if last is not None else False
        lists = cloud.stats.lists
        nodes = driver.list_nodes()
        if said:  # "would answer these very Nodes again": it does
            unchanged_hits += 1
            assert len(nodes) == len(last) and all(a is b for a, b in zip(nodes, last, strict=True))
            assert cloud.stats.lists == lists + 1
        last = nodes
        vms = fresh(cloud, world.t)
        assert [n.id for n in nodes] == [v.cloud_id for v in vms]
        assert [n.state for n in nodes] == [state(v, world.t) for v in vms]
        assert [n.extra.get("interruption_at") for n in nodes] == \
               [v.interruption_at if v.terminated_at is None else None for v in vms]
        if before is not None and before[0] == cloud.version and before[1] == vms:
            steady_hits += 1
        for v, n in zip(vms, nodes, strict=True):
            if n.state is not NodeState.PENDING:
                assert driver._node(v) is n  # the very Node the uncached path hands out
            built = cloud.driver("other")._node(v)  # a Node built from nothing kept
            assert (n.id, n.name, n.state, n.public_ips, n.private_ips, n.extra, n.created_at) == \
                   (built.id, built.name, built.state, built.public_ips, built.private_ips, built.extra,
                    built.created_at)
        assert len(driver._listed) <= 2 * len(cloud._current) + 64  # Nodes of VMs no longer listed are dropped
    assert steady_hits > 20 and unchanged_hits > 10
    driver._prune()
    assert set(driver._listed) <= set(cloud._current) and len(cloud.vms) > len(cloud._current)
