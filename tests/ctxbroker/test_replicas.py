"""Two broker processes' worth of servers on one PostgreSQL database serve one context consistently."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from common.testing import wait_for
from services.ctxbroker.client import AdminClient, NodeClient
from services.ctxbroker.server import BrokerServer
from tests.ctxbroker.conftest import ADMIN_TOKEN, node


def test_two_replicas_on_one_postgres(make_broker: Callable[..., BrokerServer], pg_url: str,
                                      tls_files: tuple[str, str]) -> None:
    # a long re-check interval: waking across replicas must come from LISTEN/NOTIFY
    a = make_broker(pg_url, refresh_interval=30)
    b = make_broker(pg_url, refresh_interval=30)
    admin_a = AdminClient(a.public_url, ADMIN_TOKEN, ca_file=tls_files[0])
    ctx = admin_a.create("shared")
    uri_b = ctx["uri"].replace(a.public_url, b.public_url)

    def client(uri: str) -> NodeClient:
        return NodeClient(uri, ctx["key"], ctx["secret"], ca_file=tls_files[0])

    on_a, on_b = client(ctx["uri"]), client(uri_b)
    # a context created on A is served by B (loaded on a cache miss)
    assert on_b.updates(0)["last_id"] == 0

    # a long-poll parked on B wakes when a node joins through A
    got: dict[str, object] = {}

    def poll() -> None:
        got["doc"] = client(uri_b).updates(0, wait=20)
        got["at"] = time.monotonic()

    t = threading.Thread(target=poll)
    t.start()
    wait_for(lambda: b.hub.waiting == 1, message="long-poll parked on replica B")
    t0 = time.monotonic()
    on_a.join(node(1))
    t.join(10)
    assert [e["hostname"] for e in got["doc"]["entries"]] == ["wn-1"]  # type: ignore[index]
    assert got["at"] - t0 < 1.0  # type: ignore[operator]

    # concurrent joins and leaves through both replicas: one dense order, the same on both
    def churn(c: NodeClient, base: int) -> None:
        for i in range(base, base + 8):
            c.join(node(i))
        for i in range(base, base + 8, 2):
            c.leave(f"wn-{i}")

    threads = [threading.Thread(target=churn, args=(c, base)) for c, base in ((on_a, 100), (on_b, 200))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wait_for(lambda: on_a.updates(0)["last_id"] == on_b.updates(0)["last_id"] == 1 + 2 * 12,
             message="both replicas to see all entries")
    list_a, list_b = on_a.updates(0)["entries"], on_b.updates(0)["entries"]
    assert list_a == list_b
    assert [e["id"] for e in list_a] == list(range(1, 26))
    nodes = {n["hostname"] for n in admin_a.nodes(ctx["id"])}
    assert nodes == {"wn-1"} | {f"wn-{i}" for i in (101, 103, 105, 107, 201, 203, 205, 207)}

    # deleting through A: B answers 404
    admin_a.delete(ctx["id"])
    from services.ctxbroker.client import BrokerError

    def gone() -> bool:
        try:
            on_b.updates(0)
        except BrokerError as exc:
            return exc.status == 404
        return False

    wait_for(gone, message="replica B to forget the deleted context")
    for c in (on_a, on_b, admin_a):
        c.close()
