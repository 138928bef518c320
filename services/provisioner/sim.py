"""The simulated cloud: a real libcloud ``NodeDriver`` (provider name ``epu-sim``).

Why a fake at all: rule 7 allows one only where the real thing cannot run here (a public
cloud), and then it must implement the real interface. Everything above this module talks
to it exactly as to EC2 or OpenStack: ``create_node``/``list_nodes``/``destroy_node``, node
``extra["tags"]``, EC2-style error codes in exception text.

Knobs (constructor keywords, also settable later with ``set_knobs``):

* ``api_latency`` — seconds every API call takes (real time: it models the network).
* ``boot_time_min``/``boot_time_max`` — boot time drawn uniformly per node, in *clock* time
  (the demo's ``ScaledClock`` makes minutes pass in seconds).
* ``boot_failure_rate`` — probability a node ends in ERROR instead of RUNNING.
* ``api_error_rate`` — probability a call fails with a transient 503.
* ``quota`` — most live nodes in the cloud (``InstanceLimitExceeded``, a capacity error).
* ``capacity_error_rate`` — probability a create fails with ``InsufficientInstanceCapacity``.
* ``images`` — when set, other image ids fail permanently (``InvalidAMIID.NotFound``).
* ``terminated_linger`` — how long a terminated node stays listed before it vanishes.
* ``partial_listing_rate`` — probability a listing is cut short (a random prefix of the nodes,
  as a lost page or an OpenStack cell that is down returns): live nodes missing from it.
* ``client_tokens`` — false models a provider without client tokens (the token is ignored).

Deterministic fault injection for tests: ``inject("transient"|"capacity"|"permanent", n,
call="create"|"destroy"|"list")`` makes the next ``n`` such calls fail that way; ``"lost"``
makes a create *succeed* and then fail with a gateway timeout — the answer lost on the way
back, the case client tokens exist for; ``"partial"`` (``call="list"``) makes the next ``n``
listings return only the first half of the nodes.

Every knob, ``seed``, ``path`` and a list of ``faults`` (``{kind, count, call}`` tables, injected
at start) can be set from a site's ``driver_args``; an unknown key is an error that names it.

State lives in SQLite (``path``) so several processes share one cloud; without a path the
cloud is private to the process, in a temporary file removed at exit. The client token
(``ex_clienttoken``) is unique in the table, so a retried create returns the same node,
as EC2 does.
"""

from __future__ import annotations

import atexit
import json
import os
import random
import shutil
import sqlite3
import tempfile
import threading
import time
import uuid
from collections import deque
from datetime import UTC, datetime
from typing import Any

from epu.common.clock import Clock, RealClock
from libcloud.common.exceptions import BaseHTTPError
from libcloud.common.types import InvalidCredsError, LibcloudError
from libcloud.compute.base import Node, NodeDriver, NodeImage, NodeLocation, NodeSize
from libcloud.compute.types import NodeState

