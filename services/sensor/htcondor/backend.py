"""HTCondor backend (imperative shell) through the ``htcondor2`` bindings or the command-line tools.

* read, ``[sensor.options] read_format = "bindings"`` (the default): ``Schedd.query`` for jobs
  not completed, with a projection (RequestCpus, RequestMemory, ..., and ``Owner``,
  ``AcctGroup``, ``AccountingGroup``: running jobs' owners for cost accounting);
  ``Collector.query(AdTypes.Startd)`` for slots, with a projection.
* read, ``read_format = "af"``: ``condor_q -allusers -global -constraint ... -af:tr ...`` and
  ``condor_status -af:tr ...`` (``htcondor/autoformat.py``): the same attributes as one text
  line per ad, split in one pass — ~4x less CPU than ClassAd objects for a big pool. Options
  ``bin_dir`` (where condor_q/condor_status live; else ``$PATH``) and ``condor_config`` (sets
  ``CONDOR_CONFIG``); ``pool`` and ``schedd`` as for the bindings (``-pool``, ``-name``). Both
  paths give the same snapshot for the same ads (tests/sensor/htcondor/test_autoformat.py).
  The node commands below go through the bindings either way.
* ``add``: a no-op — startds join the pool by themselves (the node's own config points it at
  the collector); the result says so. The worker's configuration (from its userdata) sets
  ``EPUInstanceId = "<launch id>"`` and ``STARTD_ATTRS = $(STARTD_ATTRS) EPUInstanceId``: the
  read reports it as ``NodeInfo.instance_id``.
* read: with ``[sensor.options] template`` (the machine attributes a new worker advertises),
  an idle job whose ``Requirements`` are false for it is not demand, and one whose
  ``Requirements`` name attributes the template lacks is reported ``RequirementsUnknown``.
* ``offline`` (``drain_type = "peaceful"``, the default): a peaceful shutdown of the node's
  startd, sent to its master (``condor_off -peaceful -daemon startd``: DAEMON_OFF_PEACEFUL with
  the subsystem ``STARTD``). No new job starts there, and running jobs finish *whatever*
  ``MaxJobRetirementTime`` the pool or the machine sets: the startd treats a peaceful shutdown
  as infinite retirement (HTCondor's Resource::evalRetirementRemaining). A ``condor_drain``
  (``drain_type = graceful|quick|fast``, ``Startd.drainJobs``) evicts once the retirement time
  is spent (default 0), so it is only used when an operator asks for it.
* ``online``: peaceful: the startd is started again (DAEMON_ON ``STARTD``) once it has exited; a
  peaceful shutdown still waiting for jobs cannot be taken back (refused, the node leaves when
  they end). Drains: ``Startd.cancelDrainJobs``.
* ``remove``: confirmed by the schedd's job list *and* the node gone (``htcondor/removal.py``):
  refused while the schedd lists a job whose ``RemoteHost`` is on the node or a slot is
  Claimed/Matched/Preempting (unless force); then a peaceful shutdown of the master
  (``OffPeaceful``: its children first, then itself), answered *in progress* (transient) until
  the master, at the address it had, no longer accepts connections. No ads in the collector is
  unknown (transient) — until this sensor has found the node with no ad and no schedd job for
  ``absent_confirm_seconds`` (option, default 900 s, HTCondor's ``CLASSAD_LIFETIME``): a live
  startd re-advertises long before, so the node is gone (a preempted or vanished machine no
  shutdown of ours was in flight for) and the remove is answered done (issue 33). Some binding versions alias
  ``DaemonCommands.DaemonOffPeaceful`` to ``DaemonOn`` (469) — sending it would start, not
  stop — so the numbers are checked against HTCondor's condor_commands.h before use and the
  command refuses to run if they do not match.
"""

from __future__ import annotations

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
from epu.services.sensor.htcondor.autoformat import (
    condor_q_argv,
    condor_status_argv,
    normalize_job_lines,
    normalize_slot_lines,
)
from epu.services.sensor.htcondor.parse import (
    JOB_PROJECTION,
    STARTD_PROJECTION,
    normalize_jobs,
    normalize_startds,
)
from epu.services.sensor.htcondor.removal import (
    ABSENT_CONFIRM_SECONDS,
    BUSY_SLOT_STATES,
    Absences,
    RemovalFacts,
    removal_step,
)
from epu.services.sensor.htcondor.shutdowns import ShutdownMemory
from epu.services.sensor.runner import CommandRunner
from epu.services.sensor.shapes import ShapeGrouper, short_hostname

