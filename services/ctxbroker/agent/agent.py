"""The agent's loop: register, long-poll, apply entries in order with scripts, leave on shutdown.

Applying follows the paper: ``init`` scripts once at first start; for each entry, in id
order, ``add-node`` (join) or ``delete-node`` (leave) with that node's fields in the
environment; then ``restart`` once per batch. The state file records the last applied id
after every entry, and a ``restart_pending`` flag until the batch's restart scripts ran, so
a restart (even after a crash) neither re-applies an entry nor forgets the restart hook.

The membership is folded as the broker folds it (a join sets the host's fields, a leave
removes the host: ``core.apply_entry``) and written to ``members.json`` before the scripts
run, so a script can render the whole cluster (``EPU_CTX_MEMBERS``) rather than patch files
entry by entry. The agent itself appends one line per change to its change log.

A new agent (or one far behind) is sent a *snapshot*: the current members as one batch. The
agent diffs it against what it had — ``delete-node`` for members gone, ``add-node`` for new or
changed ones (``EPU_ENTRY_KIND`` is still join/leave; ``EPU_SNAPSHOT=1``) — then runs
``restart`` once, and records the snapshot's id only at the end, so a crash half-way re-applies
the same diff (scripts must be idempotent, as the default ones are).
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from epu.services.ctxbroker.agent.config import AgentConfig
from epu.services.ctxbroker.agent.scripts import hook_dir, run_hook, scripts_of
from epu.services.ctxbroker.agent.state import AgentState, atomic_write
from epu.services.ctxbroker.client import BrokerError, NodeClient
from epu.services.ctxbroker.core import Entry, NodeFields

log = logging.getLogger("epu.ctxagent")


def entry_from_wire(doc: dict[str, Any]) -> Entry:
    return Entry(entry_id=int(doc["id"]), kind=doc["kind"], hostname=doc["hostname"], fqdn=doc.get("fqdn", ""),
                 ip=doc.get("ip", ""), ssh_host_key=doc.get("ssh_host_key", ""), data=doc.get("data", ""),
                 instance_id=doc.get("instance_id"), reason=doc.get("reason", ""), at=float(doc.get("at", 0)))


def member_doc(entry: Entry) -> dict[str, Any]:
    """A member as ``members.json`` holds it (``NodeFields``' fields, from a join the broker
    validated; built directly: a model per member is 10,000 models per snapshot)."""
    return {"hostname": entry.hostname, "fqdn": entry.fqdn, "ip": entry.ip, "ssh_host_key": entry.ssh_host_key,
            "data": entry.data, "instance_id": entry.instance_id}


def node_env(entry: Entry) -> dict[str, str]:
    return {"EPU_ENTRY_ID": str(entry.entry_id), "EPU_ENTRY_KIND": entry.kind,
            "EPU_NODE_HOSTNAME": entry.hostname, "EPU_NODE_FQDN": entry.fqdn, "EPU_NODE_IP": entry.ip,
            "EPU_NODE_SSH_HOST_KEY": entry.ssh_host_key, "EPU_NODE_DATA": entry.data,
            "EPU_NODE_INSTANCE_ID": entry.instance_id or "", "EPU_NODE_REASON": entry.reason}


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
            self._write_members()
            run_hook(self.cfg.scripts_dir, "init", self._base_env(), self.cfg.script_timeout)
            self.state.init_done = True
            self.state.save(self.state_path)
        if self.state.restart_pending:  # a crash between the last entry and its restart hook
            self.restart()

    def _entry_hooks(self) -> bool:
        """Are there add-node or delete-node scripts? Without them (the default scripts render
        the whole membership once per batch, in restart.d) a batch is written once, not per entry."""
        return bool(scripts_of(hook_dir(self.cfg.scripts_dir, "add-node"))
                    or scripts_of(hook_dir(self.cfg.scripts_dir, "delete-node")))

    def _write_members(self) -> None:
        # compact on purpose: json's C encoder does not indent, and 10,000 members indented
        # by the pure-Python one cost a third of a second per write
        atomic_write(self.members_path, json.dumps(self.state.members, sort_keys=True, separators=(",", ":")))

    def _log_changes(self, entries: list[Entry], snapshot: bool = False) -> None:
        """One line per applied change in the change log (``change_log``; what the old
        add-node.d/delete-node.d/10-log scripts wrote, without a process per entry)."""
        if not entries or not self.cfg.change_log_path():
            return
        path = Path(self.cfg.change_log_path())
        now = time.strftime("%Y-%m-%dT%H:%M:%S")
        mark = " snapshot" if snapshot else ""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a") as f:
                f.writelines(f"{now} entry={e.entry_id} {e.kind} {e.hostname} {e.ip}{mark}\n" for e in entries)
        except OSError as exc:
            log.warning("cannot write the change log", extra={"file": str(path), "error": exc.strerror})

    def apply(self, entries: list[Entry]) -> int:
        """Apply entries newer than the last applied one, in order; return how many were applied.

        With per-entry scripts, each entry is recorded (members.json, state) before its script
        runs, so a crash re-runs at most that entry's script. Without them the batch is folded
        and recorded once (10,000 members make members.json megabytes: writing it per entry
        would cost more than the entries)."""
        todo = [e for e in sorted(entries, key=lambda e: e.entry_id) if e.entry_id > self.state.last_id]
        per_entry = self._entry_hooks() if todo else False
        for entry in todo:
            if entry.kind == "join":
                self.state.members[entry.hostname] = member_doc(entry)
            else:
                self.state.members.pop(entry.hostname, None)
            if per_entry:
                self._write_members()
                hook = "add-node" if entry.kind == "join" else "delete-node"
                run_hook(self.cfg.scripts_dir, hook, {**self._base_env(), **node_env(entry)}, self.cfg.script_timeout)
                self.state.last_id = entry.entry_id
                self.state.restart_pending = True
                self.state.save(self.state_path)
                self._log_changes([entry])
            self.applied.append(entry.entry_id)
        if todo and not per_entry:
            self._write_members()
            self.state.last_id = todo[-1].entry_id
            self.state.restart_pending = True
            self.state.save(self.state_path)
            self._log_changes(todo)
        if self.state.restart_pending:
            self.restart()
        return len(todo)

    def apply_snapshot(self, members_entries: list[Entry], last_id: int) -> int:
        """Replace the membership with a snapshot's (see the module docstring); return how many
        members were removed, added or changed."""
        old = self.state.members
        new = {e.hostname: e for e in members_entries}
        final = {h: member_doc(e) for h, e in new.items()}
        gone = [Entry(entry_id=last_id, kind="leave", hostname=h, fqdn=old[h].get("fqdn", ""),
                      ip=old[h].get("ip", ""), instance_id=old[h].get("instance_id"),
                      reason="not a member any more (snapshot)") for h in sorted(set(old) - set(new))]
        changed = [e for e in sorted(new.values(), key=lambda e: e.entry_id)
                   if old.get(e.hostname) != final[e.hostname]]
        self.state.members = final
        self._write_members()
        self.state.members = old  # recorded only once applied (see the module docstring)
        if self._entry_hooks():
            snap_env = {**self._base_env(), "EPU_SNAPSHOT": "1"}
            for entry in gone:
                run_hook(self.cfg.scripts_dir, "delete-node", {**snap_env, **node_env(entry)}, self.cfg.script_timeout)
            for entry in changed:
                run_hook(self.cfg.scripts_dir, "add-node", {**snap_env, **node_env(entry)}, self.cfg.script_timeout)
        self.state.members = final
        self.state.last_id = last_id
        self.state.restart_pending = True
        self.state.save(self.state_path)
        self._log_changes(gone + changed, snapshot=True)
        self.applied.append(last_id)
        self.restart()
        return len(gone) + len(changed)

    def restart(self) -> None:
        run_hook(self.cfg.scripts_dir, "restart", self._base_env(), self.cfg.script_timeout)
        self.state.restart_pending = False
        self.state.save(self.state_path)

    # ------------------------------------------------------------------ network
    def _retrying(self, what: str, fn: Callable[[], Any]) -> Any:
        """Call ``fn`` until it succeeds or the agent stops; back off (with jitter) in between.

        A broker that says when to retry (``Retry-After``: a join held until the provisioner
        reports this instance's address) is retried then, without growing the backoff: the
        wait is for a fact about to arrive, not for an overloaded broker."""
        delay = self.cfg.backoff_initial
        while not self._stop.is_set():
            asked: float | None = None
            try:
                return fn()
            except BrokerError as exc:
                asked = exc.retry_after
                level = logging.ERROR if not exc.retryable else logging.WARNING
                log.log(level, f"{what} failed, retrying", extra={
                    "status": exc.status, "error": exc.message,
                    "retry_in": round(delay if asked is None else asked, 2)})
            if asked is not None:
                if self._sleep(min(self.cfg.backoff_max, asked) * (0.5 + random.random() / 2)):
                    return None
                continue
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
            self.state.last_id = 0  # the members stay: the snapshot that follows is diffed against them
            self.state.save(self.state_path)
            return 0
        entries = [entry_from_wire(e) for e in doc.get("entries", [])]
        if doc.get("snapshot"):
            return self.apply_snapshot(entries, int(doc["last_id"]))
        return self.apply(entries)

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
