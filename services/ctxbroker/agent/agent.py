"""The agent's loop: register, long-poll, apply entries in order with scripts, leave on shutdown.

Applying follows the paper: ``init`` scripts once at first start; for each entry, in id
order, ``add-node`` (join) or ``delete-node`` (leave) with that node's fields in the
environment; then ``restart`` once per batch. The state file records the last applied id
after every entry, and a ``restart_pending`` flag until the batch's restart scripts ran, so
a restart (even after a crash) neither re-applies an entry nor forgets the restart hook.

The membership is folded with the broker's own reducer (``core.apply_entry``) and written
to ``members.json`` before the scripts run, so a script can render the whole cluster
(``EPU_CTX_MEMBERS``) rather than patch files entry by entry.
"""

from __future__ import annotations

import json
import logging
import random
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from services.ctxbroker.agent.config import AgentConfig
from services.ctxbroker.agent.scripts import run_hook
from services.ctxbroker.agent.state import AgentState, atomic_write
from services.ctxbroker.client import BrokerError, NodeClient
from services.ctxbroker.core import Entry, NodeFields, apply_entry

log = logging.getLogger("epu.ctxagent")


def entry_from_wire(doc: dict[str, Any]) -> Entry:
    return Entry(entry_id=int(doc["id"]), kind=doc["kind"], hostname=doc["hostname"], fqdn=doc.get("fqdn", ""),
                 ip=doc.get("ip", ""), ssh_host_key=doc.get("ssh_host_key", ""), data=doc.get("data", ""),
                 instance_id=doc.get("instance_id"), reason=doc.get("reason", ""), at=float(doc.get("at", 0)))


def node_env(entry: Entry) -> dict[str, str]:
    return {"EPU_ENTRY_ID": str(entry.entry_id), "EPU_ENTRY_KIND": entry.kind,
            "EPU_NODE_HOSTNAME": entry.hostname, "EPU_NODE_FQDN": entry.fqdn, "EPU_NODE_IP": entry.ip,
            "EPU_NODE_SSH_HOST_KEY": entry.ssh_host_key, "EPU_NODE_DATA": entry.data,
            "EPU_NODE_INSTANCE_ID": entry.instance_id or "", "EPU_NODE_REASON": entry.reason}


def _members_doc(members: dict[str, NodeFields]) -> dict[str, dict[str, Any]]:
    return {h: n.model_dump() for h, n in sorted(members.items())}


