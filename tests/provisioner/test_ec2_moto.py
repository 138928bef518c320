"""The real libcloud EC2 path against moto's EC2 server (started here on a free port)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import boto3
import pytest
from epu.common.clock import RealClock
from epu.common.config import parse_config
from epu.common.messages import LaunchRequest, TerminateRequest
from epu.common.testing import wait_for
from epu.services.provisioner.app import build_provisioner
from epu.services.provisioner.cloud import TAG_DEPLOYMENT, TAG_LAUNCH, TAG_STORE, LaunchSpec
from epu.services.provisioner.drivers import SiteConfigError
from epu.services.provisioner.ec2 import EpuEC2NodeDriver, canonical_namespace
from libcloud.compute.drivers.ec2 import EC2NodeDriver
from moto.server import ThreadedMotoServer

from tests.provisioner.conftest import FAST_RETRY, Events

AMI = "ami-12c6146b"  # one of moto's built-in images


@pytest.fixture(scope="module")
def moto_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield port
    server.stop()


@pytest.fixture
def ec2(moto_port: int):
    client = boto3.client("ec2", region_name="us-east-1", endpoint_url=f"http://127.0.0.1:{moto_port}",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    yield client
    ids = [i["InstanceId"] for r in client.describe_instances()["Reservations"] for i in r["Instances"]]
    if ids:
        client.terminate_instances(InstanceIds=ids)


def instances(ec2, launch_id: str | None = None, live: bool = True) -> list[dict]:
    out = [i for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]]
    if live:
        out = [i for i in out if i["State"]["Name"] not in ("terminated", "shutting-down")]
    if launch_id:
        out = [i for i in out if {t["Key"]: t["Value"] for t in i.get("Tags", [])}.get(TAG_LAUNCH) == launch_id]
    return out


@pytest.fixture
def provisioner(moto_port: int, tmp_path, sqlite_url: str):
    creds = tmp_path / "aws.toml"
    creds.write_text('key = "testing"\nsecret = "testing"\n')
    config = parse_config({
        "provisioner": {"store_url": sqlite_url, "orphan_grace_seconds": 0, "deployment": "epu-ec2test"},
        "sites": {"aws": {"driver": "ec2", "image": AMI, "size": "t2.micro", "credentials_file": str(creds),
                          "driver_args": {"host": "127.0.0.1", "port": moto_port, "secure": False,
                                          "region": "us-east-1", "signature_version": "4"}}},
    }, environ={})
    events = Events()
    prov = build_provisioner(config, events, clock=RealClock())
    prov.settings.retry = FAST_RETRY
    yield prov, events
    prov.shutdown()
    prov.store.close()


def test_namespace_fix_is_needed_and_harmless() -> None:
    bare = b'<DescribeInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15">'
    assert canonical_namespace(bare) == b'<DescribeInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
    real = '<X xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
    assert canonical_namespace(real) == real


def test_driver_is_ec2_and_lists_what_moto_has(provisioner, ec2) -> None:
    prov, _ = provisioner
    site = prov.sites["aws"]
    assert isinstance(site.driver, EpuEC2NodeDriver)
    node = site.launch(LaunchSpec(launch_id="probe-1", node_name="probe-1", domain="alpha"))
    assert [n.cloud_id for n in site.nodes()] == [node.cloud_id]
    # the reason for the subclass: the stock driver parses moto's DescribeInstances as empty
    stock = EC2NodeDriver("testing", "testing", secure=False, host="127.0.0.1", port=site.driver.connection.port,
                          region="us-east-1", signature_version="4")
    assert stock.list_nodes() == []


def test_launch_dedupe_tags_list_terminate(provisioner, ec2) -> None:
    prov, events = provisioner
    req = LaunchRequest(launch_id="ec2-launch-1", domain="alpha", site="aws", node_name="worker-1",
                        attributes={"context_uri": "https://ctx.example/ctx/1"})
    for _ in range(3):
        prov.handle_launch(req)
    assert prov.wait_idle(30)
    [inst] = instances(ec2, "ec2-launch-1")
    tags = {t["Key"]: t["Value"] for t in inst["Tags"]}
    assert tags[TAG_DEPLOYMENT] == "epu-ec2test" and tags["epu-domain"] == "alpha"
    assert tags["epu-instance-id"] == "ec2-launch-1"
    assert inst["ClientToken"] == "ec2-launch-1"  # the launch id travels as the client token
    rec = prov.store.get("ec2-launch-1")
    assert rec.cloud_id == inst["InstanceId"]

    prov.poll("aws")
    rec = prov.store.get("ec2-launch-1")
    assert rec.state == "started" and rec.ip
    assert events.states("ec2-launch-1") == ["requested", "pending", "started"]

    prov.handle_terminate(TerminateRequest(request_id="t1", instance_id="ec2-launch-1", domain="alpha"))
    assert prov.wait_idle(30)
    prov.poll("aws")
    assert prov.store.get("ec2-launch-1").state == "terminated"
    assert instances(ec2, "ec2-launch-1") == []


def test_interrupted_launch_is_adopted_not_repeated(provisioner, ec2) -> None:
    """moto records ClientToken but does not dedupe on it, so this shows the provisioner's own
    guard: after a create whose answer was lost, the retry finds the node by its tag."""
    prov, events = provisioner
    req = LaunchRequest(launch_id="ec2-launch-2", domain="alpha", site="aws", node_name="worker-2")
    prov.store.record_launch(req, 0.0)
    prov.store.note_cloud_attempt(req.launch_id, 0.0)
    prov.sites["aws"].launch(LaunchSpec(launch_id=req.launch_id, node_name="worker-2", domain="alpha"))
    prov.handle_launch(req)  # the redelivered request
    assert prov.wait_idle(30)
    assert len(instances(ec2, "ec2-launch-2")) == 1
    assert prov.store.get("ec2-launch-2").cloud_id == instances(ec2, "ec2-launch-2")[0]["InstanceId"]
    assert "adopted" in events.for_("ec2-launch-2")[-1].reason


def run_tagged(ec2, **tags: str) -> str:
    out = ec2.run_instances(ImageId=AMI, MinCount=1, MaxCount=1, InstanceType="t2.micro", TagSpecifications=[{
        "ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}])
    return out["Instances"][0]["InstanceId"]


def test_orphans_swept_by_tag_only_of_this_store(provisioner, ec2) -> None:
    prov, _ = provisioner
    store = prov.identity.store_id
    run_tagged(ec2, **{TAG_DEPLOYMENT: "epu-ec2test", TAG_STORE: store, TAG_LAUNCH: "nobody"})
    # the same deployment name from another store (e.g. a re-created database), an older release
    # (no store tag) and another deployment: none of them is this store's to sweep
    run_tagged(ec2, **{TAG_DEPLOYMENT: "epu-ec2test", TAG_STORE: "other-store", TAG_LAUNCH: "theirs"})
    run_tagged(ec2, **{TAG_DEPLOYMENT: "epu-ec2test", TAG_LAUNCH: "legacy"})
    run_tagged(ec2, **{TAG_DEPLOYMENT: "staging", TAG_STORE: store, TAG_LAUNCH: "staging-1"})
    report = prov.reconcile("aws")
    assert len(report.swept) == 1
    assert instances(ec2, "nobody") == []
    assert all(len(instances(ec2, lid)) == 1 for lid in ("theirs", "legacy", "staging-1"))
    assert sorted(a.kind for a in prov.alerts) == ["foreign-node", "foreign-node", "orphan-seen"]


def test_absence_from_the_real_drivers_listing_presumes_never_destroys(provisioner, ec2) -> None:
    """libcloud's EC2 driver lists only what carries our deployment tag: take the tag away (the node
    drops out of the listing exactly as from a partial one), and the node is presumed gone, never
    destroyed; put it back and it is re-adopted. Was: closed at the first miss, destroyed after."""
    prov, events = provisioner
    prov.settings.vanish_min_seconds = 0.0
    prov.handle_launch(LaunchRequest(launch_id="ec2-absent", domain="alpha", site="aws", node_name="worker-a"))
    assert prov.wait_idle(30)
    [inst] = instances(ec2, "ec2-absent")
    ec2.delete_tags(Resources=[inst["InstanceId"]], Tags=[{"Key": TAG_DEPLOYMENT}])
    for _ in range(3):
        prov.poll("aws")
        assert prov.reconcile("aws").swept == []
    rec = prov.store.get("ec2-absent")
    assert rec.presumed_gone and rec.state in ("pending", "started") and events.for_("ec2-absent")[-1].presumed_gone
    ec2.create_tags(Resources=[inst["InstanceId"]], Tags=[{"Key": TAG_DEPLOYMENT, "Value": "epu-ec2test"}])
    report = prov.reconcile("aws")
    assert report.readopted == ["ec2-absent"] and report.swept == []
    assert len(instances(ec2, "ec2-absent")) == 1 and not prov.store.get("ec2-absent").presumed_gone


def ec2_config(moto_port: int, tmp_path, sqlite_url: str, **site: object):
    creds = tmp_path / "aws.toml"
    creds.write_text('key = "testing"\nsecret = "testing"\n')
    driver_args = {"host": "127.0.0.1", "port": moto_port, "secure": False, "region": "us-east-1",
                   "signature_version": "4", **site.pop("driver_args", {})}  # type: ignore[dict-item]
    return parse_config({
        "provisioner": {"store_url": sqlite_url, "deployment": "epu-ec2test"},
        "sites": {"aws": {"driver": "ec2", "image": AMI, "size": "t2.micro", "credentials_file": str(creds),
                          "driver_args": driver_args, **site}},
    }, environ={})


def test_provider_extras_reach_ec2(moto_port, tmp_path, sqlite_url, ec2) -> None:
    """Subnet, security group ids, IAM instance profile and spot options from a site's create_args,
    through libcloud's EC2 driver, as moto records them."""
    kw = dict(region_name="us-east-1", endpoint_url=f"http://127.0.0.1:{moto_port}",
              aws_access_key_id="testing", aws_secret_access_key="testing")
    vpc = ec2.create_vpc(CidrBlock="10.1.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.1.1.0/24")["Subnet"]["SubnetId"]
    group = ec2.create_security_group(GroupName="epu-workers", Description="workers", VpcId=vpc)["GroupId"]
    boto3.client("iam", **kw).create_instance_profile(InstanceProfileName="epu-worker")
    config = ec2_config(moto_port, tmp_path, sqlite_url, create_args={
        "ex_subnet": subnet, "ex_security_group_ids": [group], "ex_iamprofile": "epu-worker", "ex_spot": True,
        "ex_spot_max_price": 0.05})
    prov = build_provisioner(config, Events(), clock=RealClock())
    prov.settings.retry = FAST_RETRY
    try:
        prov.handle_launch(LaunchRequest(launch_id="ec2-extras", domain="alpha", site="aws", node_name="worker-x"))
        assert prov.wait_idle(30)
        [inst] = instances(ec2, "ec2-extras")
        assert inst["SubnetId"] == subnet and inst["VpcId"] == vpc
        assert [g["GroupId"] for g in inst["SecurityGroups"]] == [group]
        assert inst["IamInstanceProfile"]["Arn"].endswith("instance-profile/epu-worker")
        assert inst["InstanceLifecycle"] == "spot"
        assert prov.store.get("ec2-extras").cloud_id == inst["InstanceId"]
    finally:
        prov.shutdown()
        prov.store.close()


