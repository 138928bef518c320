"""Torque backend (imperative shell).

Read path: pbs_python's low-level ``pbs`` module (``pbs_statjob``/``pbs_statnode``) when it
imports — asking the server for only the job attributes EPU needs (``JOB_ATTRIBUTES``, a
server-side projection) — else, and always as the fallback, ``qstat -f -x -t`` (scanned in one
pass for the needed attributes, ``parse.scan_qstat``) and ``pbsnodes -x``. Each element of a
job array is listed (``-t``) so arrays count per element.

Commands, with the traps seen on a real TORQUE 6.1.3 (tests/sensor/fixtures/torque/README.md),
touching only what EPU set (an administrator's settings, notes and offlines are theirs):

* ``add``: ``qmgr -c "create node NAME np=N"``; "Node name already exists" is success; with an
  instance id the node gets the property ``epu-<id>`` (its identity, read back as
  ``NodeInfo.instance_id``). Torque resolves NAME on the head node, and the command carries
  no address: a name the head node cannot resolve fails with "Unknown node" — run the context
  agent on the head node so every joined worker is in its ``/etc/hosts`` (docs/sensor.md);
  until it is, the failure is transient and the re-sent command runs again. The server's
  ``scheduling`` is never changed: when an administrator set it False, the result says that
  jobs will not start until they set it back.
* ``offline``: ``pbsnodes -o -N NOTE NAME`` where NOTE is the node's current note with EPU's
  part (``[epu: reason]``) appended — an administrator's note is kept. A node already offline
  is left alone. A node just created cannot be offlined for ~10 s (``MOM-list-not-sent``):
  that failure is transient (not remembered; the re-sent command runs again).
  ``pbsnodes`` exits 0 on failures and only complains on stderr, so any "Unknown
  node"/"Error" on stderr is a failure.
* ``online``: only an offline EPU set (its note carries ``[epu: ...]``) is cleared
  (``pbsnodes -c -N ADMIN_NOTE NAME``, the administrator's part of the note kept); a node an
  administrator offlined (maintenance) stays offline and the command says so.
* ``remove``: first read the node; refuse if it runs a job — deleting such a node blocks about
  120 s and purges its jobs, so not even ``force`` does it (offline it and let the jobs end).
  Then ``qmgr -c "delete node NAME"``; "Unknown node" means already removed: success.
* ``requeue_jobs`` (before the remove of a node whose machine the cloud preempted, or announced
  it will): the node's jobs from ``pbsnodes -x NAME``; the node offlined first (the scheduler
  must not start them there again); then ``qrerun -f JOBID`` per job — ``-f`` because the
  node's MOM is dead or about to be (Torque then requeues without waiting for it). A job id
  that is not ``N``, ``N[i]`` or either with ``.server`` is refused before any command line;
  "Unknown Job Id" (it ended) or "Request invalid for state of job" (already requeued) is not an
  error. qrerun's own messages on
  TORQUE 6.1.3 were not captured (no test server); the markers follow its client's wording.

``qmgr -c`` takes one string, but it is one argv element (no shell) and NAME has passed the
RFC 1123 check, so it can hold neither quotes nor separators; notes are passed as their own
argv element to ``pbsnodes -N``.
"""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path
from typing import Any

from epu.common.clock import Clock, RealClock
from epu.services.sensor.backend import (
    BackendUnavailable,
    CommandOutcome,
    Observation,
    check_action,
    check_node_name,
)
from epu.services.sensor.runner import CommandResult, CommandRunner
from epu.services.sensor.shapes import ShapeGrouper
from epu.services.sensor.torque.errors import classify, is_transient
from epu.services.sensor.torque.parse import (
    JOB_ATTRIBUTES,
    instance_property,
    iter_records,
    jobs_on_node,
    normalize_jobs,
    normalize_nodes,
    parse_pbsnodes,
    scan_qstat,
    split_properties,
)

log = logging.getLogger("epu.sensor.torque")

STDERR_FAILURE_MARKERS = ("unknown node", "error", "cannot", "unauthorized", "invalid", "unavailable",
                          "could not", "busy", "time out")
EPU_NOTE = re.compile(r"\s*\[epu: [^\]]*\]")
#: Torque job ids ``qrerun`` may be given: ``123``, ``123.server``, array elements ``123[4].server``.
JOB_ID = re.compile(r"\d+(?:\[\d*\])?(?:\.[A-Za-z0-9][A-Za-z0-9.-]*)?")
#: qrerun's answers for a job that is no longer running there: it ended, or a first requeue got
#: it already (the server may list it on the node a moment longer).
QRERUN_GONE = ("unknown job id", "request invalid for state of job")