#: From HTCondor's src/condor_includes/condor_commands.h (SCHED_VERS = 400, DC_BASE = 60000).
EXPECTED_COMMAND_NUMBERS = {"DaemonsOffPeaceful": 484, "DaemonOn": 469, "DaemonOff": 467, "OffPeaceful": 60015}
#: DAEMON_OFF_PEACEFUL (SCHED_VERS + 83): stop one daemon of a master peacefully and hold it off
#: (``condor_off -peaceful -daemon startd``). The bindings have no member with this number (their
#: ``DaemonOffPeaceful`` is 469, DAEMON_ON), so it is sent as the number itself.
DAEMON_OFF_PEACEFUL = 483
DRAIN_TYPES = ("peaceful", "graceful", "quick", "fast")
#: What the bindings raise when the daemon's address refuses connections: nothing listens there.
UNREACHABLE = "Unable to connect to the remote daemon"

JOB_CONSTRAINT = "JobStatus =!= 3 && JobStatus =!= 4"
READ_FORMATS = ("bindings", "af")


def verified_command(htcondor: Any, name: str) -> Any:
    """The bindings' DaemonCommands member ``name``, only if its number is the real one."""
    member = getattr(htcondor.DaemonCommands, name)
    if int(member) != EXPECTED_COMMAND_NUMBERS[name]:
        raise RuntimeError(f"htcondor bindings map DaemonCommands.{name} to {int(member)}, expected "
                           f"{EXPECTED_COMMAND_NUMBERS[name]}: refusing to send a command that may do the opposite")
    return member


