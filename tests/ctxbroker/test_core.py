"""The functional core: field validation, the join/leave reducer, and convergence of readers."""

from __future__ import annotations

import pytest
from epu.services.ctxbroker.core import (
    Entry,
    NodeFields,
    apply_entry,
    check_credentials,
    entries_after,
    fold,
    hash_secret,
    new_secret,
    next_entry,
    parse_ssh_key,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from tests.ctxbroker.conftest import node, ssh_key


def test_valid_node_is_normalized() -> None:
    n = NodeFields.model_validate(node(1, hostname="WN-1", fqdn="WN-1.Cluster.Test.", ip="::ffff:10.0.0.1",
                                       ssh_host_key=ssh_key(3) + " root@host"))
    assert n.hostname == "wn-1"
    assert n.fqdn == "wn-1.cluster.test"
    assert n.ip == "::ffff:a00:1"
    assert n.ssh_host_key == ssh_key(3)  # comment dropped


@pytest.mark.parametrize("field,value,needle", [
    ("hostname", "-bad", "RFC 1123"),
    ("hostname", "a.b", "one RFC 1123 label"),
    ("hostname", "x" * 64, "at most 63"),
    ("hostname", "", "at least 1"),
    ("fqdn", "a..b", "RFC 1123"),
    ("fqdn", "a b", "RFC 1123"),
    ("ip", "10.0.0.256", "IPv4 or IPv6"),
    ("ip", "localhost", "IPv4 or IPv6"),
    ("ssh_host_key", "ssh-ed25519", "TYPE BASE64"),
    ("ssh_host_key", "ssh-foo AAAA", "type must be one of"),
    ("ssh_host_key", "ssh-ed25519 !!!notbase64", "not valid base64"),
    ("ssh_host_key", "ssh-rsa " + ssh_key(1).split()[1], "does not match its key type"),
    ("data", "x" * 20000, "at most 16384"),
    ("data", "a\x00b", "NUL"),
    ("instance_id", "bad id!", "pattern"),
])
def test_invalid_fields_are_refused_with_a_message(field: str, value: str, needle: str) -> None:
    with pytest.raises(ValidationError) as err:
        NodeFields.model_validate(node(1, **{field: value}))
    assert needle in str(err.value)


def test_unknown_fields_and_wrong_types_are_refused() -> None:
    with pytest.raises(ValidationError):
        NodeFields.model_validate({**node(1), "extra": 1})
    with pytest.raises(ValidationError):
        NodeFields.model_validate({**node(1), "ip": 167772161})


def test_parse_ssh_key_accepts_rsa_style_blob() -> None:
    import base64
    import struct

    blob = struct.pack(">I", 7) + b"ssh-rsa" + b"\x00\x00\x00\x03\x01\x00\x01"
    assert parse_ssh_key("ssh-rsa " + base64.b64encode(blob).decode()).startswith("ssh-rsa ")


def test_joins_and_leaves_are_idempotent() -> None:
    a = NodeFields.model_validate(node(1))
    assert next_entry(None, "join", a)
    assert not next_entry(a, "join", a)  # a re-register adds nothing
    assert next_entry(a, "join", NodeFields.model_validate(node(1, ip="10.9.9.9")))  # a change does
    assert next_entry(a, "leave", None)
    assert not next_entry(None, "leave", None)  # leaving twice adds nothing


def test_entries_after_uses_dense_ids() -> None:
    es = [Entry(i, "join", f"h{i}") for i in range(1, 6)]
    assert [e.entry_id for e in entries_after(es, 0)] == [1, 2, 3, 4, 5]
    assert [e.entry_id for e in entries_after(es, 3)] == [4, 5]
    assert entries_after(es, 5) == []
    assert entries_after(es, 99) == []


def test_credentials_compare_key_and_secret() -> None:
    secret = new_secret()
    h = hash_secret(secret)
    assert check_credentials("k", secret, "k", h)
    assert not check_credentials("k", secret + "x", "k", h)
    assert not check_credentials("other", secret, "k", h)
    assert not check_credentials("k", "", "k", h)
    assert len(secret) >= 43  # 256 bits, urlsafe base64


ops = st.lists(st.tuples(st.sampled_from(["join", "leave"]), st.integers(0, 5), st.integers(0, 2)),
               max_size=40)


@settings(max_examples=200, deadline=None)
@given(ops=ops, cuts=st.lists(st.lists(st.integers(0, 40), max_size=6), min_size=1, max_size=5))
def test_readers_converge_on_the_same_membership(ops: list[tuple[str, int, int]],
                                                 cuts: list[list[int]]) -> None:
    """Any interleaving of joins and leaves, read by agents in any batches, folds to one membership."""
    members: dict[str, NodeFields] = {}
    log: list[Entry] = []
    for kind, host, variant in ops:
        fields = NodeFields.model_validate(node(host, ip=f"10.1.{variant}.{host + 1}")) if kind == "join" else None
        if next_entry(members.get(f"wn-{host}"), kind, fields):  # type: ignore[arg-type]
            e = Entry(len(log) + 1, kind, f"wn-{host}", **({} if fields is None else {  # type: ignore[arg-type]
                "fqdn": fields.fqdn, "ip": fields.ip, "ssh_host_key": fields.ssh_host_key, "data": fields.data}))
            log.append(e)
            members = apply_entry(members, e)
    for agent_cuts in cuts:
        seen, applied = {}, 0
        for cut in sorted(agent_cuts) + [len(log)]:
            batch = [e for e in entries_after(log, applied) if e.entry_id <= max(cut, applied)]
            seen = fold(batch, seen)
            applied = batch[-1].entry_id if batch else applied
        assert applied == len(log)
        assert seen == members


@pytest.mark.parametrize(("fqdn", "domain", "ok"), [
    ("wn-1", "", True), ("wn-1.cluster.test", "", True), ("wn-1.anything.else", "", True),
    ("head", "", False), ("head.cluster.test", "", False), ("wn-10.cluster.test", "", False),
    ("wn-1", "cluster.test", True), ("wn-1.cluster.test", "cluster.test", True),
    ("wn-1.other.test", "cluster.test", False), ("wn-1.cluster.test.evil", "cluster.test", False),
    ("head.cluster.test", "cluster.test", False),
])
def test_a_node_publishes_only_its_own_names(fqdn: str, domain: str, ok: bool) -> None:
    from epu.services.ctxbroker.core import Forbidden, check_names

    n = NodeFields.model_validate(node(1, fqdn=fqdn))
    if ok:
        check_names(n, domain)
    else:
        with pytest.raises(Forbidden, match="not this host's name"):
            check_names(n, domain)


@pytest.mark.parametrize(("instance_id", "ip", "facts", "outcome"), [
    ("i-1", "10.0.0.2", {"instance_ip": "10.0.0.2"}, None),
    ("i-1", "10.0.0.2", {}, "held"),
    ("i-1", "10.0.0.1", {"instance_ip": "10.0.0.2"}, "not this instance's address"),
    ("i-1", "10.0.0.2", {"instance_ip": "10.0.0.2", "member_holding": "wn-9"}, "held by member wn-9"),
    ("i-1", "127.0.0.1", {"instance_ip": "127.0.0.1", "member_holding": "wn-9"}, None),
    (None, "10.0.0.2", {}, None),
    (None, "10.0.0.2", {"instance_holding": "i-7"}, "address of instance i-7"),
    (None, "10.0.0.2", {"member_holding": "head"}, "held by member head"),
])
def test_a_node_publishes_only_its_own_address(instance_id: str | None, ip: str, facts: dict, outcome: str | None) -> None:
    from epu.services.ctxbroker.core import AddressFacts, AddressUnknown, Forbidden, check_address

    n = NodeFields.model_validate(node(1, instance_id=instance_id, ip=ip))
    if outcome is None:
        check_address(n, AddressFacts(**facts))
    elif outcome == "held":
        with pytest.raises(AddressUnknown):
            check_address(n, AddressFacts(**facts))
    else:
        with pytest.raises(Forbidden, match=outcome):
            check_address(n, AddressFacts(**facts))
