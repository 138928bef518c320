"""Hostile joins: a node publishes only its own names and address (issue 26, defect 3).

Before: a node's credential bound its host name and instance id, but ``fqdn`` and ``ip`` were
free, and a single label such as ``head`` passed the FQDN check. A job on a worker reads that
worker's userdata (its credential), joins as itself with ``fqdn="head"`` or the head's address,
and every node's ``/etc/hosts`` then resolved ``head`` to it and ``ssh_known_hosts`` trusted
its key for the head's names and IP. Now every name must be the host's own and the address the
one the provisioner reports for its instance (held, 503, until reported), never one another
member holds; a refusal is a 403 saying why.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from epu.services.ctxbroker.client import AdminClient, BrokerError, NodeClient
from epu.services.ctxbroker.server import BrokerServer

from tests.ctxbroker.conftest import DEFAULT_SCRIPTS, Nodes, node, node_credential, ssh_key

HEAD = node(0, hostname="head", fqdn="head.cluster.test", ip="10.0.0.1")


def _refused(client: NodeClient, doc: dict[str, object]) -> BrokerError:
    with pytest.raises(BrokerError) as err:
        client.join(doc)
    return err.value


@pytest.fixture
def head(admin: AdminClient, context: dict[str, str], tls_files: tuple[str, str]) -> Iterator[NodeClient]:
    """The batch head node (the sensor host): an operator-issued credential, no instance id."""
    cred = admin.credential(context["id"], "head")
    c = NodeClient(cred["uri"], cred["key"], cred["secret"], ca_file=tls_files[0])
    assert c.join(HEAD)["changed"] is True
    yield c
    c.close()


@pytest.mark.parametrize("instance_id", [None, "i-5"], ids=["static", "launched"])
def test_a_worker_cannot_publish_the_heads_names(head: NodeClient, admin: AdminClient, context: dict[str, str],
                                                  node_client: Nodes, broker_server: BrokerServer,
                                                  instance_id: str | None) -> None:
    if instance_id:
        broker_server.store.note_instance(instance_id, "10.0.0.6")  # what the provisioner reported for wn-5
    worker = node_client.as_node("wn-5", instance_id)
    for fqdn in ("head", "head.cluster.test", "HEAD.cluster.test", "wn-6.cluster.test", "cluster.test"):
        err = _refused(worker, node(5, instance_id=instance_id, fqdn=fqdn))
        assert err.status == 403 and "not this host's name" in err.message, (fqdn, err)
    # its own names are fine: the bare host name, or under any domain (the context has none)
    assert worker.join(node(5, instance_id=instance_id, fqdn="wn-5"))["changed"] is True
    assert worker.join(node(5, instance_id=instance_id))["changed"] is True
    members = {n["hostname"]: n for n in admin.nodes(context["id"])}
    assert members["head"]["fqdn"] == "head.cluster.test" and members["head"]["ip"] == "10.0.0.1"
    assert members["wn-5"]["fqdn"] == "wn-5.cluster.test"
    worker.close()


def test_a_worker_publishes_only_its_instances_address(head: NodeClient, node_client: Nodes,
                                                        broker_server: BrokerServer, admin: AdminClient,
                                                        context: dict[str, str], tls_files: tuple[str, str]) -> None:
    worker = node_client.as_node("wn-5", "i-5")
    # before the provisioner reports the instance's address the join is held, not trusted
    cred = node_credential(context, "wn-5", "i-5")
    resp = httpx.post(f"{context['uri']}/nodes", json=node(5, instance_id="i-5"), auth=(cred.key, cred.secret),
                      verify=ssl.create_default_context(cafile=tls_files[0]))
    assert resp.status_code == 503 and resp.headers["retry-after"] == "5"
    assert "has not reported the address of instance i-5" in resp.json()["detail"]
    held = _refused(worker, node(5, instance_id="i-5"))
    assert (held.status, held.retryable, held.retry_after) == (503, True, 5.0)  # the agent retries then
    broker_server.store.note_instance("i-5", "10.0.0.6")
    # the head's address, or any address but its instance's: refused, saying why
    err = _refused(worker, node(5, instance_id="i-5", ip="10.0.0.1"))
    assert err.status == 403 and "not this instance's address" in err.message and "10.0.0.6" in err.message
    err = _refused(worker, node(5, instance_id="i-5", ip="10.6.6.6"))
    assert err.status == 403 and "not this instance's address" in err.message
    assert worker.join(node(5, instance_id="i-5", ip="10.0.0.6"))["changed"] is True
    assert {n["hostname"]: n["ip"] for n in admin.nodes(context["id"])} == {"head": "10.0.0.1", "wn-5": "10.0.0.6"}
    worker.close()


def test_no_member_takes_an_address_another_holds(admin: AdminClient, context: dict[str, str],
                                                 node_client: Nodes, broker_server: BrokerServer,
                                                 tls_files: tuple[str, str]) -> None:
    node_client.join(node(5, instance_id="i-5", ip="10.0.0.6"))
    # an operator-issued credential (no instance) may not take a live instance's address ...
    cred = admin.credential(context["id"], "head")
    head = NodeClient(cred["uri"], cred["key"], cred["secret"], ca_file=tls_files[0])
    err = _refused(head, {**HEAD, "ip": "10.0.0.6"})
    assert err.status == 403 and "address of instance i-5" in err.message
    # ... nor another member's (a static node here); its own is fine
    static = node_client.as_node("db-1")
    assert static.join(node(9, hostname="db-1", fqdn="db-1.cluster.test", ip="10.0.0.50"))["changed"] is True
    err = _refused(head, {**HEAD, "ip": "10.0.0.50"})
    assert err.status == 403 and "held by member db-1" in err.message
    assert head.join(HEAD)["changed"] is True
    # even an address the provisioner (wrongly) reports for two instances is held by one member only
    broker_server.store.note_instance("i-7", "10.0.0.6")
    err = _refused(node_client.as_node("wn-7", "i-7"), node(7, instance_id="i-7", ip="10.0.0.6"))
    assert err.status == 403 and "held by member wn-5" in err.message
    # once an instance is gone its address is free for the next one the cloud gives it to
    node_client.leave("wn-5", "i-5")
    broker_server.store.revoke("i-5", "terminated")
    assert broker_server.store.instance_ip("i-5") is None
    assert broker_server.store.note_instance("i-5", "10.0.0.99") is False  # a late event of a gone instance
    assert node_client.join(node(7, instance_id="i-7", ip="10.0.0.6"))["changed"] is True
    assert {n["hostname"]: n["ip"] for n in admin.nodes(context["id"])} == {
        "db-1": "10.0.0.50", "head": "10.0.0.1", "wn-7": "10.0.0.6"}
    head.close()
    static.close()


def test_loopback_is_everyones_own(node_client: Nodes, admin: AdminClient, context: dict[str, str]) -> None:
    """The process site runs every node on one machine and reports 127.0.0.1 for each: they all join."""
    for i in (1, 2, 3):
        node_client.join(node(i, instance_id=f"i-{i}", ip="127.0.0.1", fqdn=f"wn-{i}"))
    assert [n["ip"] for n in admin.nodes(context["id"])] == ["127.0.0.1"] * 3


def test_a_context_domain_fixes_every_fqdn(admin: AdminClient, tls_files: tuple[str, str]) -> None:
    ctx = admin.create("dom", domain="Cluster.Example.org.")
    assert admin.show(ctx["id"])["domain"] == "cluster.example.org"
    nodes = Nodes(ctx, tls_files[0])
    c = nodes.as_node("db-1")
    for fqdn in ("db-1.evil.org", "db-1.example.org", "db-1.cluster.example.org.evil.org"):
        err = _refused(c, node(1, hostname="db-1", fqdn=fqdn))
        assert err.status == 403 and "'db-1.cluster.example.org'" in err.message
    assert c.join(node(1, hostname="db-1", fqdn="db-1.cluster.example.org"))["changed"] is True
    assert c.join(node(1, hostname="db-1", fqdn="db-1"))["changed"] is True
    c.close()
    nodes.close()


def test_cluster_files_write_only_each_members_own_names(tmp_path: Path) -> None:
    """Defense in depth on every node: whatever the membership says, the default scripts give a
    member only its own names, and an address two members claim to neither (loopback excepted)."""
    k1, k2, k3, k4 = ssh_key(1), ssh_key(2), ssh_key(3), ssh_key(4)
    members = {
        "head": {"hostname": "head", "fqdn": "head.cluster.test", "ip": "10.0.0.1", "ssh_host_key": k1},
        "wn-5": {"hostname": "wn-5", "fqdn": "head", "ip": "10.0.0.6", "ssh_host_key": k2},
        "wn-6": {"hostname": "wn-6", "fqdn": "head.cluster.test", "ip": "10.0.0.1", "ssh_host_key": k3},
        "wn-7": {"hostname": "wn-7", "fqdn": "wn-7", "ip": "127.0.0.1", "ssh_host_key": k4},
        "wn-8": {"hostname": "wn-8", "fqdn": "wn-8.cluster.test", "ip": "127.0.0.1", "ssh_host_key": k4},
    }
    path = tmp_path / "members.json"
    path.write_text(json.dumps(members))
    root = tmp_path / "root"
    env = {"PATH": os.environ["PATH"], "EPU_CTX_MEMBERS": str(path), "EPU_CTX_ROOT": str(root)}
    subprocess.run([sys.executable, str(DEFAULT_SCRIPTS / "restart.d" / "10-cluster-files")], env=env, check=True)
    hosts = (root / "etc" / "hosts").read_text().splitlines()[1:-1]
    assert hosts == ["10.0.0.6\twn-5", "127.0.0.1\twn-7", "127.0.0.1\twn-8.cluster.test wn-8"]
    known = (root / "etc" / "ssh" / "ssh_known_hosts").read_text().splitlines()[1:-1]
    assert known == [f"head,head.cluster.test {k1}", f"wn-5,10.0.0.6 {k2}", f"wn-6 {k3}", f"wn-7 {k4}",
                     f"wn-8,wn-8.cluster.test {k4}"]  # a loopback address is no member's to vouch for
    # no line names head but the head's own, and nothing but head's key is trusted for "head"
    for line in known:
        names = line.split()[0].split(",")
        assert not ({"head", "head.cluster.test", "10.0.0.1"} & set(names)) or line.endswith(k1)


def test_the_feed_takes_only_addresses_and_forgets_nothing_it_must_keep(sqlite_url: str) -> None:
    """The broker's consumer side: a malformed address is ignored (never an address any node
    could then claim), a repeated or older report changes nothing, a gone instance stays gone."""
    import time

    from epu.common.messages import InstanceEvent
    from epu.services.ctxbroker.app import InstanceFeed
    from epu.services.ctxbroker.store import Store

    store = Store(sqlite_url)
    feed = InstanceFeed(store)

    def ev(state: str, seq: int, ip: str | None) -> InstanceEvent:
        return InstanceEvent(instance_id="i-1", domain="alpha", site="s", state=state, seq=seq, ip=ip, at=time.time())

    feed.apply(ev("started", 2, "not-an-ip"))
    assert store.instance_ip("i-1") is None
    feed.apply(ev("started", 2, "10.0.0.7"))
    feed.apply(ev("started", 1, "10.9.9.9"))  # an older entry of a report
    assert store.instance_ip("i-1") == "10.0.0.7"
    feed.apply(ev("joined", 3, "10.0.0.8"))  # the cloud moved it
    assert store.instance_ip("i-1") == "10.0.0.8"
    feed.apply(ev("terminated", 4, None))
    feed.apply(ev("joined", 3, "10.0.0.8"))  # a late event after the end
    assert store.instance_ip("i-1") is None
    assert InstanceFeed(store).apply(ev("joined", 3, "10.0.0.8")) == [] and store.instance_ip("i-1") is None
    store.close()
