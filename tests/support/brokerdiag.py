"""What the machine's RabbitMQ looked like when a test could not reach it.

A CI log that says only "TimeoutError: timed out" on connect cannot tell a broker under an alarm
from one out of file descriptors, a full disk, or a machine starved of CPU. The report is taken
once per session, at the first such failure, and attached to that test's report; every command
has its own timeout so a hung broker cannot hang the suite, and nothing is run through a shell.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

COMMAND_TIMEOUT = 20.0


def _run(argv: list[str]) -> str:
    exe = shutil.which(argv[0]) or f"/usr/sbin/{argv[0]}"
    try:
        res = subprocess.run([exe, *argv[1:]], capture_output=True, text=True, timeout=COMMAND_TIMEOUT,
                             env={**os.environ, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"})
    except subprocess.TimeoutExpired:
        return f"(no answer in {COMMAND_TIMEOUT:.0f} s)"
    except OSError as exc:
        return f"({type(exc).__name__}: {exc})"
    out = (res.stdout + res.stderr).strip()
    return out if res.returncode == 0 else f"(exit {res.returncode}) {out}"


def amqp_greeting(host: str, port: int, timeout: float = COMMAND_TIMEOUT) -> str:
    """Whether the listener answers the AMQP header with its Connection.Start, and how fast: a
    connect that succeeds but is never greeted is a broker that stopped accepting (descriptors,
    an overloaded acceptor), not a network fault."""
    start = time.monotonic()
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.settimeout(timeout)
            s.sendall(b"AMQP\x00\x00\x09\x01")
            first = s.recv(8)
    except OSError as exc:
        return f"{type(exc).__name__} after {time.monotonic() - start:.1f} s: {exc}"
    kind = "Connection.Start frame" if first[:1] == b"\x01" else f"unexpected bytes {first!r}"
    return f"{kind} after {time.monotonic() - start:.2f} s"


def _status_sections(status: str, wanted: tuple[str, ...]) -> str:
    """The parts of ``rabbitmqctl status`` that explain refused connections (the whole is ~100
    lines), each cut to its first lines (the memory section lists every allocator after the total)."""
    kept, lines = 0, []
    for line in status.splitlines():
        if line.startswith("\x1b[1m"):  # a section's title is printed in bold
            line = line.replace("\x1b[1m", "").replace("\x1b[0m", "")
            kept = 6 if line.strip() in wanted else 0
        if kept and line.strip():
            lines.append(line)
            kept -= 1
    return "\n".join(lines) or status[-2000:]


def broker_diagnosis(host: str = "127.0.0.1", port: int = 5672) -> str:
    established = _run(["ss", "-Htn", "state", "established", f"( sport = :{port} )"])
    from tests.support.brokercheck import file_handles

    sections = [
        ("AMQP greeting", amqp_greeting(host, port)),
        # RabbitMQ's own count (quorum queues' reservations included), which the OS's does not show
        ("file-handle budget", file_handles() or "(not available)"),
        ("alarms", _run(["rabbitmq-diagnostics", "-q", "alarms"])),
        ("status", _status_sections(_run(["rabbitmqctl", "-q", "status"]),
                                    ("Alarms", "File Descriptors", "Memory", "Free Disk Space", "Listeners"))),
        (f"established connections on :{port}", str(len(established.splitlines()))
         if not established.startswith("(") else established),
        ("load average", Path("/proc/loadavg").read_text().strip()),
        ("disk", _run(["df", "-h", "/var/lib/rabbitmq", "/tmp"])),
        # comm, not args: a command line can carry a password
        ("busiest processes", "\n".join(_run(["ps", "-eo", "pid,pcpu,rss,etime,comm", "--sort=-pcpu"])
                                        .splitlines()[:12])),
    ]
    return "\n\n".join(f"== {title}\n{body}" for title, body in sections)


def is_unreachable_broker(exc: BaseException) -> bool:
    text = f"{type(exc).__name__}: {exc}"
    return "BrokerUnavailable" in text or "cannot reach the broker" in text
