"""The HTTPS API on a live broker (SQLite): admin, node, long-poll, auth failures and bad input."""

from __future__ import annotations

import base64
import threading
import time
from pathlib import Path

import httpx
import pytest
from epu.services.ctxbroker.client import AdminClient, BrokerError, NodeClient
from epu.services.ctxbroker.server import BrokerServer

from tests.ctxbroker.conftest import ADMIN_TOKEN, Nodes, node, node_credential


def test_admin_create_list_show_delete(admin: AdminClient) -> None:
    a = admin.create("alpha")
    b = admin.create("beta")
    assert set(a) == {"id", "name", "uri", "key", "secret"}
    assert a["uri"].endswith(f"/v1/contexts/{a['id']}") and a["uri"].startswith("https://")
    assert a["secret"] != b["secret"] and a["key"] != b["key"] and len(a["secret"]) >= 43
    assert [c["name"] for c in admin.list()] == ["alpha", "beta"]
    shown = admin.show(a["id"])
    assert shown["last_id"] == 0 and shown["nodes"] == 0 and "secret" not in shown
    admin.delete(a["id"])
    with pytest.raises(BrokerError) as err:
        admin.show(a["id"])
    assert err.value.status == 404
    assert [c["name"] for c in admin.list()] == ["beta"]


def test_join_update_leave_and_ordered_list(node_client: Nodes, admin: AdminClient,
                                            context: dict[str, str]) -> None:
    assert node_client.updates(0) == {"context_id": context["id"], "last_id": 0, "snapshot": False, "entries": []}
    assert node_client.join(node(1)) == {"changed": True, "entry_id": 1, "last_id": 1}
    assert node_client.join(node(1))["changed"] is False  # re-register: no new entry
    node_client.join(node(2))
    node_client.join(node(3))
    node_client.join(node(1, ip="10.7.7.7"))  # changed fields: a new join entry
    node_client.leave("wn-2")
    assert node_client.leave("wn-2")["changed"] is False
    # a few entries behind: the entries, in order
    doc = node_client.updates(3)
    assert doc["snapshot"] is False and doc["last_id"] == 5
    assert [(e["id"], e["kind"], e["hostname"]) for e in doc["entries"]] == [(4, "join", "wn-1"), (5, "leave", "wn-2")]
    assert node_client.updates(5)["entries"] == []
    # a new agent: the current members as one snapshot at the newest id, not the history
    snap = node_client.updates(0)
    assert snap["snapshot"] is True and snap["last_id"] == 5
    assert [(e["id"], e["kind"], e["hostname"], e["ip"]) for e in snap["entries"]] == [
        (3, "join", "wn-3", node(3)["ip"]), (4, "join", "wn-1", "10.7.7.7")]
    # further behind than the membership is long: a snapshot is the shorter way there
    assert node_client.updates(1)["snapshot"] is True
    assert sorted(n["ip"] for n in admin.nodes(context["id"])) == sorted(["10.7.7.7", str(node(3)["ip"])])


def test_long_poll_wakes_within_a_second(broker_server: BrokerServer, context: dict[str, str],
                                         tls_files: tuple[str, str]) -> None:
    from epu.common.testing import wait_for

    poller = NodeClient(context["uri"], context["key"], context["secret"], ca_file=tls_files[0])
    cred = node_credential(context, "wn-5")
    joiner = NodeClient(context["uri"], cred.key, cred.secret, ca_file=tls_files[0])
    result: dict[str, object] = {}

    def poll() -> None:
        result["doc"] = poller.updates(0, wait=20)
        result["at"] = time.monotonic()

    t = threading.Thread(target=poll)
    t.start()
    wait_for(lambda: broker_server.hub.waiting == 1, message="the long-poll to be parked")
    t0 = time.monotonic()
    joiner.join(node(5))
    t.join(10)
    assert [e["hostname"] for e in result["doc"]["entries"]] == ["wn-5"]  # type: ignore[index]
    assert result["at"] - t0 < 1.0  # type: ignore[operator]
    # an empty wait returns after its timeout with no entries
    t1 = time.monotonic()
    assert poller.updates(1, wait=0.3)["entries"] == []
    assert 0.25 < time.monotonic() - t1 < 5
    poller.close()
    joiner.close()


