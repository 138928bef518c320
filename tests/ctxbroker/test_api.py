"""The HTTPS API on a live broker (SQLite): admin, node, long-poll, auth failures and bad input."""

from __future__ import annotations

import base64
import threading
import time

import httpx
import pytest

from services.ctxbroker.client import AdminClient, BrokerError, NodeClient
from services.ctxbroker.server import BrokerServer
from tests.ctxbroker.conftest import ADMIN_TOKEN, node


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


def test_join_update_leave_and_ordered_list(node_client: NodeClient, admin: AdminClient,
                                            context: dict[str, str]) -> None:
    assert node_client.updates(0) == {"context_id": context["id"], "last_id": 0, "entries": []}
    assert node_client.join(node(1)) == {"changed": True, "entry_id": 1, "last_id": 1}
    assert node_client.join(node(1))["changed"] is False  # re-register: no new entry
    node_client.join(node(2))
    node_client.join(node(1, ip="10.7.7.7"))  # changed fields: a new join entry
    node_client.leave("wn-2")
    assert node_client.leave("wn-2")["changed"] is False
    doc = node_client.updates(0)
    assert [(e["id"], e["kind"], e["hostname"]) for e in doc["entries"]] == [
        (1, "join", "wn-1"), (2, "join", "wn-2"), (3, "join", "wn-1"), (4, "leave", "wn-2")]
    assert [e["id"] for e in node_client.updates(2)["entries"]] == [3, 4]
    assert node_client.updates(4)["entries"] == []
    assert [n["ip"] for n in admin.nodes(context["id"])] == ["10.7.7.7"]


def test_long_poll_wakes_within_a_second(broker_server: BrokerServer, context: dict[str, str],
                                         tls_files: tuple[str, str]) -> None:
    from common.testing import wait_for

    poller = NodeClient(context["uri"], context["key"], context["secret"], ca_file=tls_files[0])
    joiner = NodeClient(context["uri"], context["key"], context["secret"], ca_file=tls_files[0])
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
    assert broker_server.hub.direct_answers == 1  # answered from the wake-up loop, not by its task
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
    bad_node = [
        {},
        {"Authorization": "Basic !!!"},
        {"Authorization": "Basic " + base64.b64encode(b"nocolon").decode()},
        _basic(context["key"], context["secret"] + "x"),
        _basic(context["key"], ""),
        _basic("wrong", context["secret"]),
        _basic(other["key"], other["secret"]),  # another context's credentials
        {"Authorization": f"Bearer {ADMIN_TOKEN}"},  # the admin token is not a node credential
    ]
    with _raw(broker_server, tls_files) as http:
        for headers in bad_node:
            for method, path, kw in [("GET", f"/v1/contexts/{cid}/updates", {}),
                                     ("GET", f"/v1/contexts/{cid}/updates?wait=5", {}),
                                     ("POST", f"/v1/contexts/{cid}/nodes", {"json": node(1)}),
                                     ("DELETE", f"/v1/contexts/{cid}/nodes/wn-1", {})]:
                r = http.request(method, path, headers=headers, **kw)
                assert r.status_code == 401, (method, path, headers, r.text)
                assert r.json()["detail"] and context["secret"] not in r.text
        bad_admin = [{}, {"Authorization": "Bearer nope"}, {"Authorization": f"Bearer {ADMIN_TOKEN}x"},
                     {"Authorization": ADMIN_TOKEN}, good]
        for headers in bad_admin:
            for method, path in [("GET", "/v1/contexts"), ("POST", "/v1/contexts"), ("GET", f"/v1/contexts/{cid}"),
                                 ("DELETE", f"/v1/contexts/{cid}"), ("GET", f"/v1/contexts/{cid}/nodes")]:
                r = http.request(method, path, headers=headers, json={"name": "x"})
                assert r.status_code == 401, (method, path, headers)
        # nothing was changed by any refused request
        assert http.get(f"/v1/contexts/{cid}/updates", headers=good).json()["last_id"] == 0
        assert admin.show(cid)["name"] == "test"
        http.post(f"/v1/contexts/{cid}/nodes", json=node(1), headers=good).raise_for_status()
    # secrets and tokens never reach a log line
    assert "context created" in caplog.text and "node joined" in caplog.text
    for secret in (context["secret"], other["secret"], ADMIN_TOKEN):
        assert secret not in caplog.text


def test_unknown_context_is_404(broker_server: BrokerServer, tls_files: tuple[str, str],
                                context: dict[str, str]) -> None:
    good = _basic(context["key"], context["secret"])
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
    good = _basic(context["key"], context["secret"])
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


def test_plain_asgi_servers_get_standard_messages() -> None:
    """The one-write shortcut only applies to uvicorn's protocol; any other server gets plain ASGI."""
    import asyncio

    from services.ctxbroker.api import _send

    sent: list[dict[str, object]] = []

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    asyncio.run(_send(send, 200, b"{}", {"WWW-Authenticate": "Basic"}))
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert (b"www-authenticate", b"Basic") in sent[0]["headers"]  # type: ignore[operator]
