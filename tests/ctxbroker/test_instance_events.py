"""Over the real RabbitMQ: a terminated instance's node leaves its context; joins/leaves are published."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from epu.common.broker import Broker, Publisher
from epu.common.config import parse_config
from epu.common.messages import ContextMembership, InstanceEvent, InstanceReport
from epu.common.runtime import Service
from epu.common.testing import drain, wait_for
from epu.services.ctxbroker.app import CtxBrokerService, build_service
from epu.services.ctxbroker.client import AdminClient, BrokerError
from epu.services.ctxbroker.server import BrokerServer, ServerSettings
from kombu import Queue

from tests.ctxbroker.conftest import ADMIN_TOKEN, Nodes, node


@pytest.fixture
def service(broker: Broker, sqlite_url: str, tls_files: tuple[str, str]) -> Iterator[CtxBrokerService]:
    server = BrokerServer(ServerSettings("127.0.0.1", 0, tls_files[0], tls_files[1], ADMIN_TOKEN, sqlite_url))
    svc = CtxBrokerService(server, Service("ctxbroker", broker))
    svc.start_in_thread()
    assert svc.service.wait_ready(15)
    yield svc
    svc.close()


def _tap(broker: Broker) -> str:
    """A queue bound to context.member.# (declared now, so it sees every later event)."""
    name = broker.topology.n("test.ctx-members")
    with broker.connection() as conn:
        ch = conn.channel()
        broker.topology.events_exchange(ch).declare()
        Queue(name, exchange=broker.topology.events_exchange, routing_key="context.member.#",
              durable=False, auto_delete=False)(ch).declare()
    return name


def test_terminated_instance_leaves_its_context(service: CtxBrokerService, broker: Broker,
                                                tls_files: tuple[str, str]) -> None:
    tap = _tap(broker)
    admin = AdminClient(service.server.public_url, ADMIN_TOKEN, ca_file=tls_files[0])
    ctx = admin.create("cluster")
    nc = Nodes(ctx, tls_files[0], store=service.server.store)
    nc.join(node(1, instance_id="i-1"))
    nc.join(node(2, instance_id="i-2"))
    publisher = Publisher(broker, source="test-provisioner")
    common = dict(domain="alpha", site="sim", at=time.time(), node_name="wn-1")
    # a non-terminal state is not even routed here; a terminated one removes the node
    publisher.publish(InstanceEvent(instance_id="i-1", state="joined", **common))
    publisher.publish(InstanceEvent(instance_id="i-1", state="terminated", reason="idle", seq=5, **common))
    publisher.publish(InstanceEvent(instance_id="i-1", state="terminated", seq=5, **common))  # duplicate
    publisher.publish(InstanceEvent(instance_id="i-unknown", state="failed", **common))
    wait_for(lambda: [n["hostname"] for n in admin.nodes(ctx["id"])] == ["wn-2"], timeout=15,
             message="wn-1 removed after its instance terminated")
    # the store is the truth; what agents read follows it within a loop tick
    def updates_with_leave() -> dict | None:
        d = nc.updates(2)
        return d if d["last_id"] == 3 else None

    doc = wait_for(updates_with_leave, timeout=10, message="the leave visible to agents")
    assert [(e["id"], e["kind"], e["hostname"]) for e in doc["entries"]] == [(3, "leave", "wn-1")]
    assert doc["entries"][0]["reason"] == "instance terminated: idle"
    # the gone instance's credential is revoked: a late (or forged) join from it is refused
    late = nc.as_node("wn-1", "i-1")
    with pytest.raises(BrokerError) as refused:
        late.join(node(1, instance_id="i-1"))
    assert refused.value.status == 403 and "terminated" in refused.value.message
    late.close()
    assert [n["hostname"] for n in admin.nodes(ctx["id"])] == ["wn-2"]

    events: list[ContextMembership] = []

    def collect() -> bool:
        events.extend(m for _env, m in drain(broker, tap) if isinstance(m, ContextMembership))
        return len(events) >= 3

    wait_for(collect, timeout=15, message="three ContextMembership events")
    assert [(e.entry_id, e.kind, e.hostname, e.context_id) for e in events] == [
        (1, "join", "wn-1", ctx["id"]), (2, "join", "wn-2", ctx["id"]), (3, "leave", "wn-1", ctx["id"])]
    publisher.close()
    nc.close()
    admin.close()


