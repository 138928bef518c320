"""The real libcloud EC2 path against moto's EC2 server (started here on a free port)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import boto3
import pytest
from libcloud.compute.drivers.ec2 import EC2NodeDriver
from moto.server import ThreadedMotoServer

from common.clock import RealClock
from common.config import parse_config
from common.messages import LaunchRequest, TerminateRequest
from services.provisioner.app import build_provisioner
from services.provisioner.cloud import TAG_DEPLOYMENT, TAG_LAUNCH, LaunchSpec
from services.provisioner.ec2 import EpuEC2NodeDriver, canonical_namespace
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


def test_orphans_swept_by_tag(provisioner, ec2) -> None:
    prov, _ = provisioner
    ec2.run_instances(ImageId=AMI, MinCount=1, MaxCount=1, InstanceType="t2.micro", TagSpecifications=[{
        "ResourceType": "instance",
        "Tags": [{"Key": TAG_DEPLOYMENT, "Value": "epu-ec2test"}, {"Key": TAG_LAUNCH, "Value": "nobody"}]}])
    report = prov.reconcile("aws")
    assert len(report.swept) == 1
    assert instances(ec2, "nobody") == []
