"""Launches of a catalogue type: the provisioner creates the type's size with the type's image,
refuses a type the site does not offer (permanent, named), holds the type's quota, and a launch
without a type keeps the site's single size and image (backward compatible)."""

from __future__ import annotations

from epu.common.messages import LaunchRequest
from epu.services.provisioner.sim import SimulatedNodeDriver

TYPES = {"types": {
    "c4": {"size": "sim.c4", "cores": 4, "memory_mb": 8000, "price_per_hour": 0.2},
    "gpu": {"size": "sim.g1", "cores": 8, "gpus": 1, "price_per_hour": 3.0, "image": "gpu-image", "quota": 1},
}, "size": None}


def launch(i: int, instance_type: str = "", cores: int = 1) -> LaunchRequest:
    return LaunchRequest(launch_id=f"launch-{i}", domain="alpha", site="sim", node_name=f"worker-{i}",
                         cores=cores, instance_type=instance_type)


def site_kw() -> dict[str, object]:
    return dict(TYPES)  # size None: a site with a types table has no single size


def node_of(cloud: SimulatedNodeDriver, launch_id: str):
    return next(n for n in cloud.list_nodes() if n.extra["tags"]["epu-launch-id"] == launch_id)


def test_a_typed_launch_creates_the_types_size_and_image(make_provisioner, cloud) -> None:
    prov, events = make_provisioner({"sim": cloud}, site_kw=site_kw())
    prov.handle_launch(launch(1, "c4", 4))
    prov.handle_launch(launch(2, "gpu", 8))
    assert prov.wait_idle()
    assert (node_of(cloud, "launch-1").extra["size"], node_of(cloud, "launch-1").extra["image"]) == \
        ("sim.c4", "sim-image")
    assert (node_of(cloud, "launch-2").extra["size"], node_of(cloud, "launch-2").extra["image"]) == \
        ("sim.g1", "gpu-image")
    assert prov.store.get("launch-2").instance_type == "gpu"
    assert {e.instance_type for e in events.for_("launch-2")} == {"gpu"}


def test_an_untyped_launch_keeps_the_sites_single_size(make_provisioner, cloud) -> None:
    prov, events = make_provisioner({"sim": cloud})
    prov.handle_launch(launch(1))
    assert prov.wait_idle()
    node = node_of(cloud, "launch-1")
    assert (node.extra["size"], node.extra["image"]) == ("sim.1core", "sim-image")
    assert prov.store.get("launch-1").instance_type == ""


def test_a_type_the_site_does_not_offer_fails_permanently_with_the_offered_ones(make_provisioner, cloud) -> None:
    prov, events = make_provisioner({"sim": cloud}, site_kw=site_kw())
    prov.handle_launch(launch(1, "p4d"))
    assert prov.wait_idle()
    failed = events.for_("launch-1")[-1]
    assert failed.state == "failed" and failed.error_kind == "permanent"
    assert "no instance type 'p4d'" in failed.reason and "c4, gpu" in failed.reason
    assert cloud.ex_count() == 0


def test_the_types_quota_is_held(make_provisioner, cloud) -> None:
    prov, events = make_provisioner({"sim": cloud}, site_kw=site_kw())
    prov.handle_launch(launch(1, "gpu", 8))
    prov.handle_launch(launch(2, "gpu", 8))
    prov.handle_launch(launch(3, "c4", 4))
    assert prov.wait_idle()
    failed = events.for_("launch-2")[-1]
    assert failed.state == "failed" and failed.error_kind == "capacity" and "type quota" in failed.reason
    assert cloud.ex_count() == 2
