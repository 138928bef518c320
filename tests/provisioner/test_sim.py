"""The simulated cloud is a real libcloud NodeDriver with knobs; its state is shared via SQLite."""

from __future__ import annotations

import pytest
from epu.common.clock import ManualClock
from epu.services.provisioner.errors import classify
from epu.services.provisioner.sim import SimulatedNodeDriver
from libcloud.compute.base import NodeDriver, NodeImage
from libcloud.compute.types import NodeState


def create(d: SimulatedNodeDriver, name: str = "w1", **kw: object):
    return d.create_node(name, d.list_sizes()[0], d.list_images()[0], **kw)


def test_is_a_libcloud_driver_with_boot_times(cloud: SimulatedNodeDriver, clock: ManualClock) -> None:
    assert isinstance(cloud, NodeDriver)
    n = create(cloud, ex_metadata={"epu-launch-id": "l1"})
    assert n.state == NodeState.PENDING and n.extra["tags"] == {"epu-launch-id": "l1"}
    clock.advance(25)
    [listed] = cloud.list_nodes()
    assert listed.state == NodeState.RUNNING and listed.public_ips
    cloud.destroy_node(listed)
    assert cloud.list_nodes()[0].state == NodeState.TERMINATED
    clock.advance(61)
    assert cloud.list_nodes() == []


def test_client_token_dedupes_and_state_is_shared(tmp_path, clock: ManualClock) -> None:
    path = str(tmp_path / "c.db")
    a = SimulatedNodeDriver(path=path, clock=clock)
    b = SimulatedNodeDriver(path=path, clock=clock)
    n1 = create(a, ex_clienttoken="tok")
    n2 = create(b, ex_clienttoken="tok")
    assert n1.id == n2.id
    assert [n.id for n in b.list_nodes()] == [n1.id]


def test_quota_capacity_errors_and_bad_image(cloud: SimulatedNodeDriver) -> None:
    cloud.set_knobs(quota=1)
    create(cloud)
    with pytest.raises(Exception) as exc:
        create(cloud, name="w2")
    assert classify(exc.value) == "capacity" and "InstanceLimitExceeded" in str(exc.value)
    cloud.set_knobs(quota=None, capacity_error_rate=1.0)
    with pytest.raises(Exception) as exc:
        create(cloud, name="w3")
    assert classify(exc.value) == "capacity"
    cloud.set_knobs(capacity_error_rate=0.0, images=["good"])
    with pytest.raises(Exception) as exc:
        cloud.create_node("w4", cloud.list_sizes()[0], NodeImage(id="bad", name="bad", driver=cloud))
    assert classify(exc.value) == "permanent"


def test_api_errors_and_boot_failures(cloud: SimulatedNodeDriver, clock: ManualClock) -> None:
    cloud.set_knobs(api_error_rate=1.0)
    with pytest.raises(Exception) as exc:
        cloud.list_nodes()
    assert classify(exc.value) == "transient"
    cloud.set_knobs(api_error_rate=0.0, boot_failure_rate=1.0)
    create(cloud)
    clock.advance(30)
    assert cloud.list_nodes()[0].state == NodeState.ERROR
    with pytest.raises(ValueError):
        cloud.set_knobs(warp_speed=9)