PROVIDER_NAME = "epu-sim"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS nodes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    name TEXT NOT NULL,
    client_token TEXT UNIQUE,
    image TEXT, size TEXT,
    created_at REAL NOT NULL,
    boot_at REAL NOT NULL,
    boot_fails INTEGER NOT NULL DEFAULT 0,
    terminated_at REAL,
    tags TEXT NOT NULL DEFAULT '{}',
    userdata_bytes INTEGER NOT NULL DEFAULT 0
);
"""

_KNOBS = ("api_latency", "boot_time_min", "boot_time_max", "boot_failure_rate", "api_error_rate", "quota",
          "capacity_error_rate", "images", "terminated_linger", "partial_listing_rate", "client_tokens")
FAULT_KINDS = ("transient", "capacity", "permanent", "lost", "partial")
FAULT_CALLS = ("create", "destroy", "list")


class SimulatedNodeDriver(NodeDriver):
    """A cloud in a SQLite file. See the module docstring for the knobs."""

    type = PROVIDER_NAME
    name = "EPU simulated cloud"
    website = "https://example.invalid/epu-sim"
    features = {"create_node": ["generates_password"]}

    def __init__(self, key: str = "sim", secret: str | None = None, secure: bool = False,
                 host: str | None = None, port: int | None = None, *, path: str | None = None,
                 api_latency: float = 0.0, boot_time_min: float = 5.0, boot_time_max: float = 15.0,
                 boot_failure_rate: float = 0.0, api_error_rate: float = 0.0, quota: int | None = None,
                 capacity_error_rate: float = 0.0, images: list[str] | None = None,
                 terminated_linger: float = 60.0, partial_listing_rate: float = 0.0, client_tokens: bool = True,
                 faults: list[dict[str, Any]] | None = None, seed: int | None = None,
                 clock: Clock | None = None) -> None:
        super().__init__(key=key, secret=secret, secure=False, host=host, port=port)
        self.api_latency = float(api_latency)
        self.boot_time_min = float(boot_time_min)
        self.boot_time_max = float(max(boot_time_min, boot_time_max))
        self.boot_failure_rate = float(boot_failure_rate)
        self.api_error_rate = float(api_error_rate)
        self.quota = quota
        self.capacity_error_rate = float(capacity_error_rate)
        self.images = images
        self.terminated_linger = float(terminated_linger)
        self.partial_listing_rate = float(partial_listing_rate)
        self.clock: Clock = clock or RealClock()
        self._rng = random.Random(seed)
        self._rng_lock = threading.Lock()
        self._injected: dict[str, deque[str]] = {"create": deque(), "destroy": deque(), "list": deque()}
        self._inject_lock = threading.Lock()
        self.calls: dict[str, int] = {"create": 0, "destroy": 0, "list": 0}
        self.client_tokens = bool(client_tokens)
        """False models a provider without client tokens (the token is then ignored)."""
        for i, fault in enumerate(faults or []):
            if not isinstance(fault, dict) or set(fault) - {"kind", "count", "call"} or "kind" not in fault:
                raise ValueError(f"faults[{i}]: expected a table with kind, count and call (got {fault!r})")
            self.inject(str(fault["kind"]), int(fault.get("count", 1)), str(fault.get("call", "create")))
        if path is None:
            tmp = tempfile.mkdtemp(prefix="epu-sim-")
            atexit.register(shutil.rmtree, tmp, True)
            path = os.path.join(tmp, "cloud.db")
        self.path = path
        self._local = threading.local()
        self._write_lock = threading.Lock()
        with self._write_lock:
            self._db().executescript(_SCHEMA)

    # ------------------------------------------------------------------ knobs
    def set_knobs(self, **knobs: Any) -> None:
        for k, v in knobs.items():
            if k not in _KNOBS:
                raise ValueError(f"unknown epu-sim knob {k!r} (known: {', '.join(_KNOBS)})")
            setattr(self, k, v)

    def inject(self, kind: str, count: int = 1, call: str = "create") -> None:
        """Make the next ``count`` calls of ``call`` fail with an error of ``kind``."""
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {kind!r} (known: {', '.join(FAULT_KINDS)})")
        if call not in FAULT_CALLS:
            raise ValueError(f"unknown fault call {call!r} (known: {', '.join(FAULT_CALLS)})")
        if kind == "partial" and call != "list":
            raise ValueError("a partial fault applies to call='list' only")
        with self._inject_lock:
            self._injected[call].extend([kind] * count)

    # ------------------------------------------------------------------ plumbing
    def _db(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA busy_timeout=30000")
            conn.row_factory = sqlite3.Row
            self._local.conn = conn
        return conn

    def _random(self) -> float:
        with self._rng_lock:
            return self._rng.random()

    def _api_call(self, call: str) -> str | None:
        """What every API call goes through: credentials, latency, injected and random errors."""
        self.calls[call] = self.calls.get(call, 0) + 1
        if self.key == "invalid":
            raise InvalidCredsError("AuthFailure: simulated invalid credentials")
        if self.api_latency > 0:
            time.sleep(self.api_latency)
        with self._inject_lock:
            forced = self._injected[call].popleft() if self._injected[call] else None
        if forced == "transient":
            raise BaseHTTPError(503, "ServiceUnavailable: injected transient API error")
        if forced == "capacity":
            raise LibcloudError("InsufficientInstanceCapacity: injected: no capacity for this size", self)
        if forced == "permanent":
            raise InvalidCredsError("AuthFailure: injected permanent error")
        if self.api_error_rate and self._random() < self.api_error_rate:
            raise BaseHTTPError(503, "ServiceUnavailable: simulated API error")
        return forced

    def _now(self) -> float:
        return self.clock.now()

    def _state(self, row: sqlite3.Row, now: float) -> NodeState:
        if row["terminated_at"] is not None:
            return NodeState.TERMINATED
        if now < row["boot_at"]:
            return NodeState.PENDING
        return NodeState.ERROR if row["boot_fails"] else NodeState.RUNNING

    def _to_node(self, row: sqlite3.Row, now: float) -> Node:
        state = self._state(row, now)
        ip = f"10.{(row['seq'] >> 16) & 255}.{(row['seq'] >> 8) & 255}.{row['seq'] & 255}"
        tags = json.loads(row["tags"])
        extra = {"tags": tags, "metadata": tags, "client_token": row["client_token"], "image": row["image"],
                 "size": row["size"], "boot_at": row["boot_at"], "userdata_bytes": row["userdata_bytes"]}
        return Node(id=row["id"], name=row["name"], state=state,
                    public_ips=[ip] if state == NodeState.RUNNING else [],
                    private_ips=[ip] if state != NodeState.TERMINATED else [], driver=self, extra=extra,
                    created_at=datetime.fromtimestamp(row["created_at"], UTC))

    # ------------------------------------------------------------------ libcloud API
    def list_nodes(self, *args: Any, **kwargs: Any) -> list[Node]:
        partial = self._api_call("list") == "partial"
        now = self._now()
        rows = self._db().execute(
            "SELECT * FROM nodes WHERE terminated_at IS NULL OR terminated_at > ? ORDER BY seq",
            (now - self.terminated_linger,)).fetchall()
        if partial:
            rows = rows[:len(rows) // 2]
        elif rows and self.partial_listing_rate and self._random() < self.partial_listing_rate:
            with self._rng_lock:
                rows = rows[:self._rng.randrange(len(rows))]
        return [self._to_node(r, now) for r in rows]

    def create_node(self, name: str, size: NodeSize, image: NodeImage, location: NodeLocation | None = None,
                    auth: Any = None, ex_metadata: dict[str, str] | None = None,
                    ex_userdata: str | None = None, ex_clienttoken: str | None = None) -> Node:
        lost = self._api_call("create") == "lost"
        if not self.client_tokens:
            ex_clienttoken = None
        now = self._now()
        db = self._db()
        if ex_clienttoken:
            row = db.execute("SELECT * FROM nodes WHERE client_token = ?", (ex_clienttoken,)).fetchone()
            if row is not None:
                return self._to_node(row, now)
        if self.images is not None and image.id not in self.images:
            raise LibcloudError(f"InvalidAMIID.NotFound: the image id '{image.id}' does not exist", self)
        if self.capacity_error_rate and self._random() < self.capacity_error_rate:
            raise LibcloudError("InsufficientInstanceCapacity: simulated: no capacity for this size", self)
        boot = self.boot_time_min + self._random() * (self.boot_time_max - self.boot_time_min)
        fails = 1 if self.boot_failure_rate and self._random() < self.boot_failure_rate else 0
        node_id = "sim-" + uuid.uuid4().hex[:16]
        with self._write_lock:
            db.execute("BEGIN IMMEDIATE")
            try:
                if ex_clienttoken:
                    row = db.execute("SELECT * FROM nodes WHERE client_token = ?", (ex_clienttoken,)).fetchone()
                    if row is not None:
                        db.execute("COMMIT")
                        return self._to_node(row, now)
                if self.quota is not None:
                    live = db.execute("SELECT COUNT(*) FROM nodes WHERE terminated_at IS NULL").fetchone()[0]
                    if live >= self.quota:
                        raise LibcloudError(
                            f"InstanceLimitExceeded: quota of {self.quota} instances reached", self)
                db.execute(
                    "INSERT INTO nodes (id, name, client_token, image, size, created_at, boot_at, boot_fails, tags,"
                    " userdata_bytes) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (node_id, name, ex_clienttoken or None, image.id, size.id, now, now + boot, fails,
                     json.dumps(ex_metadata or {}, sort_keys=True), len((ex_userdata or "").encode())))
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        row = db.execute("SELECT * FROM nodes WHERE id = ?", (node_id,)).fetchone()
        if lost:
            raise BaseHTTPError(504, "GatewayTimeout: injected: the node was created but the answer was lost")
        return self._to_node(row, now)

    def destroy_node(self, node: Node) -> bool:
        self._api_call("destroy")
        with self._write_lock:
            self._db().execute("UPDATE nodes SET terminated_at = ? WHERE id = ? AND terminated_at IS NULL",
                               (self._now(), node.id))
        return True

    def list_images(self, location: NodeLocation | None = None, ex_owner: Any = None) -> list[NodeImage]:
        return [NodeImage(id=i, name=i, driver=self) for i in (self.images or ["sim-image"])]

    def list_sizes(self, location: NodeLocation | None = None) -> list[NodeSize]:
        return [NodeSize(id=f"sim.{c}core", name=f"sim {c} core", ram=2048 * c, disk=20, bandwidth=None,
                         price=0.05 * c, driver=self, extra={"cores": c}) for c in (1, 2, 4, 8)]

    def list_locations(self) -> list[NodeLocation]:
        return [NodeLocation(id="sim-1", name="sim-1", country="ZZ", driver=self)]

    # ------------------------------------------------------------------ test helpers
    def ex_vanish(self, node_id: str) -> None:
        """Make a node disappear without a trace (as if deleted behind our back)."""
        with self._write_lock:
            self._db().execute("DELETE FROM nodes WHERE id = ?", (node_id,))

    def ex_count(self, live_only: bool = True) -> int:
        q = "SELECT COUNT(*) FROM nodes" + (" WHERE terminated_at IS NULL" if live_only else "")
        return int(self._db().execute(q).fetchone()[0])
