"""Slurm backend (imperative shell): runs ``squeue``/``sinfo``/``scontrol``, parses with ``parse``.

Node commands (see docs/sensor.md for why a pre-declared CLOUD pool):

* ``add``: the node must be a slot of the pool (``NodeName=... State=CLOUD`` in slurm.conf,
  kept ``DRAIN`` while unused so Slurm's own power saving never schedules onto it). Set
  ``NodeAddr`` when the command carries an address, ``POWER_UP`` if powered down, ``RESUME``
  if drained. A node already in service: nothing to do. With ``add_mode = "dynamic"`` a node
  unknown to Slurm is created (``scontrol create NodeName=... State=FUTURE``; its slurmd then
  registers it) — for sites running one slurmd per host on the default port.
* ``offline``: ``State=DRAIN Reason=...`` (running jobs finish; no new ones start).
* ``online``: ``State=RESUME``.
* identity: ``add`` with an instance id writes ``epu:instance=<id>`` into the node's
  ``Comment`` (keeping any text an administrator put there); the read reports it back as
  ``NodeInfo.instance_id``, and ``remove`` takes the token out again.

Every read passes ``--all`` (issue 33): without it Slurm leaves out, for any user but root, the
partitions configured ``Hidden=YES`` (and those the user's groups may not use) — their jobs, and
a node in no other partition ("Node ... not found": a ``remove`` would have answered "already
gone" for a node still running jobs). ``PrivateData=jobs`` hides other users' jobs whatever the
flags, except from root, ``SlurmUser`` and ``AdminLevel=Operator``/``Admin`` users: the sensor's
user must be one of those anyway (``scontrol update`` needs it), docs/sensor.md.

Reads (``read_format``): ``text`` (default) asks ``squeue -O``/``sinfo -N -O`` for only the
fields EPU needs (``slurm/text.py``), ``json`` reads ``squeue --json`` and ``scontrol show
nodes --json`` (23.02+) or ``sinfo --json`` (22.05). The text path falls back to JSON for the
few jobs whose reason text it cannot tell (``--jobs=...``, at most ``json_fallback_max`` ids).
A pending job asking for licenses that are not free (``scontrol show licenses -o``, read only
then) is limit-blocked (``Licenses``) whatever node reason Slurm shows: Slurm tests nodes
before licenses, so with every pool slot powered down such a job would otherwise look like
demand and make EPU launch a node it cannot use (seen on real 22.05).
* ``remove``: refused while jobs run unless ``force``; a dynamic node is deleted
  (``scontrol delete``), a pool node drained and powered down (``POWER_DOWN``, or
  ``POWER_DOWN_FORCE`` with force) so it becomes a free slot again. Removing a node Slurm does
  not know succeeds (already gone). In native mode the slot is held (``DRAIN``, reason ``epu:
  held until its instance ends: ...``, the identity kept) until ``release``.
* ``release`` (native mode): ``State=UNDRAIN`` of EPU's hold (never of an administrator's
  drain) and the identity taken out of the Comment: the slot is Slurm's power saving's again.
* ``requeue_jobs`` (before the remove of a node the cloud preempted): ``squeue --all -h -w NODE -t
  RUNNING,COMPLETING,CONFIGURING,SUSPENDED -o %i`` lists the jobs still counted on the node; the
  node is drained first (``State=DRAIN``: Slurm must not start them there again), then each job
  goes back to the queue with ``scontrol requeue JOBID`` (one call per job, so one that ended
  meanwhile fails alone); a job id that is not ``digits`` or ``digits_digits`` (an array
  task) is refused before any command line.
"""

from __future__ import annotations

import ipaddress
import json
import re
import shutil
import time
from collections.abc import Sequence
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
from epu.services.sensor.slurm.errors import classify
from epu.services.sensor.slurm.parse import (
    LicenseFree,
    comment_with_instance,
    instance_from_comment,
    node_records,
    normalize_nodes,
    parse_licenses,
    parse_scontrol_show_node,
    parse_squeue,
)
from epu.services.sensor.slurm.text import parse_sinfo_text, parse_squeue_text, sinfo_argv, squeue_argv
from epu.services.sensor.states import slurm_state_tokens

