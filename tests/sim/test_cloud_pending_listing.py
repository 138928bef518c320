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


def _world_ops(seed: int):  # type: ignore[no-untyped-def]
    """A site on a simulated cloud and a step that applies one random operation to it."""
    from epu.services.provisioner.cloud import TAG_DEPLOYMENT, LibcloudSite

    from tests.provisioner.conftest import site_config

    world = World(seed)
    cloud = SimCloud(world, "site", boot_seconds=(20.0, 60.0), terminated_linger=90.0,
                     faults=CloudFaults(boot_failure_rate=0.15, listing_lag_seconds=20.0))
    driver = cloud.driver("prov")
    site = LibcloudSite("site", site_config(), driver, "epu")
    site.bind("epu", "store")
    size, image = NodeSize("m", "m", 0, 0, 0, 0, driver), NodeImage("sim-image", "sim-image", driver)

    def step(rng: random.Random, i: int) -> None:
        op = rng.random()
        live = [v for v in cloud.vms.values() if v.terminated_at is None]
        if op < 0.12:
            driver.create_node(f"n{i}", size, image, ex_metadata={TAG_DEPLOYMENT: "epu", "epu-launch-id": f"l{i}"},
                               ex_clienttoken=f"t{i}")
        elif op < 0.16 and live:
            cloud.destroy("prov", rng.choice(live).cloud_id)
        elif op < 0.18 and live:
            cloud._announce(rng.choice(live), world.t + 120.0)
        elif op < 0.6:
            world.t += rng.choice((0.0, 1.0, 5.0, 15.0, 40.0))

    return cloud, site, step


@pytest.mark.parametrize("seed", range(6))
def test_unchanged_asked_with_the_same_tuple_answers_as_with_a_fresh_copy(seed: int) -> None:
    """``SimNodeDriver.listing_unchanged`` remembers the tuple it last found to be its very answer
    (``SameObjects``): two identical worlds, one asking with the kept tuple, the other with a
    fresh list (nothing remembered), get the same answers, count the same list calls and list the
    same Nodes, step by step."""
    (c1, s1, step1), (c2, s2, step2) = _world_ops(seed), _world_ops(seed)
    r1, r2, ask = random.Random(seed), random.Random(seed), random.Random(seed + 100)
    drv_kept: tuple = ()
    drv_kept2: tuple = ()
    said = 0
    for i in range(500):
        step1(r1, i)
        step2(r2, i)
        for _ in range(ask.choice((0, 0, 1, 2, 3))):  # asked (maybe several times) before listing
            d1, d2 = s1.driver.listing_unchanged(drv_kept), s2.driver.listing_unchanged(list(drv_kept2))
            assert d1 == d2
            said += d1
        n1, n2 = s1.nodes(), s2.nodes()
        assert [(n.cloud_id, n.state, n.ip, n.interruption_at) for n in n1] == \
               [(n.cloud_id, n.state, n.ip, n.interruption_at) for n in n2]
        assert c1.stats.lists == c2.stats.lists
        if ask.random() < 0.7 or not drv_kept:  # the driver's Nodes the site last listed (a tuple)
            last1, last2 = s1.driver.last_answer, s2.driver.last_answer
            drv_kept, drv_kept2 = (last1, last2) if last1 is not None and last2 is not None else ((), ())
    assert said > 20


@pytest.mark.parametrize("seed", range(4))
def test_a_listing_after_launches_is_a_fresh_conversion(seed: int) -> None:
    """Over launches, terminates and time steps, every listing of the site equals a fresh
    conversion of a fresh driver's listing, and a node listed right after its launch equals
    the CloudNode the launch answered while it boots."""
    from epu.services.provisioner.cloud import TAG_DEPLOYMENT, LaunchSpec, LibcloudSite, to_cloud_node

    from tests.provisioner.conftest import site_config

    rng = random.Random(seed)
    world = World(seed)
    cloud = SimCloud(world, "site", boot_seconds=(20.0, 60.0), terminated_linger=90.0,
                     faults=CloudFaults(boot_failure_rate=0.1, listing_lag_seconds=rng.choice((0.0, 15.0))))
    site = LibcloudSite("site", site_config(), cloud.driver("prov"), "epu")
    site.bind("epu", "store")
    answered: dict[str, object] = {}
    same = 0
    for i in range(300):
        op = rng.random()
        live = [v for v in cloud.vms.values() if v.terminated_at is None]
        if op < 0.25:
            for _ in range(rng.randint(1, 3)):
                cn = site.launch(LaunchSpec(launch_id=f"l{i}-{_}", node_name=f"n{i}", domain="d"))
                answered[cn.cloud_id] = cn
        elif op < 0.32 and live:
            site.terminate(rng.choice(live).cloud_id)
        elif op < 0.7:
            world.t += rng.choice((0.0, 1.0, 5.0, 15.0, 40.0))
        if rng.random() < 0.6:
            answer = site.nodes()
            fresh = [to_cloud_node(n) for n in cloud.driver("fresh").list_nodes()]
            assert answer == [n for n in fresh if n.tags.get(TAG_DEPLOYMENT) == "epu"]
            same += sum(answered.get(n.cloud_id) == n for n in answer if n.state == "pending")
    assert same > 20
