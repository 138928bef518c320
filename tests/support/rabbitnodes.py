"""RabbitMQ nodes of our own on this machine, beside the system's (5672 is never touched).

What makes a private node work next to the system one (RabbitMQ 3.10 from Debian): call the
scripts in ``/usr/lib/rabbitmq/bin/`` (the ``/usr/sbin`` wrappers switch to the system user and
cookie); give the node and every CLI call aimed at it its own ``HOME`` holding a 0400
``.erlang.cookie`` and ``RABBITMQ_CONF_ENV_FILE`` pointing at an empty file (else
``/etc/rabbitmq/rabbitmq-env.conf`` and with it the system's node name, config and listener
are read); full node names (``tN-xxxx@localhost``); the AMQP listener in the node's own config
file (``RABBITMQ_NODE_PORT`` adds a second, clashing listener) and ``RABBITMQ_DIST_PORT`` for
the server only (a CLI given it takes that port first); ports below the ephemeral range (a
port above 32768 can be held by some outgoing connection's TIME-WAIT); own config, plugins,
mnesia, log and pid paths. Wait with ``rabbitmqctl -n NODE wait PIDFILE``, stop with
``rabbitmqctl -n NODE stop PIDFILE`` (which returns once the process is gone).
"""

from __future__ import annotations

import contextlib
import os
import random
import resource
import secrets
import shutil
import signal
import socket
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote

RABBIT_BIN = Path("/usr/lib/rabbitmq/bin")
_EXCLUDED = {4369, 5672, 25672, 15672}


def _bindable(port: int) -> bool:
    for host in ("0.0.0.0", "127.0.0.1"):
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                return False
    return True


def free_port_pair() -> int:
    """A port P with P and P+1 free, below the ephemeral range (P: AMQP, P+1: distribution)."""
    for _ in range(500):
        p = random.randrange(20000, 32000, 2)
        if not ({p, p + 1} & _EXCLUDED) and _bindable(p) and _bindable(p + 1):
            return p
    raise RuntimeError("no free port pair below 32000")


