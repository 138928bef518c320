"""scripts/ensure-services.sh starts RabbitMQ with an open-file limit fit for the suite (issue 34:
started from a shell's 1,024, the broker ran out of file handles in the middle of ``make test``).

The script is run as ``make test`` runs it, with ``rabbitmq-server`` and ``rabbitmqctl`` replaced
by stand-ins that record what they were started with and listen on a free port (the machine's
broker is never touched); PostgreSQL is the machine's."""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
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
# stand-in for rabbitmqctl: a broker that started with the limit it was given
case "$*" in
  *get_limit*) echo "$(( $(cat "$STUB_DIR/nofile") - 100 ))" ;;
esac
exit 0
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_rabbitmq_it_starts_gets_an_open_file_limit_fit_for_the_suite(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("rabbitmq-server", SERVER), ("rabbitmqctl", CTL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STUB_DIR": str(tmp_path),
           "EPU_RABBIT_PORT": str(free_port())}

    def shell_limits() -> None:  # what a login shell gives: 1,024 open files
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    try:
        res = subprocess.run(["bash", str(ROOT / "scripts" / "ensure-services.sh")], env=env, capture_output=True,
                             text=True, timeout=120, preexec_fn=shell_limits)
    finally:
        pid = (tmp_path / "pid").read_text().strip() if (tmp_path / "pid").exists() else ""
        if pid:
            os.kill(int(pid), signal.SIGTERM)
    if os.geteuid() != 0:  # it cannot start the broker itself: it says how, with the limit
        assert res.returncode == 1 and "ulimit -n 65536; rabbitmq-server -detached" in res.stderr, res.stderr
        return
    assert res.returncode == 0, res.stdout + res.stderr
    # 65,536, or as many as this machine allows (a container without CAP_SYS_RESOURCE: its hard limit)
    wanted = min(65536, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
    assert int((tmp_path / "nofile").read_text()) == wanted >= 10000
    assert "warning" not in res.stderr, res.stderr


def test_it_warns_of_a_running_rabbitmq_with_a_shells_limit(tmp_path: Path) -> None:
    """A broker started before (by hand, or by an older script) keeps its limit: the script says
    so, and how to restart it, without restarting a broker others may be using."""
    if os.geteuid() != 0:
        pytest.fail("run as root (make test as root sets the services up): the check asks rabbitmqctl")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "rabbitmqctl").write_text(CTL)
    (bin_dir / "rabbitmqctl").chmod(0o755)
    (tmp_path / "nofile").write_text("1024\n")
    with socket.socket() as listener:  # a broker already up on the port
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STUB_DIR": str(tmp_path),
               "EPU_RABBIT_PORT": str(listener.getsockname()[1])}
        res = subprocess.run(["bash", str(ROOT / "scripts" / "ensure-services.sh")], env=env, capture_output=True,
                             text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "may use only 924 file handles" in res.stderr and "ulimit -n 65536; rabbitmq-server -detached" in res.stderr