def _raw(broker_server: BrokerServer, tls_files: tuple[str, str]) -> httpx.Client:
    return httpx.Client(base_url=broker_server.public_url, verify=__import__("ssl").create_default_context(
        cafile=tls_files[0]), timeout=10)


def _basic(key: str, secret: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{key}:{secret}".encode()).decode()}


def test_every_auth_failure_is_refused(broker_server: BrokerServer, tls_files: tuple[str, str],
                                       admin: AdminClient, context: dict[str, str],
                                       caplog: pytest.LogCaptureFixture) -> None:
    other = admin.create("other")
    cid = context["id"]
    good = _basic(context["key"], context["secret"])
    wn1 = node_credential(context, "wn-1")
    wn1_basic = _basic(wn1.key, wn1.secret)
    other_wn1 = node_credential(other, "wn-1")
    bad_node = [
        {},
        {"Authorization": "Basic !!!"},
        {"Authorization": "Basic " + base64.b64encode(b"nocolon").decode()},
        _basic(context["key"], context["secret"] + "x"),
        _basic(context["key"], ""),
        _basic("wrong", context["secret"]),
        _basic(other["key"], other["secret"]),  # another context's credentials
        _basic(other_wn1.key, other_wn1.secret),  # a node credential of another context
        _basic(wn1.key, wn1.secret + "x"),  # a node credential, wrong secret
        _basic("node/wn-2/", wn1.secret),  # wn-1's secret with another host name
        _basic("node/wn-1/i-1", wn1.secret),  # ... or another instance id
        _basic("node/wn-1", wn1.secret),  # malformed node user
        {"Authorization": f"Bearer {ADMIN_TOKEN}"},  # the admin token is not a node credential
    ]
    with _raw(broker_server, tls_files) as http:
        for headers in bad_node:
            for method, path, kw in [("GET", f"/v1/contexts/{cid}/updates", {}),
                                     ("GET", f"/v1/contexts/{cid}/updates?wait=5", {}),
                                     ("POST", f"/v1/contexts/{cid}/nodes", {"json": node(1)}),
                                     ("DELETE", f"/v1/contexts/{cid}/nodes/wn-1", {})]:
                if headers.get("Authorization", "").startswith("Bearer") and method == "DELETE":
                    continue  # the admin may remove a node (test_security)
                r = http.request(method, path, headers=headers, **kw)
                assert r.status_code == 401, (method, path, headers, r.text)
                assert r.json()["detail"] and context["secret"] not in r.text
        bad_admin = [{}, {"Authorization": "Bearer nope"}, {"Authorization": f"Bearer {ADMIN_TOKEN}x"},
                     {"Authorization": ADMIN_TOKEN}, good, wn1_basic]
        for headers in bad_admin:
            for method, path in [("GET", "/v1/contexts"), ("POST", "/v1/contexts"), ("GET", f"/v1/contexts/{cid}"),
                                 ("DELETE", f"/v1/contexts/{cid}"), ("GET", f"/v1/contexts/{cid}/nodes"),
                                 ("POST", f"/v1/contexts/{cid}/credentials")]:
                r = http.request(method, path, headers=headers, json={"name": "x", "hostname": "head"})
                assert r.status_code == 401, (method, path, headers)
        # nothing was changed by any refused request
        assert http.get(f"/v1/contexts/{cid}/updates", headers=good).json()["last_id"] == 0
        assert admin.show(cid)["name"] == "test"
        http.post(f"/v1/contexts/{cid}/nodes", json=node(1), headers=wn1_basic).raise_for_status()
    # secrets and tokens never reach a log line
    assert "context created" in caplog.text and "node joined" in caplog.text
    for secret in (context["secret"], other["secret"], ADMIN_TOKEN, wn1.secret):
        assert secret not in caplog.text


def test_unknown_context_is_404(broker_server: BrokerServer, tls_files: tuple[str, str],
                                context: dict[str, str]) -> None:
    cred = node_credential(context, "wn-1")
    good = _basic(cred.key, cred.secret)
    with _raw(broker_server, tls_files) as http:
        for method, path in [("GET", "/v1/contexts/nosuch/updates"), ("POST", "/v1/contexts/nosuch/nodes"),
                             ("DELETE", "/v1/contexts/nosuch/nodes/wn-1")]:
            assert http.request(method, path, headers=good, json=node(1)).status_code == 404
        admin_h = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        for method, path in [("GET", "/v1/contexts/nosuch"), ("DELETE", "/v1/contexts/nosuch"),
                             ("GET", "/v1/contexts/nosuch/nodes")]:
            r = http.request(method, path, headers=admin_h)
            assert r.status_code == 404 and r.json()["detail"] == "unknown context"


def test_bad_input_is_4xx_with_a_message_and_the_broker_keeps_serving(
        broker_server: BrokerServer, tls_files: tuple[str, str], context: dict[str, str]) -> None:
    cid = context["id"]
    cred = node_credential(context, "wn-1")
    good = _basic(cred.key, cred.secret)
    cases = [
        (b"{not json", 422, "JSON"),
        (b"[]", 422, ""),
        (b'{"hostname": "wn-1"}', 422, "fqdn"),
        (__import__("json").dumps(node(1, hostname="bad_name")).encode(), 422, "RFC 1123"),
        (__import__("json").dumps(node(1, ip="999.1.1.1")).encode(), 422, "IPv4 or IPv6"),
        (__import__("json").dumps(node(1, ssh_host_key="ssh-ed25519 AAAA")).encode(), 422, "ssh_host_key"),
        (__import__("json").dumps(node(1, data="x" * 17000)).encode(), 422, "16384"),
        (b'{"data": "' + b"x" * 70000 + b'"}', 413, "larger than"),
    ]
    with _raw(broker_server, tls_files) as http:
        for body, status, needle in cases:
            r = http.post(f"/v1/contexts/{cid}/nodes", content=body,
                          headers={**good, "Content-Type": "application/json"})
            assert r.status_code == status, (body[:60], r.text)
            assert needle in r.text
            assert r.json()["detail"]
        for query, needle in [("after=-1", "after"), ("after=x", "after"), ("wait=61", "wait"),
                              ("wait=nan", "wait"), ("wait=-1", "wait")]:
            r = http.get(f"/v1/contexts/{cid}/updates?{query}", headers=good)
            assert r.status_code == 422 and needle in r.json()["detail"]
        # still serving, nothing stored
        r = http.get(f"/v1/contexts/{cid}/updates", headers=good)
        assert r.status_code == 200 and r.json()["entries"] == []
        assert http.get("/healthz").json()["ok"] is True


def test_openapi_is_served_and_matches_the_committed_copy(broker_server: BrokerServer,
                                                          tls_files: tuple[str, str]) -> None:
    import json
    from pathlib import Path

    with _raw(broker_server, tls_files) as http:
        served = http.get("/openapi.json").json()
    committed = json.loads((Path(__file__).resolve().parents[2] / "docs" / "ctxbroker-openapi.json").read_text())
    assert served == committed
    assert "/v1/contexts/{context_id}/updates" in served["paths"]


def test_answers_are_plain_asgi_messages() -> None:
    """No server internals: every answer is the two standard ASGI messages (issue 14)."""
    import asyncio

    from epu.services.ctxbroker.api import _send

    sent: list[dict[str, object]] = []

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    asyncio.run(_send(send, 200, b"{}", {"WWW-Authenticate": "Basic"}))
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert (b"www-authenticate", b"Basic") in sent[0]["headers"]  # type: ignore[operator]
    import epu.services.ctxbroker.api as api_module

    assert "_write_whole" not in Path(api_module.__file__).read_text()