def epu_note(note: str, reason: str) -> str:
    """The node note with EPU's part set to ``reason`` (the administrator's text kept)."""
    admin = admin_note(note)
    ours = "[epu: " + (" ".join(reason.replace("[", "(").replace("]", ")").split())[:180] or "offline") + "]"
    return f"{admin} {ours}".strip()


def admin_note(note: str) -> str:
    """The node note without EPU's part."""
    return EPU_NOTE.sub("", note or "").strip()


def transient_text(text: str) -> bool:
    """A failure that goes away by itself (``torque/errors.py``): not remembered, re-run later."""
    return is_transient(text)


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

    def _attrl(self, names: tuple[str, ...]) -> Any:
        """An ``attrl`` list naming the attributes to return (server-side projection), or
        None when this pbs_python has no ``new_attrl`` (then the server sends everything)."""
        new_attrl = getattr(self.pbs, "new_attrl", None)
        if new_attrl is None:
            return None
        attrs = new_attrl(len(names))
        for i, name in enumerate(names):
            attrs[i].name = name
        return attrs

    def read(self) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
        conn = self.pbs.pbs_connect(self.server or self.pbs.pbs_default())
        if conn < 0:
            raise BackendUnavailable(f"pbs_connect failed: {self.pbs.error()}")
        try:
            jobs = self._records(self.pbs.pbs_statjob(conn, "", self._attrl(JOB_ATTRIBUTES), "t"))
            nodes = self._records(self.pbs.pbs_statnode(conn, "", None, None))
        finally:
            self.pbs.pbs_disconnect(conn)
        return jobs, nodes