def test_build_service_from_config(tmp_path: Path, rabbit_url: str, prefix: str) -> None:
    config = parse_config({
        "broker": {"url": rabbit_url, "prefix": prefix},
        "ctxbroker": {"port": 0, "store_url": f"sqlite:///{tmp_path / 'ctx.db'}",
                      "admin_token_file": str(tmp_path / "admin.token"), "metrics_port": 0},
    }, environ={})
    svc = build_service(config)
    svc.start_in_thread()
    try:
        token = (tmp_path / "admin.token").read_text().strip()
        assert (tmp_path / "admin.token").stat().st_mode & 0o777 == 0o600
        cert = tmp_path / "epu-ctxbroker-tls" / "cert.pem"
        admin = AdminClient(svc.server.public_url, token, ca_file=str(cert))
        assert admin.create("x")["uri"].startswith(svc.server.public_url)
        admin.close()
        assert svc.service.wait_ready(15)
        port = wait_for(lambda: svc.service._health_server and svc.service._health_server.port)
        import httpx

        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        assert "epu_ctxbroker_contexts 1.0" in metrics and "epu_ctxbroker_waiting_polls" in metrics
        health = httpx.get(f"http://127.0.0.1:{port}/healthz").json()
        assert health["https"]["serving"] is True and health["https"]["contexts"] == 1
    finally:
        svc.close()


def test_the_broker_learns_each_instances_address_from_the_provisioner(
        service: CtxBrokerService, broker: Broker, tls_files: tuple[str, str]) -> None:
    """A node launched by EPU publishes only the address the provisioner reports for its
    instance: the broker learns it from instance events and reports (over the real RabbitMQ)."""
    admin = AdminClient(service.server.public_url, ADMIN_TOKEN, ca_file=tls_files[0])
    ctx = admin.create("cluster")
    nc = Nodes(ctx, tls_files[0])
    store = service.server.store
    publisher = Publisher(broker, source="test-provisioner")
    common = dict(domain="alpha", site="sim", at=time.time())
    publisher.publish(InstanceEvent(instance_id="i-6", state="started", seq=2, ip="10.0.0.7", node_name="wn-6",
                                    **common))
    # anti-entropy: a report carries every instance's current address (an older one changes nothing)
    publisher.publish(InstanceReport(domain="alpha", as_of=time.time(), instances=[
        InstanceEvent(instance_id="i-6", state="started", seq=1, ip="10.9.9.9", node_name="wn-6", **common),
        InstanceEvent(instance_id="i-7", state="joined", seq=3, ip="10.0.0.8", node_name="wn-7", **common)]))
    wait_for(lambda: store.instance_ip("i-7") == "10.0.0.8", timeout=15, message="i-7's address from the report")
    assert store.instance_ip("i-6") == "10.0.0.7"
    wn6 = nc.as_node("wn-6", "i-6")
    with pytest.raises(BrokerError) as refused:
        wn6.join(node(6, instance_id="i-6", ip="10.0.0.8"))  # wn-7's address
    assert refused.value.status == 403 and "not this instance's address" in refused.value.message
    assert wn6.join(node(6, instance_id="i-6"))["changed"] is True  # node(6)'s ip is 10.0.0.7
    # once the instance is gone its address is released (a later report of it changes nothing)
    publisher.publish(InstanceEvent(instance_id="i-6", state="terminated", seq=4, node_name="wn-6", **common))
    wait_for(lambda: store.instance_ip("i-6") is None and admin.nodes(ctx["id"]) == [], timeout=15,
             message="i-6 released and removed")
    for c in (wn6, nc, admin, publisher):
        c.close()


