"""A TCP proxy a test controls, between a client and a real server (e.g. RabbitMQ).

``stop()`` closes the listening socket and resets every proxied connection — to the client
it looks exactly like the broker going away; ``start()`` listens again on the same port — the
broker is back. ``hold_replies()`` (an AMQP proxy: ``amqp=True``) keeps back what the broker
sends on its channels while passing its connection-level frames and heartbeats — to the client
it looks exactly like RabbitMQ out of file handles (issue 34): the connection lives, the
broker's heartbeats come, but no channel.open-ok, queue.declare-ok or delivery ever does;
``release_replies()`` sends what was held, in order. Nothing is faked: every byte goes to and
from the real server, late or at once.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import struct
import threading

#: AMQP 0-9-1 frame: type (1 byte), channel (2), payload size (4), payload, frame-end (0xCE).
_FRAME_HEADER = struct.Struct(">BHI")
_HEARTBEAT_FRAME = 8


class _AmqpHold:
    """The broker-to-client byte stream cut into frames: connection-level frames (channel 0) and
    heartbeats pass, the others wait in ``held`` while ``holding``."""

    def __init__(self) -> None:
        self.buffer = b""
        self.held: list[bytes] = []

    def feed(self, data: bytes, holding: bool, everything: bool = False) -> bytes:
        """What to send the client now, of ``data`` and what was held before (``everything``:
        connection-level frames too, the greeting included)."""
        self.buffer += data
        out: list[bytes] = []
        if not holding and self.held:
            out, self.held = self.held, []
        while len(self.buffer) >= _FRAME_HEADER.size:
            kind, channel, size = _FRAME_HEADER.unpack_from(self.buffer)
            end = _FRAME_HEADER.size + size + 1
            if len(self.buffer) < end:
                break
            frame, self.buffer = self.buffer[:end], self.buffer[end:]
            if holding and (everything or channel != 0) and kind != _HEARTBEAT_FRAME:
                self.held.append(frame)
            else:
                out.append(frame)
        return b"".join(out)


class TcpProxy:
    def __init__(self, upstream_host: str, upstream_port: int, port: int = 0, *, amqp: bool = False) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = port or self._free_port()
        self.amqp = amqp
        """The upstream speaks AMQP 0-9-1: the broker's frames are followed, so they can be held."""
        self._listener: socket.socket | None = None
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._accepting: threading.Thread | None = None
        self._holding = threading.Event()
        self._hold_all = False
        self.accepted = 0

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def hold_replies(self, greetings: bool = False) -> None:
        """From now on the broker's channel frames wait here (connections already open too);
        ``greetings``: its connection-level frames too, so a new connection is never greeted —
        RabbitMQ with no file handle left for a new socket."""
        assert self.amqp, "hold_replies() needs TcpProxy(..., amqp=True)"
        self._hold_all = greetings
        self._holding.set()

    def release_replies(self) -> None:
        """What was held goes to the clients, in order, and nothing is held any more."""
        self._holding.clear()

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
        """``a``: the client, ``b``: the server."""
        sel = selectors.DefaultSelector()
        frames = _AmqpHold() if self.amqp else None
        try:
            sel.register(a, selectors.EVENT_READ, b)
            sel.register(b, selectors.EVENT_READ, a)
            while True:
                for key, _ in sel.select(timeout=0.1 if frames and frames.held else 1.0):
                    src: socket.socket = key.fileobj  # type: ignore[assignment]
                    data = src.recv(65536)
                    if not data:
                        return
                    if frames is not None and src is b:
                        data = frames.feed(data, self._holding.is_set(), self._hold_all)
                    if data:
                        key.data.sendall(data)
                if frames is not None and frames.held and not self._holding.is_set():
                    a.sendall(frames.feed(b"", False))  # released while the broker is quiet
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