class TorqueBackend:
    name = "torque"

    def __init__(self, runner: Any = None, *, bin_dir: str | None = None, use_pbs_python: bool = True,
                 server: str | None = None, clock: Clock | None = None, max_shapes: int = 2000) -> None:
        self.max_shapes = max_shapes
        self.runner = runner or CommandRunner()
        self.bin_dir = bin_dir
        self.server = server
        self.clock = clock or RealClock()
        pbs = load_pbs_python() if use_pbs_python else None
        self.pbs_reader = PbsPythonReader(pbs, server) if pbs is not None else None

    @classmethod
    def from_options(cls, opts: dict[str, Any], *, timeout: float = 60.0, clock: Clock | None = None) -> TorqueBackend:
        return cls(CommandRunner(timeout=timeout), bin_dir=opts.get("bin_dir"),
                   use_pbs_python=bool(opts.get("use_pbs_python", True)), server=opts.get("server"), clock=clock,
                   max_shapes=int(opts.get("max_shapes", 2000)))

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
                jobs = normalize_jobs(job_recs, now, warnings, ShapeGrouper(self.max_shapes))
                nodes = normalize_nodes(node_recs, warnings)
                return Observation(jobs=jobs.sample, shapes=jobs.shapes(), nodes=nodes, running_jobs=jobs.running,
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
            jobs = scan_qstat(qstat.stdout, now, warnings, ShapeGrouper(self.max_shapes))
            nodes = parse_pbsnodes(pbsnodes.stdout, warnings)
        except Exception as exc:  # ParseError: truncated output is unreadable, not empty
            raise BackendUnavailable(f"cannot parse Torque XML: {type(exc).__name__}: {exc}") from None
        warnings += [f"torque: unmapped job state {s!r}: job ignored" for s in sorted(set(jobs.unknown_states))]
        return Observation(jobs=jobs.sample, shapes=jobs.shapes(), nodes=nodes, running_jobs=jobs.running,
                           finished_jobs=jobs.finished, warnings=warnings, owners=jobs.owners)

    def node_record(self, name: str) -> dict[str, str] | None:
        """The node's flat ``pbsnodes -x NAME`` record (state, note, properties...), None if unknown."""
        res = self._run("pbsnodes", "-x", check_node_name(name))
        if res.timed_out:
            raise BackendUnavailable(res.text())
        if not res.ok or not res.stdout.strip():
            if "unknown node" in res.text().lower():
                return None
            raise BackendUnavailable(f"pbsnodes -x {name} failed (exit {res.returncode}): {res.text()}")
        return next((r for r in iter_records(res.stdout, "Node") if r.get("name") == name), None)

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
                reason: str = "", force: bool = False, instance_id: str | None = None) -> CommandOutcome:
        check_action(action)
        check_node_name(node)
        if action in ("give_back", "release"):
            return CommandOutcome(False, error=f"{action} is Slurm's native mode: Torque has none")
        try:
            if action == "add":
                return self._add(node, cores or 1, instance_id)
            if action == "offline":
                return self._offline(node, reason)
            if action == "online":
                return self._online(node)
            return self._remove(node)
        except BackendUnavailable as exc:
            return CommandOutcome(False, error=str(exc), transient=True)

    def _pbsnodes(self, args: list[str], what: str) -> CommandOutcome:
        res = self._run("pbsnodes", *args)
        if res.timed_out:
            return CommandOutcome(False, output=res.text(), error=f"{what} timed out", transient=True)
        if not res.ok or stderr_failure(res):
            return CommandOutcome(False, output=res.text(), transient=transient_text(res.text()),
                                  error=f"{what} failed (exit {res.returncode}): {res.text() or 'no output'}")
        return CommandOutcome(True, changed=True, output=res.text())

    def _offline(self, node: str, reason: str) -> CommandOutcome:
        rec = self.node_record(node)
        if rec is None:
            return CommandOutcome(False, error=f"node {node} is not known to Torque",
                                  output=f"pbsnodes -x {node}: Unknown node")
        state, note = rec.get("state", ""), rec.get("note", "")
        tokens = {t.strip() for t in state.split(",")}
        if "MOM-list-not-sent" in tokens:
            return self._just_created(node, state, "offline")
        if "offline" in tokens:
            who = "EPU" if EPU_NOTE.search(note) else "an administrator (EPU leaves its note and offline alone)"
            return CommandOutcome(True, output=f"node {node} already offline ({state}), set by {who}")
        return self._pbsnodes(["-o", "-N", epu_note(note, reason or "offline"), node], f"pbsnodes -o {node}")

    def _online(self, node: str) -> CommandOutcome:
        rec = self.node_record(node)
        if rec is None:
            return CommandOutcome(False, error=f"node {node} is not known to Torque",
                                  output=f"pbsnodes -x {node}: Unknown node")
        state, note = rec.get("state", ""), rec.get("note", "")
        tokens = {t.strip() for t in state.split(",")}
        if "MOM-list-not-sent" in tokens:
            return self._just_created(node, state, "online")
        if "offline" not in tokens:
            return CommandOutcome(True, output=f"node {node} is not offline ({state})")
        if not EPU_NOTE.search(note):
            return CommandOutcome(False, output=f"state={state} note={note!r}",
                                  error=f"node {node} was offlined by an administrator (note: {note or 'none'}), "
                                        "not by EPU: it stays offline until they clear it")
        return self._pbsnodes(["-c", "-N", admin_note(note), node], f"pbsnodes -c {node}")

    @staticmethod
    def _just_created(node: str, state: str, action: str) -> CommandOutcome:
        """A node created moments ago reads ``down,offline,MOM-list-not-sent`` for ~10 s and
        refuses state changes: a transient failure, so the re-sent command runs again."""
        return CommandOutcome(False, transient=True, output=f"state={state}",
                              error=f"node {node} was just created ({state}): Torque refuses to {action} it "
                                    "for ~10 s; retry")

    def _qmgr(self, command: str) -> CommandResult:
        return self._run("qmgr", "-c", command)

    def _add(self, node: str, cores: int, instance_id: str | None = None) -> CommandOutcome:
        res = self._qmgr(f"create node {node} np={int(cores)}")
        text = res.text()
        if res.timed_out:
            return CommandOutcome(False, output=text, error="qmgr create node timed out", transient=True)
        exists = "already exists" in text.lower()
        if not res.ok and not exists:
            if "unknown node" in text.lower():  # PBSE_UNKNODE on create: the name does not resolve
                return CommandOutcome(False, output=text, transient=True,
                                      error=f"Torque cannot resolve {node} on the head node (qmgr: Unknown node): "
                                            "run the context agent on the head node so joined workers are in its "
                                            "/etc/hosts (docs/sensor.md, Torque); retried until it resolves")
            return CommandOutcome(False, output=text, transient=transient_text(text),
                                  error=f"qmgr create node {node} failed (exit {res.returncode}): {text or 'no output'}")
        outputs = [text or (f"node {node} already exists" if exists else f"node {node} created")]
        changed = not exists
        rec = self.node_record(node) if exists else None
        if exists and rec is not None and rec.get("np", "").isdigit() and int(rec["np"]) != int(cores):
            return CommandOutcome(False, output=text, error=(
                f"node {node} already exists with np={rec['np']} core(s), not the {int(cores)} asked: not changed "
                "(a name held by another node, or a slot of another size); remove it first"))
        prop = instance_property(instance_id)
        if instance_id and prop is None:
            outputs.append(f"instance id {instance_id!r} cannot be a Torque property: node matched by name only")
        if prop is not None:
            _features, current = split_properties((rec or {}).get("properties", ""))
            if current != instance_id:
                if current is not None:
                    self._qmgr(f"set node {node} properties -= {instance_property(current)}")
                setp = self._qmgr(f"set node {node} properties += {prop}")
                outputs.append(setp.text() or f"property {prop} set")
                if not setp.ok:
                    return CommandOutcome(False, changed=changed, output="\n".join(outputs), transient=setp.timed_out,
                                          error=f"node {node} added but its identity property could not be set: "
                                                f"{setp.text()}")
                changed = True
        sched = self._qmgr("list server scheduling")
        if sched.ok and re.search(r"scheduling\s*=\s*False", sched.stdout):
            outputs.append("note: server scheduling is False (an administrator's setting, left unchanged): "
                           "no job starts on the new node until it is set True")
        return CommandOutcome(True, changed=changed, output="\n".join(outputs))

    def requeue_jobs(self, node: str, reason: str = "") -> CommandOutcome:
        """Put the jobs on ``node`` back in the queue (its machine is gone or going): offline
        the node, then ``qrerun -f`` each job (see the module docstring)."""
        check_node_name(node)
        try:
            info = self.node(node)
        except BackendUnavailable as exc:
            return CommandOutcome(False, error=str(exc), transient=True)
        if info is None or not info.jobs:
            return CommandOutcome(True, output=f"no job on {node} to requeue")
        bad = [j for j in info.jobs if not JOB_ID.fullmatch(j)]
        if bad:
            return CommandOutcome(False, error=f"pbsnodes -x {node}: refusing job id {bad[0][:40]!r} (not N, N[i], "
                                               "or either with .server): nothing requeued")
        try:
            off = self._offline(node, reason or "requeue: the machine is gone")
        except BackendUnavailable as exc:
            return CommandOutcome(False, error=str(exc), transient=True)
        if not off.ok:
            return off
        outputs, changed = [off.output] if off.output else [], off.changed
        for job in info.jobs:
            res = self._run("qrerun", "-f", job)
            text = res.text()
            if res.timed_out:
                return CommandOutcome(False, changed=changed, output="\n".join(outputs + [text]),
                                      error=f"qrerun -f {job} timed out", transient=True)
            if not res.ok or stderr_failure(res):
                if any(m in text.lower() for m in QRERUN_GONE):
                    outputs.append(f"{job}: not running any more ({text})")
                    continue
                return CommandOutcome(False, changed=changed, output="\n".join(outputs + [text]),
                                      transient=transient_text(text),
                                      error=f"qrerun -f {job} failed (exit {res.returncode}): {text or 'no output'}")
            outputs.append(f"requeued {job}")
            changed = True
        return CommandOutcome(True, changed=changed, output="\n".join(outputs))

    def server_jobs_on(self, node: str) -> list[str]:
        """Jobs the server's job list (``qstat -f -x -t``) shows on ``node`` (``exec_host``), not
        completed. The node's own ``jobs`` attribute comes from its MOM's reports and is empty
        until the MOM reports again (seen after a pbs_server restart): not proof enough."""
        qstat = self._run("qstat", "-f", "-x", "-t")
        if not qstat.ok:
            raise BackendUnavailable(f"qstat -f -x -t failed (exit {qstat.returncode}): {qstat.text()}")
        try:
            return jobs_on_node(qstat.stdout, node)
        except Exception as exc:  # truncated output: unknown, not empty
            raise BackendUnavailable(f"cannot parse Torque XML: {type(exc).__name__}: {exc}") from None

    def _remove(self, node: str) -> CommandOutcome:
        info = self.node(node)
        if info is None:
            return CommandOutcome(True, output=f"node {node} is not known to Torque (already removed)")
        jobs = info.jobs or self.server_jobs_on(node)  # the server's job list when the node shows none
        if jobs:
            return CommandOutcome(False, output=f"jobs={','.join(jobs)} state={info.native_state}",
                                  error=f"node {node} runs job(s) {', '.join(jobs)} (pbsnodes and qstat): Torque "
                                        "would block ~120 s and purge them; offline it and wait for them to end")
        res = self._qmgr(f"delete node {node}")
        text = res.text()
        if res.timed_out:
            return CommandOutcome(False, output=text, error="qmgr delete node timed out", transient=True)
        if not res.ok:
            if classify(text, "delete node") == "already":
                return CommandOutcome(True, output=text or f"node {node} already removed")
            return CommandOutcome(False, output=text, transient=transient_text(text),
                                  error=f"qmgr delete node {node} failed (exit {res.returncode}): {text or 'no output'}")
        return CommandOutcome(True, changed=True, output=text or f"node {node} deleted")
