"""The simulator's listing conversion (``NodeMemo``: the CloudNode made from the very same Node
object handed out again) equals the service's plain conversion (``to_cloud_nodes``), listing for
listing, over random creates, destroys, vanishings, preemptions, reclaim notices, boot failures,
listing lag, partial listings, wrong-state episodes and time, with the memo emptied on the way.
A memoized conversion that missed a change would let the simulator judge a listing the service
never sees."""

from __future__ import annotations

import random

import pytest
from epu.services.provisioner.cloud import TAG_DEPLOYMENT, LibcloudSite, to_cloud_node, to_cloud_nodes
from libcloud.compute.base import NodeImage, NodeSize

from epu.sim import node_memo
from epu.sim.cloud import CloudFaults, SimCloud
from epu.sim.node_memo import NodeMemo
from epu.sim.world import World
from tests.provisioner.conftest import site_config
from tests.sim.test_cloud_listing import random_step


@pytest.mark.parametrize("seed", range(6))
def test_a_memoized_listing_is_the_plain_conversion(seed: int, monkeypatch) -> None:
    monkeypatch.setattr(node_memo, "MIN_CLEAR", 64)  # emptied often
    rng = random.Random(seed)
    world = World(seed)
    cloud = SimCloud(world, "site", boot_seconds=(30.0, 120.0), terminated_linger=120.0,
                     faults=CloudFaults(listing_lag_seconds=40.0, boot_failure_rate=0.15,
                                        partial_listing_rate=0.1, wrong_state_rate=0.05))
    driver = cloud.driver("prov")
    memo = NodeMemo()
    site = LibcloudSite("site", site_config(), driver, "epu", convert=memo)
    site.bind("epu", "store")
    listed = 0
    for i in range(300):
        whose = rng.choice(("epu", "epu", "someone-else"))
        random_step(rng, cloud, driver, i, {TAG_DEPLOYMENT: whose, "epu-launch-id": f"l{i}"})
        nodes = driver.list_nodes()
        memoized = memo(nodes)
        assert memoized == to_cloud_nodes(nodes)
        assert memoized == [to_cloud_node(n) for n in nodes]
        answer = site.nodes()  # the service's own filter on the memoized conversion
        assert answer == [n for n in to_cloud_nodes(driver.last_answer) if n.tags.get(TAG_DEPLOYMENT) == "epu"]
        listed += len(nodes) + len(driver.last_answer)
    assert memo.converted < listed / 2  # the memo did hand out kept conversions


def test_the_memo_converts_a_node_again_only_when_it_is_another_object() -> None:
    world = World(1)
    cloud = SimCloud(world, "site", boot_seconds=(30.0, 30.0))
    driver = cloud.driver("prov")
    driver.create_node("n1", NodeSize("m", "m", 0, 0, 0, 0, driver), NodeImage("sim-image", "sim-image", driver),
                       ex_metadata={TAG_DEPLOYMENT: "epu"}, ex_clienttoken="t1")
    memo = NodeMemo()
    (pending,) = driver.list_nodes()
    first = memo([pending])
    assert memo([pending])[0] is first[0] and memo.converted == 1
    world.t += 60.0  # booted: the driver hands out a new Node
    (running,) = driver.list_nodes()
    assert running is not pending
    assert memo([running]) == [to_cloud_node(running)] and memo.converted == 2
    assert memo([running])[0].state == "started"
