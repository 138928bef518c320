"""Instance-type catalogues (common/config/catalogue.py): config, libcloud sizes, hostlists, errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from epu.common.config import ConfigError, load_config, parse_config
from epu.common.config.catalogue import (
    InstanceType,
    InstanceTypeConfig,
    expand_hostlist,
    site_types,
    type_from_size,
)
from libcloud.compute.base import NodeSize
from libcloud.compute.drivers.openstack import OpenStackNodeSize
from libcloud.compute.providers import get_driver

CATALOGUE = """
[domains.alpha]
sites = ["ec2", "os"]
default_partition = "cpu"
allow_spot = true
[domains.alpha.partitions]
cpu = ["c5-xlarge", "m1.large"]
bigmem = ["r5-4xlarge"]
gpu = ["ec2/p3-2xlarge"]
[domains.alpha.type_nodes.r5-4xlarge]
names = ["bigmem[01-03]", "bigmem10"]
[domains.alpha.type_nodes.p3-2xlarge]
pattern = "{domain}-gpu-{id}"

[sites.ec2]
driver = "ec2"
image = "ami-1"
quota = 30
[sites.ec2.types.c5-xlarge]
size = "c5.xlarge"
cores = 4
memory_mb = 8192
price_per_hour = 0.17
[sites.ec2.types.r5-4xlarge]
size = "r5.4xlarge"
cores = 16
memory_mb = 131072
features = ["bigmem"]
price_per_hour = 1.008
quota = 4
[sites.ec2.types.p3-2xlarge]
size = "p3.2xlarge"
cores = 8
memory_mb = 62464
gpus = 1
features = ["v100", "gpu"]
price_per_hour = 3.06
image = "ami-gpu"
[sites.ec2.types.c5-spot]
size = "c5.xlarge"
cores = 4
spot = true
price_per_hour = 0.06

