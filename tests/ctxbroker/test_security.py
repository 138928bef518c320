"""Per-node credentials: a node joins and leaves only as itself (issue 14).

Before: every node of a context held the context's key and secret (in userdata, readable by
any job through the metadata service) and a join with an existing host name replaced that
entry, so any job on any worker could re-register ``head`` with its own IP and SSH host key.
"""

from __future__ import annotations

import pytest
from epu.common import nodecred
from epu.services.ctxbroker.client import AdminClient, BrokerError, NodeClient

from tests.ctxbroker.conftest import Nodes, node, node_credential, ssh_key


def _refused(call: object, *args: object) -> BrokerError:
    with pytest.raises(BrokerError) as err:
        call(*args)  # type: ignore[operator]
    return err.value


def test_a_worker_cannot_reregister_the_head_node(admin: AdminClient, context: dict[str, str],
                                                  node_client: Nodes, tls_files: tuple[str, str]) -> None:
    head_cred = admin.credential(context["id"], "head")
    head = NodeClient(head_cred["uri"], head_cred["key"], head_cred["secret"], ca_file=tls_files[0])
    real_head = node(0, hostname="head", fqdn="head.cluster.test", ip="10.0.0.1")
    assert head.join(real_head)["changed"] is True
    node_client.join(node(5, instance_id="i-5"))
    # a job on worker wn-5 reads wn-5's userdata: it holds wn-5's credential, and the context's
    # key and secret are not there at all
    worker = node_client.as_node("wn-5", "i-5")
    forged = node(0, hostname="head", fqdn="head.cluster.test", ip="10.6.6.6", ssh_host_key=ssh_key(666))
    assert _refused(worker.join, forged).status == 403
    assert _refused(worker.leave, "head").status == 403
    # nor can it slip its own instance id or another's into an otherwise valid join
    assert _refused(worker.join, node(5, instance_id="i-other")).status == 403
    # the context's own key and secret read, but write nothing either
    reader = NodeClient(context["uri"], context["key"], context["secret"], ca_file=tls_files[0])
    assert _refused(reader.join, forged).status == 403
    assert _refused(reader.leave, "head").status == 403
    assert reader.updates(0)["snapshot"] is True
    members = {n["hostname"]: n for n in admin.nodes(context["id"])}
    assert members["head"]["ip"] == "10.0.0.1" and members["head"]["ssh_host_key"] == real_head["ssh_host_key"]
    assert members["wn-5"]["instance_id"] == "i-5"
    for c in (head, worker, reader):
        c.close()


def test_an_earlier_instance_of_a_reused_name_cannot_remove_its_successor(
        admin: AdminClient, context: dict[str, str], node_client: Nodes) -> None:
    node_client.join(node(1, instance_id="i-old"))
    node_client.join(node(1, instance_id="i-new", ip="10.1.1.1"))  # the slot reused by a new instance
    old = node_client.as_node("wn-1", "i-old")
    assert _refused(old.leave, "wn-1").status == 403
    assert [n["instance_id"] for n in admin.nodes(context["id"])] == ["i-new"]
    # the current instance leaves as itself; the admin may remove any node
    assert node_client.leave("wn-1", "i-new")["changed"] is True
    node_client.join(node(2, instance_id="i-2"))
    assert admin.remove_node(context["id"], "wn-2")["changed"] is True
    assert admin.nodes(context["id"]) == []
    old.close()


def test_an_omitted_instance_id_is_filled_from_the_credential(admin: AdminClient, context: dict[str, str],
                                                              node_client: Nodes) -> None:
    doc = node(3)
    doc.pop("instance_id", None)
    assert node_client.store is not None
    node_client.store.note_instance("i-3", str(doc["ip"]))
    c = node_client.as_node("wn-3", "i-3")
    c.join(doc)
    c.close()
    assert [n["instance_id"] for n in admin.nodes(context["id"])] == ["i-3"]


def test_credentials_are_derived_the_same_on_both_sides(admin: AdminClient, context: dict[str, str]) -> None:
    """The broker (admin endpoint) and the provisioner (derivation from the secret) agree."""
    issued = admin.credential(context["id"], "wn-9", "i-9")
    derived = node_credential(context, "WN-9.cluster.test", "i-9")  # a node name is reduced to its short name
    assert (issued["key"], issued["secret"]) == (derived.key, derived.secret) == (
        "node/wn-9/i-9", derived.secret)
    sk = nodecred.signing_key(context["secret"])
    assert nodecred.verify(sk, context["id"], derived.key, derived.secret) == nodecred.NodeIdentity("wn-9", "i-9")
    assert nodecred.verify(sk, "another", derived.key, derived.secret) is None
    assert nodecred.verify(sk, context["id"], "node/wn-8/i-9", derived.secret) is None
    with pytest.raises(ValueError):
        nodecred.issue(sk, context["id"], "bad_name", None)