class HTCondorBackend:
    name = "htcondor"

    def __init__(self, htcondor: Any = None, *, pool: str | None = None, schedd: str | None = None,
                 drain_type: str = "peaceful", clock: Clock | None = None,
                 template: dict[str, Any] | None = None, max_shapes: int = 2000, read_format: str = "bindings",
                 runner: Any = None, bin_dir: str | None = None, shutdown_state_path: str | None = None,
                 absent_confirm_seconds: float = ABSENT_CONFIRM_SECONDS) -> None:
        if read_format not in READ_FORMATS:
            raise ValueError(f"htcondor read_format must be 'bindings' or 'af', not {read_format!r}")
        self.read_format = read_format
        self.template = template
        self.max_shapes = max_shapes
        self._htcondor = htcondor
        if htcondor is None and read_format == "bindings":
            self._htcondor = self._import_bindings()
        self.runner = runner or CommandRunner()
        self.bin_dir = bin_dir
        self.pool = pool
        self.schedd_name = schedd
        if drain_type not in DRAIN_TYPES:
            raise ValueError(f"htcondor drain_type must be one of {', '.join(DRAIN_TYPES)}, not {drain_type!r}")
        self.drain_type = drain_type
        self.clock = clock or RealClock()
        self.shutdowns = ShutdownMemory(shutdown_state_path)
        """Short node name → the master ad a peaceful shutdown was sent to (its address is what
        later tells whether the master has exited, when its ad is gone from the collector)."""
        if absent_confirm_seconds <= 0:
            raise ValueError(f"htcondor absent_confirm_seconds must be above 0, not {absent_confirm_seconds!r}")
        self.absent_confirm_seconds = absent_confirm_seconds
        self.absences = Absences()
        """Short node name → since when a remove found it with no ad and no schedd job (``removal``)."""

    @staticmethod
    def _import_bindings() -> Any:
        import htcondor2  # noqa: PLC0415 — optional dependency

        return htcondor2

    @property
    def htcondor(self) -> Any:
        """The bindings module (imported on first use when reads go through the tools)."""
        if self._htcondor is None:
            self._htcondor = self._import_bindings()
        return self._htcondor

    @classmethod
    def from_options(cls, opts: dict[str, Any], *, timeout: float = 60.0, clock: Clock | None = None) -> HTCondorBackend:
        template = opts.get("template")
        if template is not None and not isinstance(template, dict):
            raise ValueError("[sensor.options] template must be a table of machine attributes "
                             "(e.g. {Arch = \"X86_64\", OpSys = \"LINUX\", Memory = 16000, Cpus = 4})")
        env = {"CONDOR_CONFIG": str(opts["condor_config"])} if opts.get("condor_config") else None
        return cls(pool=opts.get("pool"), schedd=opts.get("schedd"), drain_type=str(opts.get("drain_type", "peaceful")),
                   clock=clock, template=template, max_shapes=int(opts.get("max_shapes", 2000)),
                   read_format=str(opts.get("read_format", "bindings")),
                   runner=CommandRunner(timeout=timeout, env=env), bin_dir=opts.get("bin_dir"),
                   shutdown_state_path=opts.get("shutdown_state_path"),
                   absent_confirm_seconds=_seconds(opts, "absent_confirm_seconds", ABSENT_CONFIRM_SECONDS))

    # ------------------------------------------------------------------ daemons
    def collector(self) -> Any:
        return self.htcondor.Collector(self.pool) if self.pool else self.htcondor.Collector()

    def schedds(self) -> list[Any]:
        coll = self.collector()
        if self.schedd_name:
            return [self.htcondor.Schedd(coll.locate(self.htcondor.DaemonTypes.Schedd, self.schedd_name))]
        ads = coll.locateAll(self.htcondor.DaemonTypes.Schedd)
        return [self.htcondor.Schedd(ad) for ad in ads]

    # ------------------------------------------------------------------ read
    def snapshot(self) -> Observation:
        if self.read_format == "af":
            return self._snapshot_af()
        now = self.clock.now()
        try:
            job_ads: list[Any] = []
            for schedd in self.schedds():
                job_ads += schedd.query(constraint=JOB_CONSTRAINT, projection=JOB_PROJECTION)
            slot_ads = self.collector().query(self.htcondor.AdTypes.Startd, projection=STARTD_PROJECTION)
        except Exception as exc:  # HTCondorIOError, HTCondorLocateError, ...
            raise BackendUnavailable(f"htcondor: {type(exc).__name__}: {exc}") from None
        warnings: list[str] = []
        jobs = normalize_jobs(job_ads, now, warnings, ShapeGrouper(self.max_shapes), self.template)
        nodes = normalize_startds(slot_ads, warnings)
        return self._observation(jobs, nodes, warnings)

    def _observation(self, jobs: Any, nodes: list[Any], warnings: list[str]) -> Observation:
        warnings += [f"htcondor: unmapped JobStatus {s}: job ignored" for s in sorted(set(jobs.unknown_states))]
        return Observation(jobs=jobs.sample, shapes=jobs.shapes(), nodes=nodes, running_jobs=jobs.running,
                           finished_jobs=jobs.finished, warnings=warnings, owners=jobs.owners)

    # ------------------------------------------------------------------ read through the tools
    def _exe(self, name: str) -> str:
        if self.bin_dir:
            return str(Path(self.bin_dir) / name)
        return shutil.which(name) or name

    def _read_text(self, argv: list[str]) -> str:
        res = self.runner.run(argv)
        if not res.ok:
            what = "timed out" if res.timed_out else f"failed (exit {res.returncode})"
            raise BackendUnavailable(f"htcondor: {Path(argv[0]).name} {what}: {res.text()[-500:]}")
        return res.stdout

    def _snapshot_af(self) -> Observation:
        now = self.clock.now()
        job_text = self._read_text(condor_q_argv(self._exe("condor_q"), JOB_CONSTRAINT, pool=self.pool,
                                                 schedd=self.schedd_name))
        slot_text = self._read_text(condor_status_argv(self._exe("condor_status"), pool=self.pool))
        warnings: list[str] = []
        jobs = normalize_job_lines(job_text, now, warnings, ShapeGrouper(self.max_shapes), self.template)
        nodes = normalize_slot_lines(slot_text, warnings)
        return self._observation(jobs, nodes, warnings)

    def _ads_for(self, node: str, ad_type: str) -> list[Any]:
        """Ads of ``node``: its ``Machine`` is ``node`` or ``node.<domain>`` (snapshots name
        machines by their short host name)."""
        fqdn = _quote("^" + re.escape(node) + "\\.")
        constraint = f"Machine == {_quote(node)} || Name == {_quote(node)} || regexp({fqdn}, Machine)"
        try:
            return list(self.collector().query(getattr(self.htcondor.AdTypes, ad_type), constraint=constraint))
        except Exception as exc:
            raise BackendUnavailable(f"htcondor: {type(exc).__name__}: {exc}") from None

    # ------------------------------------------------------------------ commands
    def execute(self, action: str, node: str, *, cores: int | None = None, address: str | None = None,
                reason: str = "", force: bool = False, instance_id: str | None = None) -> CommandOutcome:
        check_action(action)
        check_node_name(node)
        if action in ("give_back", "release"):
            return CommandOutcome(False, error=f"{action} is Slurm's native mode: HTCondor has none")
        if action == "add":
            return CommandOutcome(True, output=f"HTCondor startds join the pool by themselves; nothing to do for {node}")
        try:
            if action == "remove":
                return self._remove(node, force)
            if self.drain_type == "peaceful":
                return self._offline_peaceful(node) if action == "offline" else self._online_peaceful(node)
            return self._drain(action, node, reason)
        except BackendUnavailable as exc:
            return CommandOutcome(False, error=str(exc), transient=True)
        except Exception as exc:
            return failed(f"{action} {node}", exc)

    def _drain(self, action: str, node: str, reason: str) -> CommandOutcome:
        """``condor_drain`` (``drain_type`` graceful/quick/fast): evicts once retirement is spent."""
        startds = self._ads_for(node, "Startd")
        if not startds:
            return unknown_node(node, action)
        startd = self.htcondor.Startd(startds[0])
        if action == "offline":
            if any(_draining(ad) for ad in startds):
                return CommandOutcome(True, output=f"{node} already draining")
            kind = {"graceful": "Graceful", "quick": "Quick", "fast": "Fast"}[self.drain_type]
            request = startd.drainJobs(getattr(self.htcondor.DrainTypes, kind),
                                       reason=" ".join((reason or "epu: offline").split())[:200])
            return CommandOutcome(True, changed=True, output=f"drain request {request} ({kind})")
        if not any(_draining(ad) for ad in startds):
            return CommandOutcome(True, output=f"{node} is not draining")
        startd.cancelDrainJobs()
        return CommandOutcome(True, changed=True, output=f"drain of {node} cancelled")

    def _offline_peaceful(self, node: str) -> CommandOutcome:
        """Stop the node's startd peacefully through its master: no new job, running jobs run to
        their end whatever ``MaxJobRetirementTime`` says. Sending it again changes nothing."""
        masters = self._ads_for(node, "Master")
        if not masters:
            return unknown_node(node, "offline")
        self.htcondor.send_command(masters[0], DAEMON_OFF_PEACEFUL, "STARTD")
        return CommandOutcome(True, changed=True, output=(
            f"peaceful shutdown of {node}'s startd (DAEMON_OFF_PEACEFUL {DAEMON_OFF_PEACEFUL} STARTD): no new job "
            "starts, running jobs finish whatever MaxJobRetirementTime says"))

    def _online_peaceful(self, node: str) -> CommandOutcome:
        startds = self._ads_for(node, "Startd")
        if any(str(ad.get("Activity", "")) == "Retiring" for ad in startds):
            return CommandOutcome(False, error=(
                f"{node}'s startd is shutting down peacefully and waits for its jobs: HTCondor cannot take that "
                "back; the node leaves once they end"))
        if startds:
            return CommandOutcome(True, output=f"{node}'s startd runs (not offline)")
        masters = self._ads_for(node, "Master")
        if not masters:
            return unknown_node(node, "online")
        command = verified_command(self.htcondor, "DaemonOn")
        self.htcondor.send_command(masters[0], command, "STARTD")
        self.shutdowns.pop(short_hostname(node), None)
        return CommandOutcome(True, changed=True, output=f"DaemonOn ({int(command)}) STARTD sent to {node}'s master")

    def jobs_on_node(self, node: str) -> list[str]:
        """Ids of the jobs any schedd lists as running on ``node`` (``RemoteHost`` = slot@node)."""
        pattern = _quote("@" + re.escape(node) + "(\\.|$)")
        constraint = f"({JOB_CONSTRAINT}) && RemoteHost =!= undefined && regexp({pattern}, RemoteHost, \"i\")"
        try:
            schedds = self.schedds()
            if not schedds:
                raise BackendUnavailable("htcondor: the collector located no schedd: the job list is unknown")
            ads: list[Any] = []
            for schedd in schedds:
                ads += schedd.query(constraint=constraint, projection=["ClusterId", "ProcId", "RemoteHost"])
        except BackendUnavailable:
            raise
        except Exception as exc:
            raise BackendUnavailable(f"htcondor: schedd query: {type(exc).__name__}: {exc}") from None
        return [f"{ad.get('ClusterId')}.{ad.get('ProcId')}" for ad in ads]

    def _remove(self, node: str, force: bool) -> CommandOutcome:
        key = short_hostname(node)
        try:
            jobs: list[str] | None = self.jobs_on_node(key)
        except BackendUnavailable:
            jobs = None
        startds = self._ads_for(node, "Startd")
        masters = self._ads_for(node, "Master")
        remembered = self.shutdowns.get(key)
        answers: bool | None = None
        if not masters and remembered is not None and jobs is not None and (force or not jobs):
            answers = self._master_answers(remembered)
        absent = 0.0
        if startds or masters or remembered is not None or jobs:
            self.absences.present(key)
        elif jobs is not None:  # no ad, no job, no shutdown of ours: absent (since when?)
            absent = self.absences.absent(key, self.clock.monotonic())
        step = removal_step(RemovalFacts(
            node=node, force=force, schedd_jobs=jobs,
            busy_slots=sum(str(ad.get("State", "")) in BUSY_SLOT_STATES for ad in startds),
            master_seen=bool(masters), shutdown_sent=remembered is not None, master_answers=answers,
            absent_seconds=absent, absent_confirm_seconds=self.absent_confirm_seconds))
        if step.send_shutdown:
            command = verified_command(self.htcondor, "OffPeaceful")
            self.htcondor.send_command(masters[0], command)
            self.shutdowns[key] = masters[0]
        elif step.outcome.ok:
            self.shutdowns.pop(key, None)
            self.absences.present(key)
        return step.outcome

    def _master_answers(self, master_ad: Any) -> bool | None:
        """Ask the master at the address it had (the same idempotent shutdown): True if it
        accepts it, False if nothing listens there any more (it exited), None if unclear."""
        try:
            self.htcondor.send_command(master_ad, verified_command(self.htcondor, "OffPeaceful"))
        except Exception as exc:
            return False if UNREACHABLE.lower() in str(exc).lower() else None
        return True


