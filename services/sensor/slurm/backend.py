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
* ``remove``: refused while jobs run unless ``force``; a dynamic node is deleted
  (``scontrol delete``), a pool node drained and powered down (``POWER_DOWN``, or
  ``POWER_DOWN_FORCE`` with force) so it becomes a free slot again. Removing a node Slurm does
  not know succeeds (already gone).
"""

from __future__ import annotations

import ipaddress
import json
import shutil
import time
from collections.abc import Sequence
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
from services.sensor.slurm.parse import node_records, normalize_nodes, parse_scontrol_show_node, parse_squeue
from services.sensor.states import slurm_state_tokens

BUSY_TOKENS = {"ALLOCATED", "ALLOC", "MIXED", "COMPLETING"}


def check_address(address: str) -> str:
    """An IP address or an RFC 1123 host name: nothing else becomes ``NodeAddr=``."""
    try:
        ipaddress.ip_address(address)
        return address
    except ValueError:
        return check_node_name(address)


def _clean_reason(reason: str, default: str) -> str:
    text = " ".join((reason or default).split())[:200]
    return text or default


class SlurmBackend:
    name = "slurm"

    def __init__(self, runner: Any = None, *, bin_dir: str | None = None, add_mode: str = "cloud",
                 include_powered_down: bool = False, clock: Clock | None = None,
                 settle_seconds: float = 10.0) -> None:
        self.settle_seconds = settle_seconds
        self.runner = runner or CommandRunner()
        self.bin_dir = bin_dir
        if add_mode not in ("cloud", "dynamic"):
            raise ValueError(f"slurm add_mode must be 'cloud' or 'dynamic', not {add_mode!r}")
        self.add_mode = add_mode
        self.include_powered_down = include_powered_down
        self.clock = clock or RealClock()

    @classmethod
    def from_options(cls, opts: dict[str, Any], *, timeout: float = 60.0, clock: Clock | None = None) -> SlurmBackend:
        env = {"SLURM_CONF": str(opts["conf"])} if opts.get("conf") else None
        return cls(CommandRunner(timeout=timeout, env=env), bin_dir=opts.get("bin_dir"),
                   add_mode=str(opts.get("add_mode", "cloud")),
                   include_powered_down=bool(opts.get("include_powered_down", False)), clock=clock)

    # ------------------------------------------------------------------ helpers
    def _exe(self, name: str) -> str:
        if self.bin_dir:
            return str(Path(self.bin_dir) / name)
        return shutil.which(name) or name

    def _run(self, name: str, *args: str) -> CommandResult:
        return self.runner.run([self._exe(name), *args])

    def _read_json(self, name: str, *args: str) -> dict[str, Any]:
        res = self._run(name, *args)
        if not res.ok:
            raise BackendUnavailable(f"{name} {' '.join(args)} failed (exit {res.returncode}): {res.text()}")
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
        jobs = parse_squeue(self._read_json("squeue", "--json"), now)
        warnings: list[str] = []
        nodes = normalize_nodes(node_records(self._read_json("sinfo", "--json")), jobs.jobs_by_node,
                                warnings, include_powered_down=self.include_powered_down)
        warnings += [f"slurm: unmapped job state {s!r}: job ignored" for s in jobs.unknown_states]
        return Observation(jobs=jobs.queued, nodes=nodes, running_jobs=jobs.running,
                           finished_jobs=jobs.finished, warnings=warnings)

    def node_fields(self, node: str) -> dict[str, str] | None:
        """``scontrol show node`` fields, ``None`` if Slurm does not know the node."""
        res = self._run("scontrol", "show", "node", check_node_name(node), "--future")
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
                reason: str = "", force: bool = False) -> CommandOutcome:
        check_action(action)
        check_node_name(node)
        if address is not None:
            check_address(address)
        try:
            fields = self.node_fields(node)
            if action == "add":
                return self._add(node, fields, cores, address)
            if fields is None:
                if action == "remove":
                    return CommandOutcome(True, output=f"node {node} is not known to Slurm (already removed)")
                return CommandOutcome(False, error=f"node {node} is not known to Slurm",
                                      output=f"scontrol show node {node}: not found")
            tokens = set(slurm_state_tokens(fields.get("State", "")))
            if action == "offline":
                if tokens & {"DRAIN", "DRAINED", "DRAINING"}:
                    return CommandOutcome(True, output=f"node {node} already drained ({fields.get('State')})")
                return self._update(node, "State=DRAIN", f"Reason={_clean_reason(reason, 'epu: offline')}")
            if action == "online":
                if not tokens & {"DRAIN", "DRAINED", "DRAINING", "FAIL"}:
                    return CommandOutcome(True, output=f"node {node} already in service ({fields.get('State')})")
                return self._update(node, "State=RESUME")
            return self._remove(node, fields, tokens, reason, force)
        except BackendUnavailable as exc:
            return CommandOutcome(False, error=str(exc), transient=True)

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
                                  transient=r.timed_out)
        return CommandOutcome(True, changed=bool(results), output=output)

    def _update(self, node: str, *settings: str) -> CommandOutcome:
        res = self._scontrol("update", f"NodeName={node}", *settings)
        return self._outcome([res], f"scontrol update NodeName={node} {' '.join(settings)}")

    def _add(self, node: str, fields: dict[str, str] | None, cores: int | None,
             address: str | None) -> CommandOutcome:
        if fields is None:
            if self.add_mode != "dynamic":
                return CommandOutcome(False, error=f"node {node} is not in Slurm's CLOUD pool: declare it in "
                                      f"slurm.conf (NodeName={node} State=CLOUD ...) or set add_mode = \"dynamic\"")
            args = ["create", f"NodeName={node}", f"CPUs={cores or 1}", "State=FUTURE"]
            if address:
                args.append(f"NodeAddr={address}")
            return self._outcome([self._scontrol(*args)], f"scontrol create NodeName={node}")
        tokens = set(slurm_state_tokens(fields.get("State", "")))
        results: list[CommandResult] = []
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
                force: bool) -> CommandOutcome:
        alloc = int(fields.get("CPUAlloc", "0") or 0) if fields.get("CPUAlloc", "0").isdigit() else 0
        busy = alloc > 0 or bool(tokens & BUSY_TOKENS)
        if busy and not force:
            return CommandOutcome(False, error=f"node {node} still runs jobs ({fields.get('State')}, "
                                  f"{alloc} CPUs allocated): offline it and wait, or force",
                                  output=f"State={fields.get('State')} CPUAlloc={alloc}")
        if "DYNAMIC_NORM" in tokens or "DYNAMIC" in tokens:
            results = []
            if busy:
                results.append(self._scontrol("update", f"NodeName={node}", "State=DOWN",
                                              f"Reason={_clean_reason(reason, 'epu: removed (forced)')}"))
            results.append(self._scontrol("delete", f"NodeName={node}"))
            return self._outcome(results, f"remove {node}")
        if tokens & {"POWERED_DOWN", "POWERING_DOWN"} and tokens & {"DRAIN", "DRAINED"}:
            return CommandOutcome(True, output=f"node {node} already powered down ({fields.get('State')})")
        why = f"Reason={_clean_reason(reason, 'epu: removed')}"
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
        # Slurm clears DRAIN when a cloud node starts powering down: set it again so the slot
        # stays out of scheduling (Slurm must not power it up for a pending job on its own).
        results.append(self._scontrol("update", f"NodeName={node}", "State=DRAIN", why))
        return self._outcome(results, f"remove {node}")

    def _wait_powering_down(self, node: str) -> None:
        deadline = time.monotonic() + self.settle_seconds
        while time.monotonic() < deadline:
            fields = self.node_fields(node)
            if fields is None or set(slurm_state_tokens(fields.get("State", ""))) & {"POWERING_DOWN",
                                                                                     "POWERED_DOWN"}:
                return
            time.sleep(0.2)