class RabbitNode:
    def __init__(self, base: Path, index: int, cookie: str, extra_config: str = "", tag: str | None = None,
                 nofile: int | None = None) -> None:
        self.nofile = nofile
        """The node's open-file limit (None: this process's), which sets its file-handle budget."""
        self.tag = tag or uuid.uuid4().hex[:6]
        self.name = f"t{index}-{self.tag}@localhost"
        self.dir = base / f"t{index}"
        self.cookie = cookie
        self.extra_config = extra_config
        self.port = free_port_pair()
        self.dist_port = self.port + 1
        self.proc: subprocess.Popen[bytes] | None = None

    # ------------------------------------------------------------------ environment
    @property
    def pidfile(self) -> Path:
        return self.dir / "pid"

    def cli_env(self) -> dict[str, str]:
        return {"HOME": str(self.dir / "home"), "RABBITMQ_CONF_ENV_FILE": str(self.dir / "empty-env.conf"),
                "ERL_EPMD_ADDRESS": "127.0.0.1", "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}

    def server_env(self) -> dict[str, str]:
        return {**self.cli_env(), "RABBITMQ_NODENAME": self.name, "RABBITMQ_DIST_PORT": str(self.dist_port),
                "RABBITMQ_CONFIG_FILE": str(self.dir / "rabbitmq.conf"),
                "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.dir / "enabled_plugins"),
                "RABBITMQ_MNESIA_BASE": str(self.dir / "mnesia"), "RABBITMQ_LOG_BASE": str(self.dir / "log"),
                "RABBITMQ_PID_FILE": str(self.pidfile),
                "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}"}

    def _prepare(self) -> None:
        home = self.dir / "home"
        home.mkdir(parents=True, exist_ok=True)
        cookie = home / ".erlang.cookie"
        if not cookie.exists():
            cookie.write_text(self.cookie)
            cookie.chmod(0o400)
        (self.dir / "empty-env.conf").write_text("")
        (self.dir / "enabled_plugins").write_text("[].\n")
        (self.dir / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{self.port}\nlog.file.level = info\n"
            f"log.console = false\n{self.extra_config}")

    # ------------------------------------------------------------------ life cycle
    def launch(self) -> RabbitNode:
        """Start the server process (returns at once; ``wait()`` for it)."""
        self._prepare()
        self.pidfile.unlink(missing_ok=True)
        log = open(self.dir / "server.out", "ab")  # noqa: SIM115 - the child owns it
        nofile = self.nofile

        def limits() -> None:
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        self.proc = subprocess.Popen([str(RABBIT_BIN / "rabbitmq-server")], env=self.server_env(), stdout=log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                     preexec_fn=limits)
        log.close()
        return self

    def wait(self, timeout: float = 120) -> RabbitNode:
        res = self.ctl("wait", str(self.pidfile), "--timeout", str(int(timeout)), timeout=timeout + 30, check=False)
        if res.returncode != 0:
            tail = (self.dir / "server.out").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"node {self.name} did not start: {res.stdout}{res.stderr}\n{tail}")
        return self

    def start(self, timeout: float = 120) -> RabbitNode:
        return self.launch().wait(timeout)

    def stop(self, timeout: float = 120) -> None:
        """Graceful stop; returns once the process is gone."""
        if self.pidfile.exists():
            self.ctl("stop", str(self.pidfile), timeout=timeout, check=False)
        self._reap()

    def kill(self) -> None:
        """``kill -9`` of the node's beam: a crash, nothing graceful."""
        pid = self.beam_pid()
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._reap()

    def _reap(self) -> None:
        if self.proc is not None:
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
            self.proc = None
        self.pidfile.unlink(missing_ok=True)

    def beam_pid(self) -> int | None:
        try:
            return int(self.pidfile.read_text().strip())
        except (OSError, ValueError):
            return None

    @property
    def running(self) -> bool:
        pid = self.beam_pid()
        if not pid:
            return False
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False

    # ------------------------------------------------------------------ tools
    def ctl(self, *args: str, timeout: float = 120, check: bool = True,
            stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        res = subprocess.run([str(RABBIT_BIN / "rabbitmqctl"), "-n", self.name, *args], env=self.cli_env(),
                             capture_output=True, text=True, timeout=timeout, input=stdin)
        if check and res.returncode != 0:
            raise RuntimeError(f"rabbitmqctl -n {self.name} {' '.join(args)}: {res.stdout}{res.stderr}")
        return res

    def url(self, user: str = "guest", password: str = "guest", vhost: str = "/",
            scheme: str = "amqp", host: str = "127.0.0.1", port: int | None = None) -> str:
        return f"{scheme}://{user}:{password}@{host}:{port or self.port}/{quote(vhost, safe='')}"


class RabbitCluster:
    """N nodes, one cookie, clustered; quorum queues replicate across them."""

    def __init__(self, base: Path, size: int = 3) -> None:
        self.base = base
        cookie = secrets.token_hex(16).upper()
        tag = uuid.uuid4().hex[:6]
        self.nodes = [RabbitNode(base, i + 1, cookie, tag=tag) for i in range(size)]

    def start(self) -> RabbitCluster:
        for node in self.nodes:  # in parallel: each start is mostly waiting
            node.launch()
        with ThreadPoolExecutor(len(self.nodes)) as pool:
            list(pool.map(lambda n: n.wait(), self.nodes))
        first = self.nodes[0]
        for node in self.nodes[1:]:
            node.ctl("stop_app")
            node.ctl("join_cluster", first.name)
            node.ctl("start_app")
        return self

    def stop(self) -> None:
        with ThreadPoolExecutor(len(self.nodes)) as pool:
            list(pool.map(lambda n: n.stop(), self.nodes))

    def urls(self, vhost: str = "/", user: str = "guest", password: str = "guest") -> list[str]:
        return [n.url(user, password, vhost) for n in self.nodes]

    def running_nodes(self) -> list[str]:
        """Nodes the cluster reports running, asked of any live node."""
        import json

        for node in self.nodes:
            if node.running:
                res = node.ctl("cluster_status", "--formatter", "json", check=False, timeout=30)
                if res.returncode == 0:
                    return sorted(json.loads(res.stdout).get("running_nodes", []))
        return []

    def wait_running(self, count: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while len(self.running_nodes()) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{count} running nodes expected, have {self.running_nodes()}")
            time.sleep(0.5)


def cleanup(base: Path) -> None:
    shutil.rmtree(base, ignore_errors=True)