@pytest.mark.parametrize("site,key", [
    ({"driver_args": {"regoin": "eu-west-1"}}, "regoin"),                  # libcloud would drop it silently
    ({"create_args": {"ex_subnett": "subnet-1"}}, "ex_subnett"),          # not a create_node argument
    ({"create_args": {"ex_clienttoken": "x"}}, "ex_clienttoken"),         # EPU sets it (the launch id)
])
def test_misspelt_or_reserved_keys_are_refused_by_name(moto_port, tmp_path, sqlite_url, site, key) -> None:
    config = ec2_config(moto_port, tmp_path, sqlite_url, **site)
    with pytest.raises(SiteConfigError) as exc:
        build_provisioner(config, Events(), clock=RealClock())
    assert f"'{key}'" in str(exc.value) and "site aws" in str(exc.value) and "testing" not in str(exc.value)


def test_discovered_ec2_sizes_become_the_engines_catalogue(moto_port: int, tmp_path, sqlite_url: str) -> None:
    """Issue 13: a site that ``discover``s sizes offers what libcloud's real EC2 driver lists
    (vCPUs, RAM, GPUs, on-demand price — libcloud's own size and price tables for the region;
    the driver is the one that launches on moto's EC2 here), config overrides winning key by
    key; the provisioner's ``instance.report`` carries them and the engine launches by them."""
    from epu.common.clock import ManualClock
    from epu.common.messages import InstanceReport, JobShape, SensorSnapshot
    from epu.services.provisioner.app import publish_reports

    from tests.decision.helpers import make_engine

    creds = tmp_path / "aws.toml"
    creds.write_text('key = "testing"\nsecret = "testing"\n')
    config = parse_config({
        "provisioner": {"store_url": sqlite_url, "deployment": "epu-ec2test"},
        "decision": {"store_url": "sqlite://"},
        "domains": {"alpha": {"max_nodes": 10, "sites": ["aws"], "default_partition": "cpu",
                              "partitions": {"cpu": ["c5.xlarge", "c5.2xlarge"], "bigmem": ["big"]}}},
        "sites": {"aws": {"driver": "ec2", "image": AMI, "credentials_file": str(creds), "quota": 8,
                          "discover": ["c5.*"],
                          "types": {"big": {"size": "r5.4xlarge", "features": ["bigmem"]},
                                    "c5.2xlarge": {"price_per_hour": 0.05}},  # an override wins
                          "driver_args": {"host": "127.0.0.1", "port": moto_port, "secure": False,
                                          "region": "us-east-1", "signature_version": "4"}}},
    }, environ={})
    prov = build_provisioner(config, Events(), clock=RealClock())
    try:
        assert prov.catalogues.get("aws") is None  # nothing listed yet
        prov.discover_all()
        assert prov.wait_idle(30) and wait_for(lambda: prov.catalogues.get("aws"), 30, message="sizes listed")
        types = {t.name: t for t in prov.catalogues.get("aws")}
        c5 = types["c5.xlarge"]
        assert (c5.size, c5.cores, c5.memory_mb, c5.price_per_hour, c5.quota, c5.image) == \
            ("c5.xlarge", 4, 8192, pytest.approx(0.17), 8, AMI)
        assert (types["c5.2xlarge"].cores, types["c5.2xlarge"].price_per_hour) == (8, 0.05)
        big = types["big"]
        assert (big.size, big.cores, big.memory_mb, big.features) == ("r5.4xlarge", 16, 131072, ("bigmem",))
        assert not any(n.startswith("m5") for n in types)

        sent: list[InstanceReport] = []
        service = type("S", (), {"clock": RealClock(), "publish": staticmethod(sent.append)})()
        assert publish_reports(service, prov.store, 3600.0, prov.catalogues, {"alpha": ["aws"]}) == 1
        (report,) = sent  # no instance yet: the report is sent for the catalogue
        assert report.instances == [] and {o.name for o in report.offered["aws"]} == set(types)

        engine, bus, clock = make_engine(cfg=config, clock=ManualClock(1000.0))
        assert engine.types["aws"] == []  # from config alone: no declared type has cores
        engine.on_instance_report(InstanceReport.model_validate(report.model_dump()))
        engine.on_snapshot(SensorSnapshot(domain="alpha", backend="test", taken_at=clock.now(), shapes=[
            JobShape(count=2, cores=8, partition="cpu", memory_mb=4000),
            JobShape(count=1, cores=8, memory_mb=100_000, partition="bigmem", features=["bigmem"])]))
        engine.iterate()
        launched = sorted(m.instance_type for m in bus.of("instance.launch"))
        # c5.2xlarge (8 cores, overridden to 0.05/h) beats two c5.xlarge per job; r5.4xlarge for bigmem
        assert launched == ["big", "c5.2xlarge", "c5.2xlarge"]
    finally:
        prov.shutdown()
        prov.store.close()