BUSY_TOKENS = {"ALLOCATED", "ALLOC", "MIXED", "COMPLETING"}
#: Job states still holding a node (what a preempted node's jobs may be in until Slurm notices).
ON_NODE_STATES = "RUNNING,COMPLETING,CONFIGURING,SUSPENDED"
JOB_ID = re.compile(r"\d+(?:_\d+)?")


def check_address(address: str) -> str:
    """An IP address or an RFC 1123 host name: nothing else becomes ``NodeAddr=``."""
    try:
        ipaddress.ip_address(address)
        return address
    except ValueError:
        return check_node_name(address)


HELD_REASON = "epu: held until its instance ends: "
"""The drain reason of a slot a native ``remove`` holds (``_release`` lifts only this one)."""


def _held(fields: dict[str, str]) -> bool:
    """The node's drain is a native ``remove``'s hold (not an administrator's)."""
    return fields.get("Reason", "").startswith(HELD_REASON.strip())


def _clean_reason(reason: str, default: str) -> str:
    text = " ".join((reason or default).split())[:200]
    return text or default


class SlurmBackend:
    name = "slurm"

    def __init__(self, runner: Any = None, *, bin_dir: str | None = None, add_mode: str = "cloud",
                 include_powered_down: bool = False, clock: Clock | None = None,
                 settle_seconds: float = 10.0, read_format: str = "text", json_fallback_max: int = 2000,
                 max_shapes: int = 2000, native: bool = False) -> None:
        if read_format not in ("text", "json"):
            raise ValueError(f"slurm read_format must be 'text' or 'json', not {read_format!r}")
        self.read_format = read_format
        self.json_fallback_max = json_fallback_max
        self.max_shapes = max_shapes
        self.settle_seconds = settle_seconds
        self.runner = runner or CommandRunner()
        self.bin_dir = bin_dir
        if add_mode not in ("cloud", "dynamic"):
            raise ValueError(f"slurm add_mode must be 'cloud' or 'dynamic', not {add_mode!r}")
        self.add_mode = add_mode
        self.include_powered_down = include_powered_down
        self.clock = clock or RealClock()
        self.native = native
        """Native mode (``[sensor.options] native = true``): Slurm's power saving schedules onto
        the CLOUD slots. A removed slot is powered down and *held* (``DRAIN``, reason ``epu:
        held ...``, the instance's identity kept) until the engine's ``release`` once its instance
        has ended: a slot schedulable while its machine still ran was powered up for a job, the
        machine's slurmd answered, and the destroy that followed killed the job
        (``epu sim --seed 950014 --scenario native-spot-loss``). ``give_back`` powers down a
        node Slurm is powering up (its job requeued)."""

    @classmethod
    def from_options(cls, opts: dict[str, Any], *, timeout: float = 60.0, clock: Clock | None = None) -> SlurmBackend:
        env = {"SLURM_BITSTR_LEN": "0"}  # full array task strings (1-100000%10), never truncated
        if opts.get("conf"):
            env["SLURM_CONF"] = str(opts["conf"])
        return cls(CommandRunner(timeout=timeout, env=env), bin_dir=opts.get("bin_dir"),
                   add_mode=str(opts.get("add_mode", "cloud")),
                   include_powered_down=bool(opts.get("include_powered_down", opts.get("native", False))),
                   clock=clock,
                   read_format=str(opts.get("read_format", "text")),
                   json_fallback_max=int(opts.get("json_fallback_max", 2000)),
                   max_shapes=int(opts.get("max_shapes", 2000)), native=bool(opts.get("native", False)))

    # ------------------------------------------------------------------ helpers
    def _exe(self, name: str) -> str:
        if self.bin_dir:
            return str(Path(self.bin_dir) / name)
        return shutil.which(name) or name

    def _run(self, name: str, *args: str) -> CommandResult:
        return self.runner.run([self._exe(name), *args])

    def _read_text(self, name: str, *args: str) -> str:
        res = self._run(name, *args)
        if not res.ok:
            raise BackendUnavailable(f"{name} failed (exit {res.returncode}): {res.text()}")
        return res.stdout

    def _read_json(self, name: str, *args: str) -> dict[str, Any]:
        res = self._run(name, *args)
        if not res.ok:
            raise BackendUnavailable(f"{name} {' '.join(args)[:200]} failed (exit {res.returncode}): {res.text()}")
        try:
            doc = json.loads(res.stdout)
        except ValueError as exc:
            raise BackendUnavailable(f"{name} {' '.join(args)}: output is not JSON ({exc})") from None
        errors = doc.get("errors") or []
        if errors:
            raise BackendUnavailable(f"{name} reported errors: {errors}")
        return doc

    # ------------------------------------------------------------------ read
    def snapshot(self) -> Observation:
        now = self.clock.now()
        warnings: list[str] = []
        grouper = ShapeGrouper(self.max_shapes)
        licenses = self._license_reader(warnings)
        if self.read_format == "json":
            jobs = parse_squeue(self._read_json("squeue", "--all", "--json"), now, warnings, grouper,
                                licenses=licenses)
            records = node_records(self._read_nodes_json())
        else:
            read = parse_squeue_text(self._read_text("squeue", *squeue_argv()), warnings, grouper,
                                     licenses=licenses)
            jobs = read.jobs
            if read.unexplained:
                self._explain(read.unexplained, now, jobs, licenses)
            records = parse_sinfo_text(self._read_text("sinfo", *sinfo_argv()))
        nodes = normalize_nodes(records, jobs.jobs_by_node, warnings, include_powered_down=self.include_powered_down)
        warnings += [f"slurm: unmapped job state {s!r}: job ignored" for s in sorted(set(jobs.unknown_states))]
        if grouper.coarsened:
            warnings.append(f"slurm: more than {self.max_shapes} distinct job shapes: time limits rounded up "
                            "to a coarse ladder to bound the snapshot")
        return Observation(jobs=jobs.sample, nodes=nodes, running_jobs=jobs.running, shapes=jobs.shapes(),
                           finished_jobs=jobs.finished, warnings=warnings, owners=jobs.owners)

    def _license_reader(self, warnings: list[str]) -> LicenseFree:
        """``scontrol show licenses``, read at most once per snapshot and only when a pending job
        that looks like demand asks for licenses (``parse.license_blocked``). A failed read
        holds no job back (with a warning): the reason Slurm gave stands."""
        cache: list[dict[str, int] | None] = []

        def read() -> dict[str, int] | None:
            if not cache:
                res = self._run("scontrol", "show", "licenses", "-o")
                if res.ok:
                    cache.append(parse_licenses(res.stdout))
                else:
                    warnings.append(f"slurm: scontrol show licenses failed (exit {res.returncode}): "
                                    f"{res.text()[:200]}; jobs asking for licenses judged by their reason")
                    cache.append(None)
            return cache[0]

        return read

    def _read_nodes_json(self) -> dict[str, Any]:
        """Flat node records: ``scontrol show nodes --json`` (23.02+), else ``sinfo --json`` (22.05)."""
        res = self._run("scontrol", "show", "nodes", "--json", "--all")
        if res.ok:
            try:
                doc = json.loads(res.stdout)
                if isinstance(doc, dict) and not doc.get("errors"):
                    return doc
            except ValueError:
                pass
        return self._read_json("sinfo", "--all", "--json")

    def _explain(self, job_ids: list[str], now: float, jobs: Any, licenses: LicenseFree | None = None) -> None:
        """Jobs whose squeue reason text is a description no table knows: read their exact
        reason (``squeue --json --jobs``) and add them to the same shapes. More than
        ``json_fallback_max`` of them are counted as not demand, with a warning."""
        take, rest = job_ids[: self.json_fallback_max], job_ids[self.json_fallback_max:]
        for i in range(0, len(take), 500):
            doc = self._read_json("squeue", "--all", "--json", f"--jobs={','.join(take[i:i + 500])}")
            extra = parse_squeue(doc, now, jobs.warnings, jobs.grouper, licenses=licenses)
            jobs.sample.extend(extra.sample[: max(0, jobs.sample_size - len(jobs.sample))])
        if rest:
            jobs.warnings.append(f"slurm: {len(rest)} pending jobs have a reason text no table knows and are "
                                 f"beyond json_fallback_max={self.json_fallback_max}: not counted as demand")

    def node_fields(self, node: str) -> dict[str, str] | None:
        """``scontrol show node`` fields, ``None`` if Slurm does not know the node."""
        res = self._run("scontrol", "show", "node", check_node_name(node), "--future", "--all")
        if res.timed_out:
            raise BackendUnavailable(res.text())
        if not res.ok:
            text = res.text()
            if "not found" in text.lower() or "invalid node name" in text.lower():
                return None
            raise BackendUnavailable(f"scontrol show node {node} failed (exit {res.returncode}): {text}")
        fields = parse_scontrol_show_node(res.stdout)
        return fields if fields.get("NodeName") == node else None

    # ------------------------------------------------------------------ commands
    def execute(self, action: str, node: str, *, cores: int | None = None, address: str | None = None,
                reason: str = "", force: bool = False, instance_id: str | None = None) -> CommandOutcome:
        check_action(action)
        check_node_name(node)
        if address is not None:
            check_address(address)
        try:
            fields = self.node_fields(node)
            if action == "add":
                return self._add(node, fields, cores, address, instance_id)
            if fields is None:
                if action == "remove":
                    return CommandOutcome(True, output=f"node {node} is not known to Slurm (already removed)")
                return CommandOutcome(False, error=f"node {node} is not known to Slurm",
                                      output=f"scontrol show node {node}: not found")
            tokens = set(slurm_state_tokens(fields.get("State", "")))
            if action == "give_back":
                return self._give_back(node, fields, tokens, reason)
            if action == "release":
                return self._release(node, fields, tokens, instance_id)
            if action == "offline":
                if tokens & {"DRAIN", "DRAINED", "DRAINING"}:
                    return CommandOutcome(True, output=f"node {node} already drained ({fields.get('State')})")
                return self._update(node, "State=DRAIN", f"Reason={_clean_reason(reason, 'epu: offline')}")
            if action == "online":
                if not tokens & {"DRAIN", "DRAINED", "DRAINING", "FAIL"}:
                    return CommandOutcome(True, output=f"node {node} already in service ({fields.get('State')})")
                return self._update(node, "State=RESUME")
            return self._remove(node, fields, tokens, reason, force, instance_id)
        except BackendUnavailable as exc:
            return CommandOutcome(False, error=str(exc), transient=True)

    def _give_back(self, node: str, fields: dict[str, str], tokens: set[str], reason: str) -> CommandOutcome:
        """Native mode: a node Slurm resumed that EPU cannot serve goes back now, powered down with
        the reason, so slurmctld requeues its job rather than wait for ResumeTimeout. Only a node
        still powering up (or asked to): one that is up may run the job by now."""
        if not self.native:
            return CommandOutcome(False, error=f"give back {node}: the sensor is not in native mode "
                                  "([sensor.options] native = true)")
        if tokens & {"POWERED_DOWN", "POWERING_DOWN"} and "POWERING_UP" not in tokens:
            return CommandOutcome(True, output=f"node {node} already powered down ({fields.get('State')})")
        if "POWERING_UP" not in tokens and "POWER_UP" not in tokens:
            return CommandOutcome(False, output=f"State={fields.get('State')}", error=(
                f"give back {node}: the node is not powering up ({fields.get('State')}): not powered down"))
        return self._update(node, "State=POWER_DOWN_FORCE", f"Reason={_clean_reason(reason, 'epu: given back')}")

    def _scontrol(self, *args: str) -> CommandResult:
        return self._run("scontrol", *args)

    def _outcome(self, results: Sequence[CommandResult], what: str) -> CommandOutcome:
        output = "\n".join(f"$ {' '.join(r.argv[1:] if len(r.argv) > 1 else r.argv)}\n{r.text()}".rstrip()
                           for r in results)
        failed = [r for r in results if not r.ok]
        if failed:
            r = failed[0]
            return CommandOutcome(False, changed=len(failed) < len(results), output=output,
                                  error=f"{what} failed (exit {r.returncode}): {r.text() or 'no output'}",
                                  transient=r.timed_out or classify(r.text()) == "transient")
        return CommandOutcome(True, changed=bool(results), output=output)

    def _update(self, node: str, *settings: str) -> CommandOutcome:
        res = self._scontrol("update", f"NodeName={node}", *settings)
        return self._outcome([res], f"scontrol update NodeName={node} {' '.join(settings)}")

    def _identity(self, node: str, fields: dict[str, str] | None, instance_id: str | None) -> list[CommandResult]:
        """Write ``epu:instance=<id>`` into the node's Comment unless it is already there."""
        if instance_id is None:
            return []
        current = (fields or {}).get("Comment", "")
        wanted = comment_with_instance(current, instance_id)
        if current == wanted:
            return []
        return [self._scontrol("update", f"NodeName={node}", f"Comment={wanted}")]

    def _add(self, node: str, fields: dict[str, str] | None, cores: int | None,
             address: str | None, instance_id: str | None = None) -> CommandOutcome:
        if fields is None:
            if self.add_mode != "dynamic":
                return CommandOutcome(False, error=f"node {node} is not in Slurm's CLOUD pool: declare it in "
                                      f"slurm.conf (NodeName={node} State=CLOUD ...) or set add_mode = \"dynamic\"")
            args = ["create", f"NodeName={node}", f"CPUs={cores or 1}", "State=FUTURE"]
            if address:
                args.append(f"NodeAddr={address}")
            results = [self._scontrol(*args)]
            if results[0].ok:
                results += self._identity(node, None, instance_id)
            return self._outcome(results, f"scontrol create NodeName={node}")
        tokens = set(slurm_state_tokens(fields.get("State", "")))
        holder = instance_from_comment(fields.get("Comment", ""))
        if (self.native and tokens & {"DRAIN", "DRAINED", "DRAINING"} and _held(fields) and holder
                and holder != instance_id):
            # another instance's machine may still run under this name: the slot is not this
            # instance's until that one ended and the engine released it (the add is retried)
            return CommandOutcome(False, transient=True, output=f"State={fields.get('State')}", error=(
                f"node {node} is held for instance {holder} until it ends: add {instance_id} after its release"))
        have = fields.get("CPUTot", "")
        if cores and have.isdigit() and int(have) != int(cores):
            return CommandOutcome(False, output=f"NodeName={node} CPUTot={have} State={fields.get('State')}", error=(
                f"node {node} exists in Slurm with {have} CPU(s), not the {int(cores)} asked: not changed (a slot "
                "of another size, or a name held by another node)"))
        results = self._identity(node, fields, instance_id)
        if address and fields.get("NodeAddr") != address and "CLOUD" in tokens:
            results.append(self._scontrol("update", f"NodeName={node}", f"NodeAddr={address}"))
        if tokens & {"POWERED_DOWN", "POWERING_DOWN", "POWER_DOWN"}:
            results.append(self._scontrol("update", f"NodeName={node}", "State=POWER_UP"))
        if tokens & {"DRAIN", "DRAINED", "DRAINING", "FAIL"}:
            results.append(self._scontrol("update", f"NodeName={node}", "State=RESUME"))
        if not results:
            return CommandOutcome(True, output=f"node {node} already in Slurm ({fields.get('State')})")
        return self._outcome(results, f"add {node}")

    def _remove(self, node: str, fields: dict[str, str], tokens: set[str], reason: str,
                force: bool, instance_id: str | None = None) -> CommandOutcome:
        alloc = int(fields.get("CPUAlloc", "0") or 0) if fields.get("CPUAlloc", "0").isdigit() else 0
        busy = alloc > 0 or bool(tokens & BUSY_TOKENS)
        if busy and not force:
            return CommandOutcome(False, error=f"node {node} still runs jobs ({fields.get('State')}, "
                                  f"{alloc} CPUs allocated): offline it and wait, or force",
                                  output=f"State={fields.get('State')} CPUAlloc={alloc}")
        if not force:  # the controller's job list confirms: a suspended job holds no CPU, yet dies with the VM
            jobs = self.jobs_on_node(node)
            if jobs:
                return CommandOutcome(False, output=f"squeue -w {node}: {' '.join(jobs[:20])}", error=(
                    f"node {node} still has job(s) {', '.join(jobs[:10])} per squeue "
                    f"({ON_NODE_STATES}): offline it and wait, or force"))
        if "DYNAMIC_NORM" in tokens or "DYNAMIC" in tokens:
            results = []
            if busy:
                results.append(self._scontrol("update", f"NodeName={node}", "State=DOWN",
                                              f"Reason={_clean_reason(reason, 'epu: removed (forced)')}"))
            results.append(self._scontrol("delete", f"NodeName={node}"))
            return self._outcome(results, f"remove {node}")
        powered_down = bool(tokens & {"POWERED_DOWN", "POWERING_DOWN"})
        if powered_down and tokens & {"DRAIN", "DRAINED"}:
            return CommandOutcome(True, output=f"node {node} already powered down ({fields.get('State')})")
        why = f"Reason={_clean_reason(reason, 'epu: removed')}"
        if self.native:
            why = f"Reason={HELD_REASON}{_clean_reason(reason, 'removed')}"[:220]
        results = []
        if "CLOUD" not in tokens:  # a static node can only be taken out of service
            if tokens & {"DRAIN", "DRAINED", "DRAINING"}:
                return CommandOutcome(True, output=f"node {node} already drained ({fields.get('State')})")
            return self._outcome([self._scontrol("update", f"NodeName={node}", "State=DRAIN", why)],
                                 f"remove {node}")
        if "POWERED_DOWN" not in tokens and "POWERING_DOWN" not in tokens:
            results.append(self._scontrol("update", f"NodeName={node}",
                                          "State=POWER_DOWN_FORCE" if force else "State=POWER_DOWN"))
            if not results[-1].ok:
                return self._outcome(results, f"remove {node}")
            self._wait_powering_down(node)
        if self.native:
            # native mode: held out of scheduling, with the identity the engine's ``release``
            # names, until the instance has ended (see ``native``)
            results.append(self._scontrol("update", f"NodeName={node}", "State=DRAIN", why))
            results += self._identity(node, fields, instance_id)
            return self._outcome(results, f"remove {node}")
        # Slurm clears DRAIN when a cloud node starts powering down: set it again so the slot
        # stays out of scheduling (Slurm must not power it up for a pending job on its own).
        results.append(self._scontrol("update", f"NodeName={node}", "State=DRAIN", why))
        results += self._forget_identity(node, fields)
        return self._outcome(results, f"remove {node}")

    def _release(self, node: str, fields: dict[str, str], tokens: set[str],
                 instance_id: str | None) -> CommandOutcome:
        """Native mode: a slot held since its ``remove`` goes back to Slurm's power saving (its
        instance has ended: the engine checked). Only EPU's own hold is lifted; a drain an
        administrator set stays (its identity is cleared all the same: no instance is behind it).
        Only the hold of the instance the command names: a release that arrives late (re-sent from
        a stale snapshot) must not lift the hold of a later instance of the same name."""
        if not self.native:
            return CommandOutcome(False, error=f"release {node}: the sensor is not in native mode "
                                  "([sensor.options] native = true)")
        holder = instance_from_comment(fields.get("Comment", ""))
        if instance_id and holder and holder != instance_id:
            return CommandOutcome(True, output=f"node {node} is held for instance {holder}, not {instance_id}: "
                                  "left held")
        results = []
        if tokens & {"DRAIN", "DRAINED", "DRAINING"} and _held(fields):
            results.append(self._scontrol("update", f"NodeName={node}", "State=UNDRAIN"))
        results += self._forget_identity(node, fields)
        if not results:
            return CommandOutcome(True, output=f"node {node} not held ({fields.get('State')})")
        return self._outcome(results, f"release {node}")

    def requeue_jobs(self, node: str, reason: str = "") -> CommandOutcome:
        """Put the jobs still counted on ``node`` back in the queue (its machine is gone: the
        cloud preempted it). Ok when none is left: a job that ended meanwhile is not an error."""
        check_node_name(node)
        try:
            ids = self.jobs_on_node(node)
        except BackendUnavailable as exc:
            return CommandOutcome(False, error=str(exc), transient=True)
        if not ids:
            return CommandOutcome(True, output=f"no job on {node} to requeue")
        drain = self._scontrol("update", f"NodeName={node}", "State=DRAIN",
                               f"Reason={_clean_reason(reason, 'epu: preempted, jobs requeued')}")
        if not drain.ok:
            return self._outcome([drain], f"drain {node} before requeueing its jobs")
        results = [self._scontrol("requeue", job) for job in ids]
        failed = [r for r in results if not r.ok and classify(r.text(), "requeue") != "already"]
        output = "\n".join(f"$ scontrol {' '.join(r.argv[1:])}\n{r.text()}".rstrip() for r in [drain, *results])
        if failed:
            r = failed[0]
            return CommandOutcome(False, changed=len(failed) < len(results), output=output,
                                  error=f"scontrol requeue {r.argv[-1]} failed (exit {r.returncode}): "
                                        f"{r.text() or 'no output'}",
                                  transient=r.timed_out or classify(r.text()) == "transient")
        return CommandOutcome(True, changed=True, output=output)

    def jobs_on_node(self, node: str) -> list[str]:
        """Ids of the jobs Slurm still counts on ``node`` (validated: digits, or an array task)."""
        text = self._read_text("squeue", "--all", "-h", "-w", check_node_name(node), "-t", ON_NODE_STATES,
                               "-o", "%i")
        ids = []
        for line in text.split():
            if not JOB_ID.fullmatch(line):
                raise BackendUnavailable(f"squeue -w {node}: refusing job id {line[:40]!r} (not digits or "
                                         "digits_digits)")
            if line not in ids:
                ids.append(line)
        return ids

    def _forget_identity(self, node: str, fields: dict[str, str]) -> list[CommandResult]:
        """A slot back in the pool belongs to no instance: take EPU's token out of its Comment."""
        current = fields.get("Comment", "")
        wanted = comment_with_instance(current, None)
        if current == wanted or (current == "(null)" and not wanted):
            return []
        return [self._scontrol("update", f"NodeName={node}", f"Comment={wanted}")]

    def _wait_powering_down(self, node: str) -> None:
        deadline = time.monotonic() + self.settle_seconds
        while time.monotonic() < deadline:
            fields = self.node_fields(node)
            if fields is None or set(slurm_state_tokens(fields.get("State", ""))) & {"POWERING_DOWN",
                                                                                     "POWERED_DOWN"}:
                return
            time.sleep(0.2)