def test_a_reopened_instance_joins_again_and_its_peers_list_it(service: CtxBrokerService, broker: Broker,
                                                               tls_files: tuple[str, str]) -> None:
    """Issue 33, defect 5: a launch closed ``failed`` (its create's answer lost, the retries run
    out) whose node the cloud lists alive is reopened by the provisioner (``previous: failed``, a
    higher ``seq``). The broker had revoked its credential and forgotten its address for good: the
    node could never join, its peers never listed it. Now the reopening restores both; a late copy
    of the failure changes nothing, and a termination is still for good."""
    admin = AdminClient(service.server.public_url, ADMIN_TOKEN, ca_file=tls_files[0])
    ctx = admin.create("cluster")
    nc = Nodes(ctx, tls_files[0])
    store = service.server.store
    publisher = Publisher(broker, source="test-provisioner")
    common = dict(domain="alpha", site="sim", at=time.time(), node_name="wn-1")
    wn1 = nc.as_node("wn-1", "i-1")

    def members() -> list[str]:
        return sorted(n["hostname"] for n in admin.nodes(ctx["id"]))

    def join_refused() -> str | None:
        try:
            wn1.join(node(1, instance_id="i-1"))
        except BrokerError as exc:
            return exc.message
        return None

    publisher.publish(InstanceEvent(instance_id="i-1", state="failed", seq=3, reason="retries exhausted", **common))
    publisher.publish(InstanceEvent(instance_id="i-2", state="started", seq=2, ip=str(node(2)["ip"]), **common))
    wait_for(lambda: store.instance_ip("i-2"), timeout=15, message="the events before handled")
    assert "cannot join" in (join_refused() or "")

    # the provisioner reopens it: the cloud lists its node alive, with the address it has
    publisher.publish(InstanceEvent(instance_id="i-1", state="started", previous="failed", seq=4, ip=str(node(1)["ip"]),
                                    **common))
    wait_for(lambda: join_refused() is None, timeout=15, message="the reopened node's join accepted")
    assert members() == ["wn-1"]
    assert nc.as_node("wn-2", "i-2").join(node(2, instance_id="i-2"))["changed"] is True
    doc = nc.updates(0)  # what every peer's agent reads
    assert [(e["kind"], e["hostname"], e["ip"]) for e in doc["entries"]] == [
        ("join", "wn-1", node(1)["ip"]), ("join", "wn-2", node(2)["ip"])]

    # a late copy of the failure it undid (a report taken before the reopening, a redelivery)
    publisher.publish(InstanceReport(domain="alpha", as_of=time.time(), instances=[
        InstanceEvent(instance_id="i-1", state="failed", seq=3, **common)]))
    publisher.publish(InstanceEvent(instance_id="i-3", state="started", seq=2, ip=str(node(3)["ip"]), **common))
    wait_for(lambda: store.instance_ip("i-3"), timeout=15, message="the late failure handled")
    assert members() == ["wn-1", "wn-2"] and store.instance_ip("i-1") == node(1)["ip"]

    # terminated is for good: no later event, reopening or not, lets the credential join again
    publisher.publish(InstanceEvent(instance_id="i-1", state="terminated", seq=6, **common))
    wait_for(lambda: members() == ["wn-2"], timeout=15, message="wn-1 left after its termination")
    publisher.publish(InstanceEvent(instance_id="i-1", state="started", previous="failed", seq=7, ip=str(node(1)["ip"]),
                                    **common))
    publisher.publish(InstanceEvent(instance_id="i-4", state="started", seq=2, ip=str(node(4)["ip"]), **common))
    wait_for(lambda: store.instance_ip("i-4"), timeout=15, message="the forged reopening handled")
    assert "cannot join" in (join_refused() or "") and store.instance_ip("i-1") is None
    publisher.close()
    wn1.close()
    nc.close()
    admin.close()
