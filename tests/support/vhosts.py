"""A RabbitMQ vhost per test module, removed with everything in it as soon as the module is done.

Why per module: the suite declares a topology per test (a unique name prefix each); in one vhost
for the whole session they piled up — about 285 quorum queues by the middle of the suite, and
RabbitMQ 3.10 reserves three file handles for each, until the broker had none left for a new
connection (issue 34). Deleting a module's vhost deletes its queues, exchanges and bindings at
once, whatever made them (the test, a service it started, a subprocess).

Why a pool: each ``rabbitmqctl`` call starts an Erlang VM (about 2 s on the loaded 2-core
machine), so vhosts are made a few at a time in one ``import_definitions`` call (vhost and the
test user's permissions together), and deleted in the background (the next module does not wait
for it). ``close()`` deletes what is left and waits for every deletion: a session leaves no vhost.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import uuid

import amqp
from amqp import exceptions as amqp_exc


def _ctl() -> str:
    return shutil.which("rabbitmqctl") or "/usr/sbin/rabbitmqctl"


class VhostPool:
    def __init__(self, tag: str, host: str, port: int, user: str, password: str, batch: int = 4) -> None:
        self.tag = tag
        self.host, self.port = host, port
        self.user, self.password = user, password
        self.batch = batch
        self._ready: list[str] = []
        self._deleting: list[tuple[str, subprocess.Popen[bytes]]] = []

    def take(self) -> str:
        """A fresh vhost the test user may use fully."""
        if not self._ready:
            self._make(self.batch)
        vhost = self._ready.pop(0)
        self._wait_usable(vhost)
        return vhost

    def give_back(self, vhost: str) -> None:
        """Delete ``vhost`` and everything in it, in the background."""
        self._reap()
        proc = subprocess.Popen([_ctl(), "delete_vhost", vhost], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        self._deleting.append((vhost, proc))

    def close(self, timeout: float = 120.0) -> list[str]:
        """Delete the vhosts never taken and wait for every deletion; the vhosts that could not be
        deleted (to report)."""
        for vhost in self._ready:
            self.give_back(vhost)
        self._ready = []
        deadline = time.monotonic() + timeout
        failed = []
        for vhost, proc in self._deleting:
            try:
                code = proc.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                code = -1
            if code != 0:
                failed.append(vhost)
        self._deleting = []
        return failed

    # ------------------------------------------------------------------ inside
    def _reap(self) -> None:
        self._deleting = [(v, p) for v, p in self._deleting if p.poll() is None or p.returncode != 0]

    def _make(self, n: int) -> None:
        names = [f"epu-test-{self.tag}-{uuid.uuid4().hex[:8]}" for _ in range(n)]
        doc = {"vhosts": [{"name": v} for v in names],
               "permissions": [{"user": self.user, "vhost": v, "configure": ".*", "write": ".*", "read": ".*"}
                               for v in names]}
        # via stdin: rabbitmqctl reads a file as the rabbitmq user, who cannot see pytest's tmp dirs
        res = subprocess.run([_ctl(), "import_definitions"], input=json.dumps(doc), capture_output=True,
                             text=True, timeout=120)
        if res.returncode != 0:
            raise RuntimeError(f"rabbitmqctl import_definitions (test vhosts): {res.stdout}{res.stderr}")
        self._ready.extend(names)

    def _wait_usable(self, vhost: str, timeout: float = 60.0) -> None:
        """The import is asynchronous: wait until the test user may open the vhost."""
        deadline = time.monotonic() + timeout
        while True:
            conn = amqp.Connection(f"{self.host}:{self.port}", userid=self.user, password=self.password,
                                   virtual_host=vhost, connect_timeout=10, heartbeat=0)
            try:
                conn.connect()
                conn.close()
                return
            except (amqp_exc.AccessRefused, amqp_exc.NotAllowed):
                conn.collect()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"test vhost {vhost} not usable after {timeout:g} s") from None
                time.sleep(0.1)
