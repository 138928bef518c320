"""HTCondor backend (imperative shell) through the ``htcondor2`` bindings.

* read: ``Schedd.query`` for jobs not completed, with a projection (RequestCpus,
  RequestMemory, ...); ``Collector.query(AdTypes.Startd)`` for slots, with a projection.
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
from typing import Any

from epu.common.clock import Clock, RealClock
from epu.services.sensor.backend import (
    BackendUnavailable,
    CommandOutcome,
    Observation,
    check_action,
    check_node_name,
)
from epu.services.sensor.htcondor.parse import (
    JOB_PROJECTION,
    STARTD_PROJECTION,
    normalize_jobs,
    normalize_startds,
)
from epu.services.sensor.shapes import ShapeGrouper

#: From HTCondor's src/condor_includes/condor_commands.h (SCHED_VERS = 400).
EXPECTED_COMMAND_NUMBERS = {"DaemonsOffPeaceful": 484, "DaemonOn": 469, "DaemonsOn": 483, "DaemonOff": 467}
#: What DAEMON_OFF_PEACEFUL really is (SCHED_VERS + 86); listed to explain the check.
DAEMON_OFF_PEACEFUL = 486

JOB_CONSTRAINT = "JobStatus =!= 3 && JobStatus =!= 4"


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
                 template: dict[str, Any] | None = None, max_shapes: int = 2000) -> None:
        self.template = template
        self.max_shapes = max_shapes
        if htcondor is None:
            import htcondor2 as htcondor  # noqa: PLC0415 — optional dependency
        self.htcondor = htcondor
        self.pool = pool
        self.schedd_name = schedd
        self.drain_type = drain_type
        self.clock = clock or RealClock()

    @classmethod
    def from_options(cls, opts: dict[str, Any], *, timeout: float = 60.0, clock: Clock | None = None) -> HTCondorBackend:
        template = opts.get("template")
        if template is not None and not isinstance(template, dict):
            raise ValueError("[sensor.options] template must be a table of machine attributes "
                             "(e.g. {Arch = \"X86_64\", OpSys = \"LINUX\", Memory = 16000, Cpus = 4})")
        return cls(pool=opts.get("pool"), schedd=opts.get("schedd"), drain_type=str(opts.get("drain_type", "graceful")),
                   clock=clock, template=template, max_shapes=int(opts.get("max_shapes", 2000)))

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
        warnings += [f"htcondor: unmapped JobStatus {s}: job ignored" for s in sorted(set(jobs.unknown_states))]
        return Observation(jobs=jobs.sample, shapes=jobs.shapes(), nodes=nodes, running_jobs=jobs.running,
                           finished_jobs=jobs.finished, warnings=warnings)

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
