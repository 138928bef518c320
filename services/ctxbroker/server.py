"""The HTTPS server: uvicorn around the broker app, startable in a thread (tests) or in the foreground.

Why uvicorn with uvloop and httptools: the updates path is I/O bound with many idle
connections; an event loop holds 10,000 long-polls in one process at little memory.

Why ``BoundedHttp``: uvicorn's httptools protocol reads a request's headers without limit
(64 MB of headers were read in full, before any credential check, doubling the broker's
memory). The wrapper counts each request head's bytes as they arrive and answers 431 and
closes once a head passes ``MAX_HEADER_BYTES``. It also hands uvicorn a transport that joins
the writes of one event-loop step (``CoalescingTransport``): an ASGI answer is two messages,
head and body, which would otherwise be two TLS records and two ``send()`` calls per agent
when 10,000 long-polls wake at once. It only uses public interfaces: asyncio's protocol and
transport methods, httptools' parser, and uvicorn's ``Config(http=<protocol class>)``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httptools
import uvicorn
from epu.services.ctxbroker.api import MembershipHook, create_app
from epu.services.ctxbroker.hub import Hub
from epu.services.ctxbroker.store import Store
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("epu.ctxbroker")

#: Longest request line plus headers accepted (an agent's are a few hundred bytes).
MAX_HEADER_BYTES = 16 * 1024
#: Join each answer's head and body into one write (bench_ctxbroker.py measures without it too).
COALESCE_WRITES = os.environ.get("EPU_CTXBROKER_COALESCE", "1") != "0"


class CoalescingTransport(asyncio.Transport):
    """A transport that joins the writes made in one event-loop step into one write of the
    transport it wraps (flushed by a ``call_soon``, or before a close)."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._t = transport
        self._loop = loop
        self._buf: list[bytes] = []
        self._scheduled = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._buf.append(bytes(data))
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._flush)

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def _flush(self) -> None:
        self._scheduled = False
        if self._buf:
            data = b"".join(self._buf) if len(self._buf) > 1 else self._buf[0]
            self._buf.clear()
            if not self._t.is_closing():
                self._t.write(data)

    def close(self) -> None:
        self._flush()
        self._t.close()

    def abort(self) -> None:
        self._buf.clear()
        self._t.abort()

    def can_write_eof(self) -> bool:
        return self._t.can_write_eof()

    def write_eof(self) -> None:
        self._flush()
        self._t.write_eof()

    def is_closing(self) -> bool:
        return self._t.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._t.get_extra_info(name, default)

    def pause_reading(self) -> None:
        self._t.pause_reading()

    def resume_reading(self) -> None:
        self._t.resume_reading()

    def is_reading(self) -> bool:
        return self._t.is_reading()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._t.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return self._t.get_write_buffer_size() + sum(len(b) for b in self._buf)

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._t.get_write_buffer_limits()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._t.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._t.get_protocol()


class BoundedHttp(asyncio.Protocol):
    """uvicorn's httptools protocol behind a request-head size limit (see module docstring).

    A second httptools parser, fed the same bytes, tells where each request's head starts and
    ends, and hands over the request line and each complete header (their sizes add up). A
    head still incomplete after a read is also counted by the bytes read while in it (a single
    endless header never completes): exactly when it began at the start of a read, from the
    next read when it began in the middle of one (pipelined behind a body). Either way no more
    than ``MAX_HEADER_BYTES`` plus one read is ever taken in."""

    def __init__(self, **uvicorn_args: Any) -> None:
        self.inner = HttpToolsProtocol(**uvicorn_args)
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.in_head = False
        self.in_message = False
        self.head_bytes = 0
        self.parsed_bytes = 0
        self.too_large = False
        self.tracking = True
        self.refused = False

    # -- asyncio.Protocol, delegated
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        inner_transport: Any = transport
        if COALESCE_WRITES:
            inner_transport = CoalescingTransport(transport, asyncio.get_running_loop())  # type: ignore[arg-type]
        self.inner.connection_made(inner_transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.inner.connection_lost(exc)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return
        if self.tracking:
            started_between = not self.in_message
            was_in_head = self.in_head
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserUpgrade:
                self.tracking = False
            except httptools.HttpParserError:
                self.tracking = False  # malformed: uvicorn's own parser answers 400
            if self.in_head and (was_in_head or started_between):
                self.head_bytes += len(data)
            if self.too_large or self.head_bytes > MAX_HEADER_BYTES:
                self._refuse()
                return
        self.inner.data_received(data)

    def _refuse(self) -> None:
        self.refused = True
        body = json.dumps({"detail": f"request header fields larger than {MAX_HEADER_BYTES} bytes"}).encode()
        assert self.transport is not None
        self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body))
        self.transport.close()

    # -- httptools callbacks of the tracking parser
    def on_message_begin(self) -> None:
        self.in_message = self.in_head = True
        self.head_bytes = self.parsed_bytes = 0

    def on_url(self, url: bytes) -> None:
        self._count(len(url) + 16)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)

    def _count(self, n: int) -> None:
        self.parsed_bytes += n
        if self.parsed_bytes > MAX_HEADER_BYTES:
            self.too_large = True

    def on_headers_complete(self) -> None:
        self.in_head = False

    def on_message_complete(self) -> None:
        self.in_message = False


