"""scripts/ensure-services.sh starts RabbitMQ with an open-file limit fit for the suite (issue 34:
started from a shell's 1,024, the broker ran out of file handles in the middle of ``make test``).

The script is run as ``make test`` runs it, with the broker's server and ``rabbitmqctl`` replaced
by stand-ins that record what they were started with and listen on a free port (the machine's
broker is never touched); PostgreSQL is the machine's. The server stand-in is started the way the
real one is (setpriv, as root here: Debian's wrapper would go through su, whose pam_limits puts the
limit back to init's 1,024)."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.postgres  # the script checks PostgreSQL too: the machine's must be up

SERVER = """#!/bin/sh
# stand-in for rabbitmq-server -detached: note the limits it got, listen on the port, leave
ulimit -n > "$STUB_DIR/nofile"
python3 -c '
import os, socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(os.environ["EPU_RABBIT_PORT"]))); s.listen(8); time.sleep(60)' >/dev/null 2>&1 &
echo $! > "$STUB_DIR/pid"
"""

CTL = """#!/bin/sh
# stand-in for rabbitmqctl: a broker that started with the limit it was given, with the clients
# listed in $STUB_DIR/clients; stop ends the stand-in server
case "$*" in
  *get_limit*) echo "$(( $(cat "$STUB_DIR/nofile") - 100 ))" ;;
  *list_connections*) cat "$STUB_DIR/clients" 2>/dev/null ;;
  stop*) kill "$(cat "$STUB_DIR/pid")"; echo stopped >> "$STUB_DIR/stops" ;;
esac
exit 0
"""


def stubs(tmp_path: Path, port: int) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("rabbitmq-server", SERVER), ("rabbitmqctl", CTL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STUB_DIR": str(tmp_path),
            "EPU_RABBIT_PORT": str(port), "EPU_RABBIT_SERVER": str(bin_dir / "rabbitmq-server"),
            "EPU_RABBIT_USER": "root", "EPU_SERVICES_LOCK": str(tmp_path / "services.lock")}


def shell_limits() -> None:  # what a login shell gives: 1,024 open files
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))


def run_script(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(ROOT / "scripts" / "ensure-services.sh")], env=env, capture_output=True,
                          text=True, timeout=120, preexec_fn=shell_limits)


def stop_stub(tmp_path: Path) -> None:
    pid = (tmp_path / "pid").read_text().strip() if (tmp_path / "pid").exists() else ""
    if pid:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGTERM)


WANTED = min(65536, resource.getrlimit(resource.RLIMIT_NOFILE)[1])  # or as many as this machine allows


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_rabbitmq_it_starts_gets_an_open_file_limit_fit_for_the_suite(tmp_path: Path) -> None:
    env = stubs(tmp_path, free_port())
    try:
        res = run_script(env)
    finally:
        stop_stub(tmp_path)
    if os.geteuid() != 0:  # it cannot start the broker itself: it says how
        assert res.returncode == 1 and "sudo bash scripts/ensure-services.sh" in res.stderr, res.stderr
        return
    assert res.returncode == 0, res.stdout + res.stderr
    # 65,536, or as many as this machine allows (a container without CAP_SYS_RESOURCE: its hard limit)
    assert int((tmp_path / "nofile").read_text()) == WANTED >= 10000
    assert "warning" not in res.stderr, res.stderr


def start_low_limit_stub(tmp_path: Path, env: dict[str, str]) -> None:
    """A broker started before (by hand, or by an older script) with a shell's 1,024."""
    subprocess.run([env["EPU_RABBIT_SERVER"]], env=env, check=True, preexec_fn=shell_limits)
    port = int(env["EPU_RABBIT_PORT"])
    for _ in range(200):
        with socket.socket() as s, contextlib.suppress(OSError):
            s.connect(("127.0.0.1", port))
            return
        time.sleep(0.05)  # polling the port the stand-in opens, bounded
    pytest.fail("the stand-in broker did not listen")


def test_a_running_rabbitmq_with_a_shells_limit_and_no_clients_is_restarted_with_the_suites(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.fail("run as root (make test as root sets the services up): the check asks rabbitmqctl")
    env = stubs(tmp_path, free_port())
    start_low_limit_stub(tmp_path, env)
    assert (tmp_path / "nofile").read_text().strip() == "1024"
    try:
        res = run_script(env)
    finally:
        stop_stub(tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "restarting RabbitMQ: it may use only 924 file handles" in res.stderr, res.stderr
    assert (tmp_path / "stops").read_text().count("stopped") == 1
    assert int((tmp_path / "nofile").read_text()) == WANTED
    assert f"now may use {WANTED - 100} file handles" in res.stderr


def test_a_running_rabbitmq_others_use_is_left_alone_with_a_warning(tmp_path: Path) -> None:
    """Clients connected: restarting would cut them off, so the script only says how."""
    if os.geteuid() != 0:
        pytest.fail("run as root (make test as root sets the services up): the check asks rabbitmqctl")
    env = stubs(tmp_path, free_port())
    start_low_limit_stub(tmp_path, env)
    (tmp_path / "clients").write_text("someone else\n")
    try:
        res = run_script(env)
    finally:
        stop_stub(tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "may use only 924 file handles" in res.stderr and "1 clients use it" in res.stderr, res.stderr
    assert "rabbitmqctl stop && sudo bash scripts/ensure-services.sh" in res.stderr
    assert not (tmp_path / "stops").exists()