[sites.os]
driver = "openstack"
image = "rocky9"
size = "m1.large"
cores = 4
quota = 10
"""


def test_a_catalogue_loads_and_expands():
    cfg = parse_config(__import__("tomllib").loads(CATALOGUE), environ={})
    ec2 = {t.name: t for t in site_types("ec2", cfg.sites["ec2"])}
    assert ec2["p3-2xlarge"] == InstanceType("ec2", "p3-2xlarge", "p3.2xlarge", 8, 62464, 1, ("gpu", "v100"), 3.06,
                                             False, 30, "ami-gpu")
    assert (ec2["r5-4xlarge"].quota, ec2["r5-4xlarge"].image, ec2["c5-spot"].spot) == (4, "ami-1", True)
    # a legacy site is a one-type catalogue named after its size
    (os_type,) = site_types("os", cfg.sites["os"])
    assert (os_type.name, os_type.size, os_type.cores, os_type.quota, os_type.legacy) == ("m1.large", "m1.large", 4, 10,
                                                                                          True)
    nodes = cfg.domains["alpha"].type_nodes
    assert nodes["r5-4xlarge"].names == ["bigmem01", "bigmem02", "bigmem03", "bigmem10"]
    assert nodes["p3-2xlarge"].pattern == "{domain}-gpu-{id}"


def test_existing_single_type_configs_keep_their_meaning():
    cfg = parse_config({"sites": {"s": {"driver": "epu-sim", "size": "sim.4core", "cores": 4, "price_per_hour": 0.2}},
                        "domains": {"d": {"cores_per_node": 4}}}, environ={})
    (t,) = site_types("s", cfg.sites["s"])
    assert (t.name, t.cores, t.price_per_hour, t.memory_mb, t.legacy) == ("sim.4core", 4, 0.2, 0, True)
    (t,) = site_types("s", parse_config({"sites": {"s": {"driver": "epu-sim"}}}, environ={}).sites["s"])
    assert (t.name, t.cores) == ("default", 1)


@pytest.mark.parametrize(("edit", "expected"), [
    (("size = \"c5.xlarge\"\ncores = 4", "size = \"c5.xlarge\""),
     "sites.ec2: Value error, types.c5-xlarge.cores: required"),
    (('gpu = ["ec2/p3-2xlarge"]', 'gpu = ["ec2/p3-2xlarge", "p4d"]'),
     "domains.alpha.partitions.gpu: instance type 'p4d' is offered by none of the domain's sites"),
    (('gpu = ["ec2/p3-2xlarge"]', 'gpu = ["os/p3-2xlarge"]'), "domains.alpha.partitions.gpu: instance type"),
    (('default_partition = "cpu"', 'default_partition = "debug"'),
     "domains.alpha: Value error, default_partition: 'debug' is not one of the partitions"),
    (('gpu = ["ec2/p3-2xlarge"]', "gpu = []"), "partitions.gpu: list at least one instance type"),
    (('names = ["bigmem[01-03]", "bigmem10"]', 'names = ["bigmem[03-01]"]'), "range '03-01' runs backwards"),
    (('names = ["bigmem[01-03]", "bigmem10"]', 'names = ["bigmem[01-03]", "bigmem02"]'), "listed twice"),
    (('pattern = "{domain}-gpu-{id}"', 'pattern = "{domain}-gpu"'), "pattern must contain {id}"),
    (('pattern = "{domain}-gpu-{id}"', 'pattern = "{host}-{id}"'), "pattern may use only"),
    (("[sites.ec2.types.c5-spot]", "[sites.ec2.types.c5-spot]\nmemory_mb = -1"),
     "sites.ec2.types.c5-spot.memory_mb: Input should be greater than or equal to 0"),
    (('driver = "ec2"\nimage = "ami-1"', 'driver = "ec2"\nimage = "ami-1"\ncores = 4'),
     "sites.ec2: Value error, cores: set per type in [types]"),
    (("[sites.ec2.types.c5-spot]", "[sites.ec2.types.c5-spot]\nbogus = 1"),
     "sites.ec2.types.c5-spot.bogus: unknown key"),
])
def test_bad_catalogues_name_the_key(tmp_path: Path, edit: tuple[str, str], expected: str):
    old, new = edit
    assert old in CATALOGUE
    path = tmp_path / "epu.toml"
    path.write_text(CATALOGUE.replace(old, new, 1))
    with pytest.raises(ConfigError) as err:
        load_config(path, environ={})
    assert expected in str(err.value), str(err.value)


def test_discovered_sites_accept_type_names_they_cannot_check_at_load():
    cfg = parse_config({"sites": {"ec2": {"driver": "ec2", "discover": ["c5.*"]}},
                        "domains": {"d": {"partitions": {"cpu": ["c5.xlarge"]}}}}, environ={})
    assert cfg.domains["d"].partitions == {"cpu": ["c5.xlarge"]}


def ec2_sizes() -> dict[str, NodeSize]:
    """The EC2 driver's own size table (libcloud ships it with prices; no network)."""
    driver = get_driver("ec2")("AKIDEXAMPLE", "not-a-secret", region="us-east-1")
    return {s.id: s for s in driver.list_sizes()}


def test_ec2_sizes_map_to_types_with_ram_gpus_and_price():
    sizes = ec2_sizes()
    c5 = type_from_size("ec2", sizes["c5.xlarge"])
    assert (c5.name, c5.size, c5.cores, c5.memory_mb, c5.gpus, c5.price_per_hour) == \
        ("c5.xlarge", "c5.xlarge", 4, 8192, 0, pytest.approx(0.17))
    p3 = type_from_size("ec2", sizes["p3.2xlarge"], quota=3, image="ami-gpu")
    assert (p3.cores, p3.memory_mb, p3.gpus, p3.quota, p3.image) == (8, 62464, 1, 3, "ami-gpu")
    # config overrides win, key by key
    o = InstanceTypeConfig(memory_mb=60000, features=["v100"], price_per_hour=1.0, spot=True)
    p3 = type_from_size("ec2", sizes["p3.2xlarge"], o, name="gpu-spot")
    assert (p3.name, p3.size, p3.cores, p3.memory_mb, p3.features, p3.price_per_hour, p3.spot) == \
        ("gpu-spot", "p3.2xlarge", 8, 60000, ("v100",), 1.0, True)