def read_or_create_token(path: str | Path) -> str:
    """The admin token in ``path``; a new random one (file mode 0600) if the file is missing."""
    p = Path(path)
    if p.exists():
        token = p.read_text().strip()
        if len(token) < 16:
            raise ValueError(f"{p}: admin token must be at least 16 characters")
        return token
    token = secrets.token_urlsafe(32)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    log.info("admin token created", extra={"file": str(p)})
    return token


class _Server(uvicorn.Server):
    """uvicorn waits for open requests before the lifespan shutdown; wake the long-polls first so
    a stop takes milliseconds, not the longest poll."""

    hub: Hub | None = None

    async def shutdown(self, sockets: Any = None) -> None:
        if self.hub is not None:
            await self.hub.stop()
        await super().shutdown(sockets)


@dataclass
class ServerSettings:
    host: str
    port: int
    cert_file: str
    key_file: str
    admin_token: str
    store_url: str
    public_url: str | None = None
    refresh_interval: float = 0.5
    backlog: int = 4096
    history_entries: int = 1000
    """Entries of each context's list kept for agents a few behind (older ones: a snapshot)."""


class BrokerServer:
    """One broker process's HTTP side: store, hub, app and uvicorn."""

    def __init__(self, settings: ServerSettings, on_membership: MembershipHook | None = None,
                 store: Store | None = None) -> None:
        self.settings = settings
        self.store = store or Store(settings.store_url, history_entries=settings.history_entries)
        self.hub = Hub(self.store, settings.refresh_interval)
        self.on_membership = on_membership
        self.health_probe: Callable[[], dict[str, Any]] | None = None
        """What else the process owns reports here (the AMQP consumer): /healthz follows it."""
        self._public_url = settings.public_url
        self.server: _Server | None = None
        self._stop_requested = False
        self._started = threading.Event()
        self.app: Any = None

    @property
    def public_url(self) -> str:
        if self._public_url:
            return self._public_url
        return f"https://{self.settings.host}:{self.port}"

    @property
    def port(self) -> int:
        # uvicorn sets ``servers`` only once it starts listening: until then, the configured port
        servers = getattr(self.server, "servers", None) if self.server is not None else None
        if servers:
            for srv in servers:
                for sock in srv.sockets:
                    return int(sock.getsockname()[1])
        return self.settings.port

    def _config(self) -> uvicorn.Config:
        hub = self.hub

        async def lifespan_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] == "lifespan":
                while True:
                    msg = await receive()
                    if msg["type"] == "lifespan.startup":
                        await hub.start()
                        await send({"type": "lifespan.startup.complete"})
                    elif msg["type"] == "lifespan.shutdown":
                        await hub.stop()
                        await send({"type": "lifespan.shutdown.complete"})
                        return
            await self.app(scope, receive, send)

        # the public URL may depend on the bound port (0 in tests): resolve it per request
        probe = (lambda: self.health_probe()) if self.health_probe is not None else None  # noqa: E731
        self.app = create_app(hub, self.settings.admin_token, lambda: self.public_url, self.on_membership,
                              health=probe)
        return uvicorn.Config(
            lifespan_app, host=self.settings.host, port=self.settings.port,
            ssl_certfile=self.settings.cert_file, ssl_keyfile=self.settings.key_file,
            loop="uvloop", http=BoundedHttp, lifespan="on", log_config=None, access_log=False,
            timeout_keep_alive=75, timeout_graceful_shutdown=3, backlog=self.settings.backlog,
            limit_concurrency=None,
        )

    def _make_server(self) -> _Server:
        server = _Server(self._config())
        server.hub = self.hub
        server.should_exit = self._stop_requested  # a stop asked before the server existed
        return server

    def run(self) -> None:
        """Serve in this thread until ``stop()``."""
        self.server = self._make_server()
        self._run_uvloop()

    def _run_uvloop(self) -> None:
        import uvloop

        assert self.server is not None
        server = self.server

        async def main() -> None:
            await server.serve()

        uvloop.run(main())

    def start_in_thread(self, timeout: float = 15.0) -> BrokerServer:
        self.server = self._make_server()
        # a server in a thread must not touch signal handlers
        self.server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
        t = threading.Thread(target=self._run_uvloop, name="ctxbroker-http", daemon=True)
        t.start()
        self._thread = t
        from epu.common.testing import wait_for

        wait_for(lambda: self.server is not None and self.server.started, timeout=timeout,
                 message="context broker HTTPS server to start")
        return self

    def stop(self) -> None:
        self._stop_requested = True
        if self.server is not None:
            self.server.should_exit = True

    def join(self, timeout: float = 10.0) -> None:
        t = getattr(self, "_thread", None)
        if t is not None:
            t.join(timeout)
        self.store.close()
