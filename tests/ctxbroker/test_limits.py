"""Request size limits on the live HTTPS broker (issue 12): headers are bounded before anything
else reads them (431), bodies by size whatever their framing (413), and the connection is
closed; what the client still sends is discarded, never buffered (the broker's memory stays
flat: 64 MB of headers used to grow it by 86 MB before the 401)."""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from epu.services.ctxbroker.api import MAX_BODY_BYTES
from epu.services.ctxbroker.server import MAX_HEADER_BYTES, BrokerServer

from tests.ctxbroker.conftest import node, node_credential


def _connect(server: BrokerServer, ca: str) -> ssl.SSLSocket:
    ctx = ssl.create_default_context(cafile=ca)
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    return ctx.wrap_socket(sock, server_hostname="localhost")


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@contextmanager
def peak_rss_growth() -> Iterator[dict[str, float]]:
    """How far this process's RSS (the broker runs in it) rose above its start, sampled."""
    out = {"mb": 0.0}
    base = _rss_mb()
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            out["mb"] = max(out["mb"], _rss_mb() - base)
            stop.wait(0.005)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        yield out
    finally:
        stop.set()
        t.join()


def _send_until_closed(s: ssl.SSLSocket, head: bytes, filler: bytes, total: int) -> int:
    """Send ``head`` then ``filler`` repeatedly up to ``total`` bytes; return how many went out
    before the server closed the connection."""
    sent = 0
    try:
        s.sendall(head)
        sent = len(head)
        while sent < total:
            s.sendall(filler)
            sent += len(filler)
    except (BrokenPipeError, ConnectionResetError, ssl.SSLError, TimeoutError, OSError):
        pass
    return sent


def _response(s: ssl.SSLSocket) -> tuple[int, dict[str, str], bytes]:
    data = b""
    deadline = time.monotonic() + 10
    while b"\r\n\r\n" not in data and time.monotonic() < deadline:
        try:
            chunk = s.recv(65536)
        except (ConnectionResetError, ssl.SSLError, OSError):
            break
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    while len(body) < int(headers.get("content-length", 0)):
        chunk = s.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(lines[0].split()[1]), headers, body


def test_huge_headers_get_431_and_are_not_read(broker_server: BrokerServer, context: dict[str, str],
                                               tls_files: tuple[str, str]) -> None:
    s = _connect(broker_server, tls_files[0])
    head = f"GET /v1/contexts/{context['id']}/updates HTTP/1.1\r\nHost: localhost\r\nX-Pad: ".encode()
    with peak_rss_growth() as growth:
        _send_until_closed(s, head, b"a" * 16384, 64 * 1024 * 1024)
        status, headers, body = _response(s)
    s.close()
    assert status == 431 and "header" in json.loads(body)["detail"]
    assert headers.get("connection") == "close"
    assert growth["mb"] < 24, growth  # 64 MB sent, none of it kept
    # many small headers add up the same way
    s = _connect(broker_server, tls_files[0])
    many = b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 100) for i in range(MAX_HEADER_BYTES // 100 + 10))
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n" + many + b"\r\n")
    assert _response(s)[0] == 431
    s.close()
    # the broker keeps serving; a normal request (keep-alive, a second one after it) is fine
    s = _connect(broker_server, tls_files[0])
    for _ in range(2):
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Ok: " + b"b" * 2000 + b"\r\n\r\n")
        status, _, body = _response(s)
        assert status == 200 and json.loads(body)["ok"] is True
    s.close()


def test_a_chunked_body_over_the_limit_gets_413_and_the_connection_closes(
        broker_server: BrokerServer, context: dict[str, str], tls_files: tuple[str, str]) -> None:
    import base64

    cred = node_credential(context, "wn-1")
    auth = base64.b64encode(f"{cred.key}:{cred.secret}".encode()).decode()
    s = _connect(broker_server, tls_files[0])
    head = (f"POST /v1/contexts/{context['id']}/nodes HTTP/1.1\r\nHost: localhost\r\n"
            f"Authorization: Basic {auth}\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n").encode()
    chunk = b"4000\r\n" + b"x" * 0x4000 + b"\r\n"
    with peak_rss_growth() as growth:
        _send_until_closed(s, head, chunk, 64 * 1024 * 1024)
        status, headers, body = _response(s)
    s.close()
    assert status == 413 and str(MAX_BODY_BYTES) in json.loads(body)["detail"]  # was 400
    assert headers.get("connection") == "close"
    assert growth["mb"] < 24, growth
    # a chunked body under the limit is read whole and handled as usual
    s = _connect(broker_server, tls_files[0])
    doc = json.dumps(node(1)).encode()
    s.sendall(head + b"%x\r\n%s\r\n0\r\n\r\n" % (len(doc), doc))
    status, _, body = _response(s)
    s.close()
    assert status == 200 and json.loads(body)["changed"] is True