def test_other_drivers_sizes():
    osz = OpenStackNodeSize("42", "m1.large", 8192, 80, None, None, None, vcpus=4)
    t = type_from_size("os", osz)
    assert (t.name, t.size, t.cores, t.memory_mb, t.price_per_hour) == ("42", "42", 4, 8192, 0.0)
    azure = NodeSize("Standard_D4s_v3", "Standard_D4s_v3", 16384, 32, 0, 0, None,
                     extra={"numberOfCores": 4})
    assert type_from_size("az", azure).cores == 4
    gce = NodeSize("123", "a2-highgpu-1g", 87040, 0, 0, None, None,
                   extra={"guestCpus": 12, "accelerators": [{"guestAcceleratorCount": 1,
                                                             "guestAcceleratorType": "nvidia-tesla-a100"}]})
    t = type_from_size("gce", gce)
    assert (t.cores, t.gpus, t.price_per_hour) == (12, 1, 0.0)
    # a size whose cores the driver does not report cannot be packed unless the config says
    bare = NodeSize("x", "x", 1024, 0, 0, 0.1, None)
    assert type_from_size("s", bare) is None
    assert type_from_size("s", bare, InstanceTypeConfig(cores=2)).cores == 2
    weird = NodeSize("y", "y", None, 0, 0, "n/a", None, extra={"vcpu": "NA", "cpu": "2"})
    t = type_from_size("s", weird)
    assert (t.cores, t.memory_mb, t.price_per_hour) == (2, 0, 0.0)


def test_site_catalogue_from_discovered_sizes_with_overrides():
    cfg = parse_config({"sites": {"ec2": {"driver": "ec2", "image": "ami", "quota": 9, "discover": ["c5.*large"],
                                          "types": {"gpu": {"size": "p3.2xlarge", "features": ["v100"]},
                                                    "big": {"size": "c5.4xlarge", "price_per_hour": 0.5}}}}},
                       environ={})
    sizes = list(ec2_sizes().values())
    types = {t.name: t for t in site_types("ec2", cfg.sites["ec2"], sizes)}
    assert {"c5.large", "c5.xlarge", "big", "gpu"} <= set(types)
    assert "c5.4xlarge" not in types  # offered under its override's name
    assert (types["big"].size, types["big"].cores, types["big"].price_per_hour) == ("c5.4xlarge", 16, 0.5)
    assert (types["gpu"].gpus, types["gpu"].features, types["gpu"].quota) == (1, ("v100",), 9)
    assert not any(t.startswith("m5") for t in types)
    # nothing discovered (listing failed): declared types without cores are left out, not guessed
    assert site_types("ec2", cfg.sites["ec2"], []) == []


@pytest.mark.parametrize(("expr", "names"), [
    ("node1", ["node1"]),
    ("gpu[1-3,7]", ["gpu1", "gpu2", "gpu3", "gpu7"]),
    ("bigmem[08-10]", ["bigmem08", "bigmem09", "bigmem10"]),
    ("n[1-2]-[a,b]" .replace("a,b", "0,1"), ["n1-0", "n1-1", "n2-0", "n2-1"]),
])
def test_hostlists(expr: str, names: list[str]):
    assert expand_hostlist(expr) == names


@pytest.mark.parametrize("bad", ["", "gpu[1-]", "gpu[a-b]", "gpu[1-3", "-x[1-2]", "x[0-100000]"])
def test_bad_hostlists(bad: str):
    with pytest.raises(ValueError):
        expand_hostlist(bad)


@pytest.mark.parametrize("value", [0, -5, "hourly"])
def test_a_bad_discover_period_is_refused_naming_the_key(value) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"provisioner": {"discover_seconds": value}}, environ={})
    assert "provisioner.discover_seconds" in str(err.value)
    assert parse_config({}, environ={}).provisioner.discover_seconds == 3600
