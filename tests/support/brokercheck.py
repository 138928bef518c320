"""Whether the machine's RabbitMQ completes an AMQP handshake: what the suite asks at its start and
before each module that needs the broker (tests/conftest.py).

Why: a RabbitMQ out of file handles accepts TCP connections but never greets them (its readers
wait for a handle; issue 34). Every test after that point waited out its own connect timeout and
failed — 25 failures and errors in 12 minutes, none saying why. Asked before each module, the
suite stops at the first sign with one line that says what the broker did and how many file
handles it has left.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time

import amqp
from amqp import exceptions as amqp_exc

#: Seconds the whole check may take (several attempts): a loaded 2-core machine has taken over
#: 5 s for one handshake; a stalled broker never completes one.
CHECK_SECONDS = float(os.environ.get("EPU_TEST_BROKER_CHECK_SECONDS", "15"))

#: Seconds one attempt may take.
ATTEMPT_SECONDS = 5.0


def _attempt(host: str, port: int, user: str, password: str, timeout: float) -> str | None:
    conn = amqp.Connection(f"{host}:{port}", userid=user, password=password, virtual_host="/",
                           connect_timeout=timeout, heartbeat=0,
                           client_properties={"connection_name": f"epu test suite broker check (pid {os.getpid()})"})
    try:
        conn.connect()
    except (amqp_exc.AccessRefused, amqp_exc.NotAllowed):
        conn.collect()
        return None  # the broker answered (a refusal is an answer): alive
    except Exception as exc:  # noqa: BLE001 - any other way of not completing the handshake
        conn.collect()
        return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    try:
        conn.transport.sock.settimeout(timeout)  # the close too: a broker that greets answers it at once
        conn.close()
    except Exception:  # noqa: BLE001 - it answered the handshake: that is what was asked
        conn.collect()
    return None


def handshake_problem(host: str, port: int, user: str, password: str,
                      seconds: float = CHECK_SECONDS) -> str | None:
    """None once a new connection completes the AMQP handshake (greeting, login, connection.open)
    within ``seconds``; else the last attempt's failure."""
    deadline = time.monotonic() + seconds
    problem: str | None = "no attempt"
    while time.monotonic() < deadline:
        problem = _attempt(host, port, user, password, min(ATTEMPT_SECONDS, max(0.5, deadline - time.monotonic())))
        if problem is None:
            return None
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
    return problem


def file_handles(timeout: float = 10.0) -> str | None:
    """The local broker's file-handle budget as RabbitMQ counts it (sockets and files in use,
    quorum queues' reservations included): ``file handles 927 of 927 in use, sockets 12 of 832``.
    None when it cannot be asked (no rabbitmqctl, another broker version, no answer)."""
    exe = shutil.which("rabbitmqctl") or "/usr/sbin/rabbitmqctl"
    try:
        res = subprocess.run([exe, "eval", "file_handle_cache:info()."], capture_output=True, text=True,
                             timeout=timeout, env={**os.environ, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"})
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = dict(re.findall(r"\{(\w+),(\d+)\}", res.stdout.replace(" ", "").replace("\n", "")))
    if res.returncode != 0 or not {"total_used", "total_limit"} <= set(found):
        return None
    text = f"file handles {found['total_used']} of {found['total_limit']} in use"
    if {"sockets_used", "sockets_limit"} <= set(found):
        text += f", sockets {found['sockets_used']} of {found['sockets_limit']}"
    return text


def stop_line(host: str, port: int, problem: str, when: str) -> str:
    """The one line the suite stops with."""
    handles = file_handles() if host in ("127.0.0.1", "localhost", "::1") else None
    return (f"RabbitMQ at {host}:{port} did not complete an AMQP handshake within {CHECK_SECONDS:g} s {when} "
            f"({problem}{'; ' + handles if handles else ''}): stopping the suite rather than failing every test "
            f"that needs it. Out of file handles? See docs/deploy.md, 'The broker's file handles'")
