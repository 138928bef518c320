"""A broker that stops answering: every synchronous AMQP call of the runtime has a deadline.

Why: py-amqp waits for a method's reply (channel.open-ok, queue.declare-ok, basic.qos-ok,
basic.consume-ok, basic.cancel-ok, confirm.select-ok) with no deadline, and sends no heartbeats
while it waits. A RabbitMQ whose channel cannot answer keeps the connection itself — and its own
heartbeats — alive: out of file handles, a classic queue's process blocks opening its index and
the declare never returns (issue 34). The client then sits silent until the broker drops it for
missed heartbeats (two to three heartbeat periods: 90 s with the default 30 s), or forever with
heartbeats off, while its /healthz says only "waiting for broker". Measured on RabbitMQ 3.10.8:
the demo's tap did exactly that, ``epu demo-tap`` authenticated and then said nothing for 90 s.

``bounded(conn, seconds, what)`` arms a timer around such calls; when it fires, the connection's
socket is shut down, which wakes the blocked read, and the call raises ``BrokerStalled`` naming
what went unanswered. The caller's usual path for a lost connection follows (the runtime
reconnects with backoff and reports the error on /healthz; a publish retries on a new
connection). Shutting the socket down rather than closing it: the blocked thread still owns the
descriptor, and a descriptor closed under it could be reused by another connection meanwhile.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

#: Seconds a synchronous broker call may go unanswered (``Broker.call_timeout``'s default): a
#: healthy broker answers in milliseconds, a loaded one or a quorum queue electing its leader in
#: seconds; well under the 60-90 s after which RabbitMQ drops a client that sent no heartbeat.
CALL_TIMEOUT = 30.0


class BrokerStalled(ConnectionError):
    """The broker kept the connection open but did not answer ``what`` within ``seconds``."""

    def __init__(self, what: str, seconds: float) -> None:
        super().__init__(f"the broker did not answer {what} within {seconds:g} s (connection open, no reply: "
                         f"is it out of file handles? docs/deploy.md, 'The broker's file handles')")
        self.what = what
        self.seconds = seconds


def _socket_of(conn: Any) -> socket.socket | None:
    """The TCP socket under a kombu or py-amqp connection (None for memory://)."""
    inner = getattr(conn, "_connection", None) if hasattr(conn, "transport_cls") else conn
    transport = getattr(inner, "transport", None)
    sock = getattr(transport, "sock", None)
    return sock if isinstance(sock, socket.socket) else None


def break_connection(conn: Any) -> None:
    """Shut the connection's socket down (both ways) from any thread: a read blocked on it returns."""
    sock = _socket_of(conn)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def bounded(conn: Any, seconds: float, what: str, on_stall: Callable[[str], None] | None = None) -> Iterator[None]:
    """Run the block's broker calls on ``conn`` within ``seconds`` (0: no deadline), else break the
    connection and raise ``BrokerStalled``. ``on_stall(what)`` is called once when it fires (a
    metric). Also raised when the deadline passed just as the block finished: the connection is
    broken then, and must not be used."""
    if seconds <= 0 or _socket_of(conn) is None:
        yield
        return
    fired = threading.Event()

    def fire() -> None:
        fired.set()
        break_connection(conn)
        if on_stall is not None:
            on_stall(what)

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.name = f"broker-deadline: {what}"[:60]
    timer.start()
    try:
        yield
    except Exception as exc:
        if fired.is_set():
            raise BrokerStalled(what, seconds) from exc
        raise
    finally:
        timer.cancel()
    if fired.is_set():
        raise BrokerStalled(what, seconds)
