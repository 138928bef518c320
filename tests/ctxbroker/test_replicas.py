"""Two broker processes' worth of servers on one PostgreSQL database serve one context consistently."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from epu.common.testing import wait_for
from epu.services.ctxbroker.client import AdminClient, NodeClient
from epu.services.ctxbroker.server import BrokerServer

from tests.ctxbroker.conftest import ADMIN_TOKEN, Nodes, node


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

    on_a, on_b = Nodes(ctx, tls_files[0]), Nodes(ctx, tls_files[0], uri=uri_b)
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
    def churn(c: Nodes, base: int) -> None:
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
    assert on_a.updates(0) == on_b.updates(0)  # the same snapshot
    tail_a, tail_b = on_a.updates(20), on_b.updates(20)  # and the same entries after 20
    assert tail_a == tail_b and [e["id"] for e in tail_a["entries"]] == [21, 22, 23, 24, 25]
    assert [e.entry_id for e in a.store.entries(ctx["id"])] == list(range(1, 26))  # one dense order
    nodes = {n["hostname"] for n in admin_a.nodes(ctx["id"])}
    assert nodes == {"wn-1"} | {f"wn-{i}" for i in (101, 103, 105, 107, 201, 203, 205, 207)}

    # deleting through A: B answers 404
    admin_a.delete(ctx["id"])
    from epu.services.ctxbroker.client import BrokerError

    def gone() -> bool:
        try:
            on_b.updates(0)
        except BrokerError as exc:
            return exc.status == 404
        return False

    wait_for(gone, message="replica B to forget the deleted context")
    for c in (on_a, on_b, admin_a):
        c.close()
