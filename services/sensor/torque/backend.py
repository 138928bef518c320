"""Torque backend (imperative shell).

Read path: pbs_python's low-level ``pbs`` module (``pbs_statjob``/``pbs_statnode``) when it
imports, else — and always as the fallback — ``qstat -f -x -t`` and ``pbsnodes -x``. Each
element of a job array is listed (``-t``) so arrays count per element.

Commands, with the traps seen on a real TORQUE 6.1.3 (tests/sensor/fixtures/torque/README.md):

* ``add``: ``qmgr -c "create node NAME np=N"``; "Node name already exists" is success. Then
  ``qmgr -c "set server scheduling = True"``, because jobs can stay queued after nodes are
  added until scheduling is true on the server.
* ``offline``: ``pbsnodes -o NAME`` (+ ``-N note``); it exits 0 even for an unknown node and
  only complains on stderr, so any "Unknown node"/"Error" on stderr is a failure.
* ``online``: ``pbsnodes -c NAME`` (same stderr trap).
* ``remove``: first read the node; refuse if it runs a job — deleting such a node blocks about
  120 s and purges its jobs, so not even ``force`` does it (offline it and let the jobs end).
  Then ``qmgr -c "delete node NAME"``; "Unknown node" means already removed: success.

``qmgr -c`` takes one string, but it is one argv element (no shell) and NAME has passed the
RFC 1123 check, so it can hold neither quotes nor separators.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from common.clock import Clock, RealClock
from services.sensor.backend import (
    BackendUnavailable,
    CommandOutcome,
    Observation,
    check_action,
    check_node_name,
)
from services.sensor.runner import CommandResult, CommandRunner
from services.sensor.torque.parse import normalize_jobs, normalize_nodes, parse_pbsnodes, parse_qstat

log = logging.getLogger("epu.sensor.torque")

STDERR_FAILURE_MARKERS = ("unknown node", "error", "cannot", "unauthorized", "invalid")


def stderr_failure(res: CommandResult) -> bool:
    """pbsnodes exits 0 on some failures and says so only on stderr."""
    err = (res.stderr or "").lower()
    return any(marker in err for marker in STDERR_FAILURE_MARKERS)


def load_pbs_python() -> Any | None:
    """pbs_python's ``pbs`` module, or ``None`` (it does not import on Python 3.11: see README)."""
    try:
        import pbs  # type: ignore[import-not-found]
    except Exception as exc:  # ImportError, or OSError from a missing libpython2.7/libssl
        log.debug("pbs_python unavailable, using the Torque CLI", extra={"error": str(exc)})
        return None
    return pbs


class PbsPythonReader:
    """Reads through pbs_python's ``pbs`` module into the same flat records as the XML parser."""

    def __init__(self, pbs: Any, server: str | None = None) -> None:
        self.pbs = pbs
        self.server = server

    def _records(self, batch: Any) -> list[dict[str, str]]:
        out = []
        item = batch
        while item is not None:
            rec = {"Job_Id": item.name, "name": item.name}
            attr = item.attribs
            while attr is not None:
                key = f"{attr.name}.{attr.resource}" if attr.resource else attr.name
                rec[key] = attr.value
                attr = attr.next
            out.append(rec)
            item = item.next
        return out

    def read(self) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
        conn = self.pbs.pbs_connect(self.server or self.pbs.pbs_default())
        if conn < 0:
            raise BackendUnavailable(f"pbs_connect failed: {self.pbs.error()}")
        try:
            jobs = self._records(self.pbs.pbs_statjob(conn, "", None, "t"))
            nodes = self._records(self.pbs.pbs_statnode(conn, "", None, None))
        finally:
            self.pbs.pbs_disconnect(conn)
        return jobs, nodes


