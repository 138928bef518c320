"""A TCP proxy a test controls, between a client and a real server (e.g. RabbitMQ).

``stop()`` closes the listening socket and resets every proxied connection — to the client
it looks exactly like the broker going away; ``start()`` listens again on the same port — the
broker is back. Nothing is faked: every byte goes to and from the real server.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import struct
import threading


class TcpProxy:
    def __init__(self, upstream_host: str, upstream_port: int, port: int = 0) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = port or self._free_port()
        self._listener: socket.socket | None = None
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._accepting: threading.Thread | None = None
        self.accepted = 0

    @staticmethod
    def _free_port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    @property
    def running(self) -> bool:
        return self._listener is not None

    def start(self) -> TcpProxy:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        self._accepting = threading.Thread(target=self._accept, args=(listener,), daemon=True,
                                           name=f"proxy-{self.port}")
        self._accepting.start()
        return self

    def stop(self) -> None:
        """The broker vanishes: no new connections, every open one reset."""
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        if self._accepting is not None:
            self._accepting.join(5)
        with self._lock:
            conns, self._conns = self._conns, set()
        for s in conns:
            with contextlib.suppress(OSError):
                # RST rather than FIN: an abrupt loss, as when a broker host dies
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            with contextlib.suppress(OSError):
                s.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            self.accepted += 1
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    server.close()
                    return
                self._conns |= {client, server}
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        sel = selectors.DefaultSelector()
        try:
            sel.register(a, selectors.EVENT_READ, b)
            sel.register(b, selectors.EVENT_READ, a)
            while True:
                for key, _ in sel.select(timeout=1.0):
                    src: socket.socket = key.fileobj  # type: ignore[assignment]
                    data = src.recv(65536)
                    if not data:
                        return
                    key.data.sendall(data)
                with self._lock:
                    if a not in self._conns:
                        return
        except (OSError, ValueError):
            return
        finally:
            sel.close()
            for s in (a, b):
                with self._lock:
                    self._conns.discard(s)
                with contextlib.suppress(OSError):
                    s.close()
