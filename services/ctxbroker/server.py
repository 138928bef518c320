"""The HTTPS server: uvicorn around the broker app, startable in a thread (tests) or in the foreground.

Why uvicorn with uvloop and httptools: the updates path is I/O bound with many idle
connections; an event loop holds 10,000 long-polls in one process at little memory.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn

from services.ctxbroker.api import MembershipHook, create_app
from services.ctxbroker.hub import Hub
from services.ctxbroker.store import Store

log = logging.getLogger("epu.ctxbroker")


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


class BrokerServer:
    """One broker process's HTTP side: store, hub, app and uvicorn."""

    def __init__(self, settings: ServerSettings, on_membership: MembershipHook | None = None,
                 store: Store | None = None) -> None:
        self.settings = settings
        self.store = store or Store(settings.store_url)
        self.hub = Hub(self.store, settings.refresh_interval)
        self.on_membership = on_membership
        self._public_url = settings.public_url
        self.server: _Server | None = None
        self._started = threading.Event()
        self.app: Any = None

    @property
    def public_url(self) -> str:
        if self._public_url:
            return self._public_url
        return f"https://{self.settings.host}:{self.port}"

    @property
    def port(self) -> int:
        if self.server is not None and self.server.servers:
            for srv in self.server.servers:
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
        self.app = create_app(hub, self.settings.admin_token, lambda: self.public_url, self.on_membership)
        return uvicorn.Config(
            lifespan_app, host=self.settings.host, port=self.settings.port,
            ssl_certfile=self.settings.cert_file, ssl_keyfile=self.settings.key_file,
            loop="uvloop", http="httptools", lifespan="on", log_config=None, access_log=False,
            timeout_keep_alive=75, timeout_graceful_shutdown=3, backlog=self.settings.backlog,
            limit_concurrency=None,
        )

    def _make_server(self) -> _Server:
        server = _Server(self._config())
        server.hub = self.hub
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
        from common.testing import wait_for

        wait_for(lambda: self.server is not None and self.server.started, timeout=timeout,
                 message="context broker HTTPS server to start")
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.should_exit = True

    def join(self, timeout: float = 10.0) -> None:
        t = getattr(self, "_thread", None)
        if t is not None:
            t.join(timeout)
        self.store.close()