class TorqueBackend:
    name = "torque"

    def __init__(self, runner: Any = None, *, bin_dir: str | None = None, use_pbs_python: bool = True,
                 server: str | None = None, clock: Clock | None = None) -> None:
        self.runner = runner or CommandRunner()
        self.bin_dir = bin_dir
        self.server = server
        self.clock = clock or RealClock()
        pbs = load_pbs_python() if use_pbs_python else None
        self.pbs_reader = PbsPythonReader(pbs, server) if pbs is not None else None

    @classmethod
    def from_options(cls, opts: dict[str, Any], *, timeout: float = 60.0, clock: Clock | None = None) -> TorqueBackend:
        return cls(CommandRunner(timeout=timeout), bin_dir=opts.get("bin_dir"),
                   use_pbs_python=bool(opts.get("use_pbs_python", True)), server=opts.get("server"), clock=clock)

    def _exe(self, name: str) -> str:
        if self.bin_dir:
            return str(Path(self.bin_dir) / name)
        return shutil.which(name) or name

    def _run(self, name: str, *args: str) -> CommandResult:
        return self.runner.run([self._exe(name), *args])

    # ------------------------------------------------------------------ read
    def snapshot(self) -> Observation:
        now = self.clock.now()
        warnings: list[str] = []
        if self.pbs_reader is not None:
            try:
                job_recs, node_recs = self.pbs_reader.read()
                jobs = normalize_jobs(job_recs, now)
                nodes = normalize_nodes(node_recs, warnings)
                return Observation(jobs=jobs.queued, nodes=nodes, running_jobs=jobs.running,
                                   finished_jobs=jobs.finished, warnings=warnings)
            except Exception as exc:  # fall back to the CLI, which must always work
                log.warning("pbs_python read failed, using the CLI", extra={"error": str(exc)})
        qstat = self._run("qstat", "-f", "-x", "-t")
        if not qstat.ok:
            raise BackendUnavailable(f"qstat -f -x -t failed (exit {qstat.returncode}): {qstat.text()}")
        pbsnodes = self._run("pbsnodes", "-x")
        if not pbsnodes.ok:
            raise BackendUnavailable(f"pbsnodes -x failed (exit {pbsnodes.returncode}): {pbsnodes.text()}")
        try:
            jobs = parse_qstat(qstat.stdout, now)
            nodes = parse_pbsnodes(pbsnodes.stdout, warnings)
        except Exception as exc:  # ParseError: truncated output is unreadable, not empty
            raise BackendUnavailable(f"cannot parse Torque XML: {type(exc).__name__}: {exc}") from None
        warnings += [f"torque: unmapped job state {s!r}: job ignored" for s in jobs.unknown_states]
        return Observation(jobs=jobs.queued, nodes=nodes, running_jobs=jobs.running,
                           finished_jobs=jobs.finished, warnings=warnings)

    def node(self, name: str) -> Any | None:
        res = self._run("pbsnodes", "-x", check_node_name(name))
        if res.timed_out:
            raise BackendUnavailable(res.text())
        if not res.ok or not res.stdout.strip():
            if "unknown node" in res.text().lower():
                return None
            raise BackendUnavailable(f"pbsnodes -x {name} failed (exit {res.returncode}): {res.text()}")
        nodes = parse_pbsnodes(res.stdout)
        return next((n for n in nodes if n.name == name), None)

    # ------------------------------------------------------------------ commands
    def execute(self, action: str, node: str, *, cores: int | None = None, address: str | None = None,
                reason: str = "", force: bool = False) -> CommandOutcome:
        check_action(action)
        check_node_name(node)
        try:
            if action == "add":
                return self._add(node, cores or 1)
            if action == "offline":
                args = ["-o", node]
                if reason:
                    args = ["-o", "-N", " ".join(reason.split())[:200], node]
                return self._pbsnodes(args, f"pbsnodes -o {node}")
            if action == "online":
                return self._pbsnodes(["-c", node], f"pbsnodes -c {node}")
            return self._remove(node)
        except BackendUnavailable as exc:
            return CommandOutcome(False, error=str(exc), transient=True)

    def _pbsnodes(self, args: list[str], what: str) -> CommandOutcome:
        res = self._run("pbsnodes", *args)
        if res.timed_out:
            return CommandOutcome(False, output=res.text(), error=f"{what} timed out", transient=True)
        if not res.ok or stderr_failure(res):
            return CommandOutcome(False, output=res.text(),
                                  error=f"{what} failed (exit {res.returncode}): {res.text() or 'no output'}")
        return CommandOutcome(True, changed=True, output=res.text())

    def _qmgr(self, command: str) -> CommandResult:
        return self._run("qmgr", "-c", command)

    def _add(self, node: str, cores: int) -> CommandOutcome:
        res = self._qmgr(f"create node {node} np={int(cores)}")
        text = res.text()
        if res.timed_out:
            return CommandOutcome(False, output=text, error="qmgr create node timed out", transient=True)
        exists = "already exists" in text.lower()
        if not res.ok and not exists:
            return CommandOutcome(False, output=text, error=f"qmgr create node {node} failed "
                                  f"(exit {res.returncode}): {text or 'no output'}")
        sched = self._qmgr("set server scheduling = True")
        output = "\n".join(t for t in (text, sched.text()) if t)
        if not sched.ok:
            return CommandOutcome(False, changed=not exists, output=output,
                                  error=f"node {node} created but 'set server scheduling = True' failed: "
                                        f"{sched.text()}")
        return CommandOutcome(True, changed=not exists,
                              output=output or (f"node {node} already exists" if exists else f"node {node} created"))

    def _remove(self, node: str) -> CommandOutcome:
        info = self.node(node)
        if info is None:
            return CommandOutcome(True, output=f"node {node} is not known to Torque (already removed)")
        if info.jobs:
            return CommandOutcome(False, output=f"jobs={','.join(info.jobs)} state={info.native_state}",
                                  error=f"node {node} runs job(s) {', '.join(info.jobs)}: Torque would block "
                                        "~120 s and purge them; offline it and wait for them to end")
        res = self._qmgr(f"delete node {node}")
        text = res.text()
        if res.timed_out:
            return CommandOutcome(False, output=text, error="qmgr delete node timed out", transient=True)
        if not res.ok:
            if "unknown node" in text.lower():
                return CommandOutcome(True, output=text or f"node {node} already removed")
            return CommandOutcome(False, output=text, error=f"qmgr delete node {node} failed "
                                  f"(exit {res.returncode}): {text or 'no output'}")
        return CommandOutcome(True, changed=True, output=text or f"node {node} deleted")
