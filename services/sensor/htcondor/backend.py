"""HTCondor backend (imperative shell) through the ``htcondor2`` bindings or the command-line tools.

* read, ``[sensor.options] read_format = "bindings"`` (the default): ``Schedd.query`` for jobs
  not completed, with a projection (RequestCpus, RequestMemory, ...);
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
* ``offline``: ``Startd.drainJobs`` (graceful by default). A graceful drain only waits for
  running jobs up to ``MaxJobRetirementTime``; without it set on the startd, jobs are evicted
  after ``MachineMaxVacateTime``. ``drain_type`` = graceful|quick|fast in the options.
* ``online``: ``Startd.cancelDrainJobs``.
* ``remove``: refuse while jobs run (unless force), then a peaceful shutdown of the node's
  daemons: ``DaemonsOffPeaceful`` sent to its master. Some binding versions alias
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
from epu.services.sensor.runner import CommandRunner
from epu.services.sensor.shapes import ShapeGrouper

#: From HTCondor's src/condor_includes/condor_commands.h (SCHED_VERS = 400).
EXPECTED_COMMAND_NUMBERS = {"DaemonsOffPeaceful": 484, "DaemonOn": 469, "DaemonsOn": 483, "DaemonOff": 467}
#: What DAEMON_OFF_PEACEFUL really is (SCHED_VERS + 86); listed to explain the check.
DAEMON_OFF_PEACEFUL = 486

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
                 drain_type: str = "graceful", clock: Clock | None = None,
                 template: dict[str, Any] | None = None, max_shapes: int = 2000, read_format: str = "bindings",
                 runner: Any = None, bin_dir: str | None = None) -> None:
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
        self.drain_type = drain_type
        self.clock = clock or RealClock()

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
        return cls(pool=opts.get("pool"), schedd=opts.get("schedd"), drain_type=str(opts.get("drain_type", "graceful")),
                   clock=clock, template=template, max_shapes=int(opts.get("max_shapes", 2000)),
                   read_format=str(opts.get("read_format", "bindings")),
                   runner=CommandRunner(timeout=timeout, env=env), bin_dir=opts.get("bin_dir"))

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
                           finished_jobs=jobs.finished, warnings=warnings)

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
        if action == "add":
            return CommandOutcome(True, output=f"HTCondor startds join the pool by themselves; nothing to do for {node}")
        try:
            startds = self._ads_for(node, "Startd")
            if action == "remove":
                return self._remove(node, startds, force)
            if not startds:
                return CommandOutcome(False, error=f"no startd ad for {node} in the collector",
                                      output=f"condor_status {node}: no ads")
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
        except BackendUnavailable as exc:
            return CommandOutcome(False, error=str(exc), transient=True)
        except Exception as exc:
            return CommandOutcome(False, error=f"{action} {node}: {type(exc).__name__}: {exc}", output=str(exc))

    def _remove(self, node: str, startds: list[Any], force: bool) -> CommandOutcome:
        busy = [ad for ad in startds if str(ad.get("State", "")) == "Claimed"]
        if busy and not force:
            return CommandOutcome(False, error=f"{node} still runs {len(busy)} claimed slot(s): offline it and wait, "
                                              "or force")
        masters = self._ads_for(node, "Master")
        if not masters:
            return CommandOutcome(True, output=f"no master ad for {node}: already gone")
        command = verified_command(self.htcondor, "DaemonsOffPeaceful")
        self.htcondor.send_command(masters[0], command)
        return CommandOutcome(True, changed=True, output=f"DaemonsOffPeaceful ({int(command)}) sent to {node}'s master")


def _draining(ad: Any) -> bool:
    return ad.get("Draining") is True or str(ad.get("State", "")) == "Drained" or \
        str(ad.get("Activity", "")) == "Retiring"


def _quote(text: str) -> str:
    import classad2

    return classad2.quote(text)
