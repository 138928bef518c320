"""The process site: a libcloud ``NodeDriver`` (provider name ``epu-process``) whose
instances are real processes on this machine.

Why: so the whole elastic loop runs for real on one host — for Slurm each instance is a
``slurmd -D -N {node_name}`` registered as the instance's node. The configured ``argv`` is a
list of strings formatted per instance (``{node_name}``, ``{instance_id}``, ``{cloud_id}``,
``{userdata_file}``, ``{node_dir}``, and ``{port}`` — a free TCP port, e.g. for a dynamic slurmd) and started with ``subprocess.Popen`` — never through a shell, so a
node name cannot inject a command.

State (pid, its kernel start time, tags, client token) lives in SQLite (``path``), so a
restarted provisioner still finds, lists and stops the processes the previous one started;
the start time guards against a recycled pid. A node is RUNNING while its process lives,
ERROR if it exited on its own, STOPPING from the moment ``destroy_node`` signals it, and
TERMINATED once destroyed (listed for ``terminated_linger`` seconds, then gone). The stop is
recorded before the signal so a poll that sees the process gone mid-destroy reports it
TERMINATED, not failed. ``destroy_node`` sends SIGTERM to the process group, then SIGKILL
after ``stop_timeout`` seconds.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from libcloud.common.types import LibcloudError
from libcloud.compute.base import Node, NodeDriver, NodeImage, NodeLocation, NodeSize
from libcloud.compute.types import NodeState

PROVIDER_NAME = "epu-process"
SPAWN_GRACE_SECONDS = 30.0
"""A node recorded but with no process after this long never started (its create crashed)."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS procs (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    client_token TEXT UNIQUE,
    pid INTEGER NOT NULL,
    start_ticks TEXT NOT NULL,
    created_at REAL NOT NULL,
    destroyed_at REAL,
    stopping_at REAL,
    tags TEXT NOT NULL DEFAULT '{}',
    log_path TEXT NOT NULL
);
"""


def _start_ticks(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), or
    ``None`` when there is no such live process (gone or a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = stat.rsplit(")", 1)[1].split()
    if rest[0] in ("Z", "X"):
        return None
    return rest[19]


def _find_spawned(node_id: str) -> tuple[int, str] | None:
    """(pid, start ticks) of the live process whose environment says ``EPU_CLOUD_ID=node_id``:
    the child of a create that crashed between starting it and recording its pid."""
    needle = f"EPU_CLOUD_ID={node_id}".encode()
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            env = (pid_dir / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if needle in env:
            ticks = _start_ticks(int(pid_dir.name))
            if ticks is not None:
                return int(pid_dir.name), ticks
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ProcessNodeDriver(NodeDriver):
    type = PROVIDER_NAME
    name = "EPU process site"
    website = "https://example.invalid/epu-process"

    def __init__(self, key: str = "process", secret: str | None = None, secure: bool = False,
                 host: str | None = None, port: int | None = None, *, argv: list[str] | None = None,
                 env: dict[str, str] | None = None, cwd: str | None = None, path: str | None = None,
                 max_nodes: int | None = None, stop_timeout: float = 10.0,
                 terminated_linger: float = 60.0) -> None:
        super().__init__(key=key, secret=secret, secure=False, host=host, port=port)
        if not argv:
            raise ValueError("epu-process site needs driver_args.argv (a list of strings)")
        self.argv = [str(a) for a in argv]
        self.env = {str(k): str(v) for k, v in (env or {}).items()}
        self.cwd = cwd
        self.max_nodes = max_nodes
        self.stop_timeout = float(stop_timeout)
        self.terminated_linger = float(terminated_linger)
        if path is None:
            tmp = tempfile.mkdtemp(prefix="epu-process-")
            atexit.register(shutil.rmtree, tmp, True)
            path = os.path.join(tmp, "procs.db")
        self.path = path
        self.state_dir = Path(path).parent / (Path(path).stem + "-nodes")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._lock = threading.Lock()
        with self._db() as db:
            db.executescript(_SCHEMA)
            columns = {r["name"] for r in db.execute("PRAGMA table_info(procs)")}
            if "stopping_at" not in columns:  # a state file from before the column existed
                db.execute("ALTER TABLE procs ADD COLUMN stopping_at REAL")

    def _db(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.row_factory = sqlite3.Row
        return conn

    def _reap(self) -> None:
        with self._lock:
            for pid, child in list(self._children.items()):
                if child.poll() is not None:
                    del self._children[pid]

    def _adopt_spawned(self, row: sqlite3.Row) -> sqlite3.Row:
        """A row recorded before its process started (pid 0) whose create never finished:
        adopt the process if it started after all, so it is listed, found by tag and stopped."""
        if row["pid"] != 0 or row["destroyed_at"] is not None:
            return row
        found = _find_spawned(row["id"])
        if found is None:
            return row
        with self._db() as db:
            db.execute("UPDATE procs SET pid = ?, start_ticks = ? WHERE id = ? AND pid = 0", (*found, row["id"]))
            return db.execute("SELECT * FROM procs WHERE id = ?", (row["id"],)).fetchone()

    def _to_node(self, row: sqlite3.Row, now: float) -> Node:
        row = self._adopt_spawned(row)
        alive = row["pid"] != 0 and _start_ticks(row["pid"]) == row["start_ticks"]
        if row["destroyed_at"] is not None:
            state = NodeState.TERMINATED
        elif row["stopping_at"] is not None:
            state = NodeState.STOPPING if alive else NodeState.TERMINATED
        elif row["pid"] == 0:  # recorded, process not (yet) started: being created, or never was
            state = NodeState.PENDING if now - row["created_at"] < SPAWN_GRACE_SECONDS else NodeState.ERROR
        elif alive:
            state = NodeState.RUNNING
        else:
            state = NodeState.ERROR  # exited by itself
        tags = json.loads(row["tags"])
        ips = ["127.0.0.1"] if state == NodeState.RUNNING else []
        # every state here is seen first hand (the process table, our own rows): an end is a fact
        return Node(id=row["id"], name=row["name"], state=state, public_ips=[], private_ips=ips, driver=self,
                    extra={"tags": tags, "pid": row["pid"], "client_token": row["client_token"],
                           "log": row["log_path"], "end_observed": True},
                    created_at=datetime.fromtimestamp(row["created_at"], UTC))

    # ------------------------------------------------------------------ libcloud API
    def list_nodes(self, *args: Any, **kwargs: Any) -> list[Node]:
        self._reap()
        now = time.time()
        with self._db() as db:
            rows = db.execute("SELECT * FROM procs WHERE destroyed_at IS NULL OR destroyed_at > ? "
                              "ORDER BY created_at", (now - self.terminated_linger,)).fetchall()
        return [self._to_node(r, now) for r in rows]

    def create_node(self, name: str, size: NodeSize | None = None, image: NodeImage | None = None,
                    location: NodeLocation | None = None, auth: Any = None,
                    ex_metadata: dict[str, str] | None = None, ex_userdata: str | None = None,
                    ex_clienttoken: str | None = None) -> Node:
        with self._lock, self._db() as db:
            if ex_clienttoken:
                row = db.execute("SELECT * FROM procs WHERE client_token = ?", (ex_clienttoken,)).fetchone()
                if row is not None:
                    return self._to_node(row, time.time())
            if self.max_nodes is not None:
                live = db.execute("SELECT COUNT(*) FROM procs WHERE destroyed_at IS NULL").fetchone()[0]
                if live >= self.max_nodes:
                    raise LibcloudError(f"InstanceLimitExceeded: process site allows {self.max_nodes} nodes", self)
            node_id = "proc-" + uuid.uuid4().hex[:12]
            node_dir = self.state_dir / node_id
            node_dir.mkdir(parents=True, exist_ok=True)
            userdata_file = node_dir / "userdata"
            userdata_file.write_text(ex_userdata or "")
            values = {"node_name": name, "instance_id": (ex_metadata or {}).get("epu-instance-id", node_id),
                      "cloud_id": node_id, "userdata_file": str(userdata_file), "node_dir": str(node_dir),
                      "port": _free_port() if any("{port}" in a for a in self.argv) else 0}
            try:
                argv = [a.format(**values) for a in self.argv]
            except (KeyError, IndexError) as exc:
                raise LibcloudError(f"InvalidParameter: argv template placeholder {exc} unknown", self) from None
            log_path = node_dir / "output.log"
            env = {**os.environ, **{k: v.format(**values) for k, v in self.env.items()},
                   "EPU_NODE_NAME": name, "EPU_CLOUD_ID": node_id}
            # Intent first: the row (pid 0: spawning) is stored before the process starts, so
            # a crash in between leaves a node the provisioner finds by its tags (and a
            # process found by EPU_CLOUD_ID), never an untracked worker and a second one.
            db.execute("INSERT INTO procs (id, name, client_token, pid, start_ticks, created_at, tags, log_path) "
                       "VALUES (?, ?, ?, 0, 'spawning', ?, ?, ?)",
                       (node_id, name, ex_clienttoken or None, time.time(),
                        json.dumps(ex_metadata or {}, sort_keys=True), str(log_path)))
            with open(log_path, "ab") as log:
                try:
                    child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                             cwd=self.cwd, env=env, start_new_session=True)
                except OSError as exc:
                    db.execute("DELETE FROM procs WHERE id = ?", (node_id,))
                    raise LibcloudError(f"InvalidParameter: cannot start {argv[0]!r}: {exc.strerror}", self) from None
            self._children[child.pid] = child
            ticks = _start_ticks(child.pid) or "?"
            db.execute("UPDATE procs SET pid = ?, start_ticks = ? WHERE id = ?", (child.pid, ticks, node_id))
            row = db.execute("SELECT * FROM procs WHERE id = ?", (node_id,)).fetchone()
        return self._to_node(row, time.time())

    def destroy_node(self, node: Node) -> bool:
        with self._db() as db:
            row = db.execute("SELECT * FROM procs WHERE id = ?", (node.id,)).fetchone()
        if row is None:
            raise LibcloudError(f"InvalidInstanceID.NotFound: no process node {node.id}", self)
        row = self._adopt_spawned(row)
        with self._db() as db:
            db.execute("UPDATE procs SET stopping_at = ? WHERE id = ? AND stopping_at IS NULL",
                       (time.time(), node.id))
        pid = row["pid"]
        if pid and _start_ticks(pid) == row["start_ticks"]:
            self._signal_group(pid, signal.SIGTERM)
            deadline = time.monotonic() + self.stop_timeout
            while time.monotonic() < deadline and _start_ticks(pid) == row["start_ticks"]:
                self._reap()
                time.sleep(0.02)
            if _start_ticks(pid) == row["start_ticks"]:
                self._signal_group(pid, signal.SIGKILL)
        self._reap()
        with self._db() as db:
            db.execute("UPDATE procs SET destroyed_at = ? WHERE id = ? AND destroyed_at IS NULL",
                       (time.time(), node.id))
        return True

    @staticmethod
    def _signal_group(pid: int, sig: int) -> None:
        try:
            os.killpg(pid, sig)  # start_new_session made the worker its own group leader
        except ProcessLookupError:
            pass

    def list_images(self, location: NodeLocation | None = None) -> list[NodeImage]:
        return [NodeImage(id="local", name="this machine", driver=self)]

    def list_sizes(self, location: NodeLocation | None = None) -> list[NodeSize]:
        return [NodeSize(id="local", name="process", ram=0, disk=0, bandwidth=None, price=0.0, driver=self)]

    def list_locations(self) -> list[NodeLocation]:
        return [NodeLocation(id="localhost", name="localhost", country="ZZ", driver=self)]