class Agent:
    def __init__(self, cfg: AgentConfig, node: NodeFields, *, client: NodeClient | None = None,
                 sleep: Callable[[float], bool] | None = None) -> None:
        self.cfg = cfg
        self.node = node
        self.client = client or NodeClient(cfg.uri, cfg.key, cfg.secret, ca_file=cfg.ca_path(),
                                           insecure=cfg.insecure, timeout=15.0)
        self.state_dir = Path(cfg.state_dir)
        self.state_path = self.state_dir / "state.json"
        self.members_path = self.state_dir / "members.json"
        self.state = AgentState.load(self.state_path)
        if self.state.context_uri and self.state.context_uri != cfg.uri:
            # a different context: its ids mean nothing here, start over
            log.warning("state belongs to another context, starting fresh",
                        extra={"old": self.state.context_uri, "new": cfg.uri})
            self.state = AgentState()
        self.state.context_uri = cfg.uri
        self._stop = threading.Event()
        self._sleep = sleep or self._stop.wait
        self._left = threading.Event()
        self._leave_thread: threading.Thread | None = None
        self.registered = threading.Event()
        self.applied: list[int] = []

    # ------------------------------------------------------------------ applying (no network)
    def members(self) -> dict[str, NodeFields]:
        return {h: NodeFields.model_construct(**d) for h, d in self.state.members.items()}

    def _base_env(self) -> dict[str, str]:
        return {"EPU_CTX_ROOT": self.cfg.root, "EPU_CTX_MEMBERS": str(self.members_path),
                "EPU_CTX_URI": self.cfg.uri, "EPU_SELF_HOSTNAME": self.node.hostname}

    def ensure_init(self) -> None:
        if not self.state.init_done:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            atomic_write(self.members_path, json.dumps(self.state.members, indent=1))
            run_hook(self.cfg.scripts_dir, "init", self._base_env(), self.cfg.script_timeout)
            self.state.init_done = True
            self.state.save(self.state_path)
        if self.state.restart_pending:  # a crash between the last entry and its restart hook
            self.restart()

    def apply(self, entries: list[Entry]) -> int:
        """Apply entries newer than the last applied one, in order; return how many were applied."""
        count = 0
        for entry in sorted(entries, key=lambda e: e.entry_id):
            if entry.entry_id <= self.state.last_id:
                continue
            members = apply_entry(self.members(), entry)
            self.state.members = _members_doc(members)
            atomic_write(self.members_path, json.dumps(self.state.members, indent=1))
            hook = "add-node" if entry.kind == "join" else "delete-node"
            run_hook(self.cfg.scripts_dir, hook, {**self._base_env(), **node_env(entry)}, self.cfg.script_timeout)
            self.state.last_id = entry.entry_id
            self.state.restart_pending = True
            self.state.save(self.state_path)
            self.applied.append(entry.entry_id)
            count += 1
        if self.state.restart_pending:
            self.restart()
        return count

    def restart(self) -> None:
        run_hook(self.cfg.scripts_dir, "restart", self._base_env(), self.cfg.script_timeout)
        self.state.restart_pending = False
        self.state.save(self.state_path)

    # ------------------------------------------------------------------ network
    def _retrying(self, what: str, fn: Callable[[], Any]) -> Any:
        """Call ``fn`` until it succeeds or the agent stops; back off (with jitter) in between."""
        delay = self.cfg.backoff_initial
        while not self._stop.is_set():
            try:
                return fn()
            except BrokerError as exc:
                level = logging.ERROR if not exc.retryable else logging.WARNING
                log.log(level, f"{what} failed, retrying", extra={"status": exc.status, "error": exc.message,
                                                                  "retry_in": round(delay, 2)})
            if self._sleep(delay * (0.5 + random.random() / 2)):
                return None
            delay = min(self.cfg.backoff_max, delay * 2)
        return None

    def register(self) -> None:
        if self._retrying("join", lambda: self.client.join(self.node.model_dump())) is not None:
            self.registered.set()
            log.info("joined context", extra={"hostname": self.node.hostname})

    def poll_once(self) -> int:
        wait = self.cfg.wait if self.cfg.long_poll else 0.0
        doc = self._retrying("reading updates", lambda: self.client.updates(self.state.last_id, wait))
        if doc is None:
            return 0
        if int(doc.get("last_id", 0)) < self.state.last_id:
            # the broker's list is shorter than what we applied: the context was recreated or its
            # store restored from an older backup. Our ids mean nothing now; start from 0.
            log.warning("broker list is behind this agent, re-applying from the start",
                        extra={"broker_last_id": doc.get("last_id"), "applied": self.state.last_id})
            self.state.last_id = 0
            self.state.members = {}
            self.state.save(self.state_path)
            return 0
        return self.apply([entry_from_wire(e) for e in doc.get("entries", [])])

    def run(self) -> None:
        """Register, then apply updates until ``stop()``; leave the context on the way out."""
        try:
            self.ensure_init()
            self.register()
            while not self._stop.is_set():
                self.poll_once()
                if not self.cfg.long_poll and self._sleep(self.cfg.poll_interval):
                    break
        finally:
            self._do_leave()
            if self._leave_thread is not None:
                self._leave_thread.join(20)
            self.client.close()

    def stop(self) -> None:
        """Ask the loop to end. The leave is sent right away (from a helper thread): its own entry
        wakes our long-poll, so shutdown does not wait out the poll."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._leave_thread = threading.Thread(target=self._do_leave, name="ctx-leave", daemon=True)
        self._leave_thread.start()

    def _do_leave(self) -> None:
        if self._left.is_set() or not self.registered.is_set():
            return
        self._left.set()
        for attempt in range(3):
            client = NodeClient(self.cfg.uri, self.cfg.key, self.cfg.secret, ca_file=self.cfg.ca_path(),
                                insecure=self.cfg.insecure, timeout=10.0)
            try:
                client.leave(self.node.hostname)
                log.info("left context", extra={"hostname": self.node.hostname})
                return
            except BrokerError as exc:
                if not exc.retryable:
                    return
                threading.Event().wait(0.5 * 2 ** attempt)
            finally:
                client.close()