def _seconds(opts: dict[str, Any], key: str, default: float) -> float:
    """A number of seconds from ``[sensor.options]``, or an error that names the key."""
    value = opts.get(key, default)
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"[sensor.options] {key} must be a number of seconds, not {value!r}") from None


def classify_condor_error(exc: BaseException) -> str:
    """``transient`` (the daemon could not be located, reached or talked to — it may be back
    soon), else ``permanent`` (a refused command number, a bad argument). From the messages
    the htcondor2 bindings raise (loose_functions.cpp and the daemon clients)."""
    text = str(exc).lower()
    if isinstance(exc, BackendUnavailable) or any(m in text for m in TRANSIENT_CONDOR_MESSAGES):
        return "transient"
    return "permanent"


#: Messages of ``HTCondorException`` that mean "could not talk to it now".
TRANSIENT_CONDOR_MESSAGES = ("unable to locate", "unable to connect", "failed to start command", "failed to send",
                             "failed to fetch ads", "failed to get", "timed out", "timeout",
                             "connection refused", "communication", "end-of-message", "ad not found")


def failed(what: str, exc: BaseException) -> CommandOutcome:
    transient = classify_condor_error(exc) == "transient"
    return CommandOutcome(False, error=f"{what}: {type(exc).__name__}: {exc}", output=str(exc), transient=transient)


def unknown_node(node: str, action: str) -> CommandOutcome:
    """No ad for ``node``: the collector may have lost it (restart, lost updates): unknown, retried."""
    return CommandOutcome(False, transient=True, output=f"condor_status {node}: no ads", error=(
        f"{action} {node}: no ad for it in the collector — unknown (a collector restart or lost updates look the "
        "same as a gone node); retried"))


def _draining(ad: Any) -> bool:
    return ad.get("Draining") is True or str(ad.get("State", "")) == "Drained" or \
        str(ad.get("Activity", "")) == "Retiring"


def _quote(text: str) -> str:
    import classad2

    return classad2.quote(text)
