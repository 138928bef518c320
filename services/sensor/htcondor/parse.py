"""Pure normalization of HTCondor ClassAds (functional core; no daemon is contacted here).

Inputs are ads as the bindings return them (``classad2.ClassAd``, a mapping) — or plain
dicts in the benchmark. Values that are expressions are evaluated in the ad (``RequestCpus =
1 + 1``).

Nodes: startd ads are slots; a machine is the set of slots with the same ``Machine``.
Partitionable slots advertise what is *left* (``Cpus``) and their total
(``TotalSlotCpus``); the cores running jobs are in the dynamic slots (``SlotType ==
"Dynamic"``), each a separate ad. A machine is ``offline`` when any slot is draining
(``Draining``, ``State == "Drained"`` or ``Activity == "Retiring"`` while draining) or in
``Owner``; else ``busy`` when all its cores are claimed; else ``free``.

Jobs are grouped into shapes as they are read (cores, memory, GPUs, nodes; ``AllowedJobDuration``
as the time limit). ``JobStatus`` 1 (Idle) is demand unless deferred (``DeferralTime``) or its
``Requirements`` are false for the worker template (``TemplateMatch``); 5 (Held) is not.
Parallel-universe jobs ask ``MachineCount`` (or ``MinHosts``) nodes.

Machines are named by their short host name (``Machine`` is the FQDN; EPU names workers by
short name — ``shapes.short_hostname`` is the one place this is done) and carry their EPU
identity from the startd attribute ``EPUInstanceId``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from epu.common.messages import NodeInfo, QueuedJob
from epu.services.sensor.reasons import ReasonCache
from epu.services.sensor.shapes import JobsRead, ShapeGrouper, short_hostname
from epu.services.sensor.states import (
    HTCONDOR_DRAINING_ACTIVITIES,
    HTCONDOR_JOB_STATUS,
    HTCONDOR_SLOT_STATES,
    combine,
)

log = logging.getLogger("epu.sensor.htcondor")

JOB_PROJECTION = ["ClusterId", "ProcId", "JobStatus", "RequestCpus", "RequestMemory", "RequestGpus", "RequestDisk",
                  "QDate", "JobUniverse", "MachineCount", "MinHosts", "HoldReasonCode", "DeferralTime",
                  "AllowedJobDuration", "Requirements"]
STARTD_PROJECTION = ["Name", "Machine", "State", "Activity", "SlotType", "PartitionableSlot", "DynamicSlot",
                     "Cpus", "TotalSlotCpus", "TotalCpus", "JobId", "EnteredCurrentState", "Draining",
                     "SlotID", "Memory", "TotalSlotMemory", "TotalMemory", "Gpus", "TotalSlotGpus", "TotalGpus",
                     "EPUInstanceId"]
#: The startd attribute a worker's configuration sets from its userdata (``EPUInstanceId =
#: "<launch id>"`` plus ``STARTD_ATTRS = $(STARTD_ATTRS) EPUInstanceId``): the node's identity.
IDENTITY_ATTRIBUTE = "EPUInstanceId"
PARALLEL_UNIVERSE = 11
_MISSING = object()


def value(ad: Mapping[str, Any], key: str, default: Any = None) -> Any:
    """An attribute's value with one lookup, evaluating expressions in the ad; ``default`` when
    absent or undefined."""
    v = ad.get(key, _MISSING)
    if v is _MISSING or v is None:
        return default
    if isinstance(v, bool | int | float | str):
        return v
    if hasattr(v, "eval"):
        try:
            v = v.eval(ad)  # type: ignore[union-attr]
        except Exception:
            return default
    if v is None or type(v).__name__ == "Value":  # classad2.Value.Undefined / Error
        return default
    return v


def _int(ad: Mapping[str, Any], key: str, default: int = 0) -> int:
    v = value(ad, key, default)
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


@dataclass
class CondorJobs(JobsRead):
    """What one read saw (see ``JobsRead``)."""


class TemplateMatch:
    """A job's ``Requirements`` against the worker template (the machine attributes a new
    worker would advertise, from ``[sensor.options] template``): True → ``Idle`` (demand),
    False → ``RequirementsUnmatched`` (no new worker could run it), undefined/error (it names
    an attribute the template lacks) → ``RequirementsUnknown`` (counted as demand, reported).
    Without a template nothing is evaluated (every idle job is ``Idle``). Results are cached
    per (Requirements, request) — jobs of one submission share both."""

    def __init__(self, template: Mapping[str, Any] | None) -> None:
        self.template = None
        if template:
            import classad2  # noqa: PLC0415 — only with a template

            self.template = classad2.ClassAd(dict(template))
        self._cache: dict[tuple, str] = {}

    def __call__(self, ad: Mapping[str, Any], request: tuple) -> str:
        if self.template is None:
            return "Idle"
        expr = ad.get("Requirements")
        if expr is None:
            return "Idle"
        key = (str(expr), request)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        try:
            result = expr.eval(scope=ad, target=self.template) if hasattr(expr, "eval") else expr
        except Exception:
            result = None
        reason = "Idle" if result is True else "RequirementsUnmatched" if result is False else "RequirementsUnknown"
        self._cache[key] = reason
        return reason


def normalize_jobs(ads: Iterable[Mapping[str, Any]], now: float, warnings: list[str] | None = None,
                   grouper: ShapeGrouper | None = None, template: Mapping[str, Any] | None = None) -> CondorJobs:
    out = CondorJobs(grouper=grouper or ShapeGrouper(), warnings=warnings if warnings is not None else [])
    reasons = ReasonCache("htcondor", out.warnings)
    match = TemplateMatch(template)
    add = out.grouper.add
    for ad in ads:
        status = _int(ad, "JobStatus", -1)
        disposition = HTCONDOR_JOB_STATUS.get(status)
        if disposition is None:
            out.unknown_states.append(status)
            continue
        if disposition == "running":
            out.running += 1
            continue
        if disposition == "finished":
            out.finished += 1
            continue
        cores = max(1, _int(ad, "RequestCpus", 1))
        nodes = 1
        if _int(ad, "JobUniverse", 5) == PARALLEL_UNIVERSE:
            nodes = max(1, _int(ad, "MachineCount", 0) or _int(ad, "MinHosts", 1))
        mem = max(0, _int(ad, "RequestMemory", 0))
        gpus = max(0, _int(ad, "RequestGpus", 0))
        if disposition == "held":
            native = "Held"
        elif _int(ad, "DeferralTime", 0) > now:
            native = "Deferred"  # deferred start: not demand before its time
        else:
            native = match(ad, (cores, mem, gpus, _int(ad, "RequestDisk", 0)))
        verdict = reasons(native)
        qdate = float(_int(ad, "QDate", 0))
        wait = max(0.0, now - qdate) if qdate else 0.0
        job_id = f"{_int(ad, 'ClusterId', 0)}.{_int(ad, 'ProcId', 0)}"
        add(nodes=nodes, cores=cores, memory_mb=mem, gpus=gpus, features=(), partition="",
            time_limit_s=max(0, _int(ad, "AllowedJobDuration", 0)), demand=verdict.demand, reason=verdict.reason,
            reason_class=verdict.reason_class, wait_s=wait, job_id=job_id)
        if len(out.sample) < out.sample_size:
            state = "queued" if verdict.demand else ("held" if verdict.reason_class == "held" else "blocked")
            out.sample.append(QueuedJob(job_id=job_id, cores=cores, nodes=nodes, memory_mb=mem, submit_time=qdate,
                                        wait_seconds=wait, state=state))  # type: ignore[arg-type]
    return out


def slot_state(ad: Mapping[str, Any], machine: str, warnings: list[str] | None) -> str | None:
    state = str(value(ad, "State", "") or "")
    activity = str(value(ad, "Activity", "") or "")
    if state not in HTCONDOR_SLOT_STATES:
        msg = (f"htcondor: unmapped slot state {state!r} (machine {machine}, activity {activity!r}); "
               "reporting 'unknown' — add it to services/sensor/states.py")
        log.warning(msg)
        if warnings is not None:
            warnings.append(msg)
        return "unknown"
    if value(ad, "Draining", False) is True or activity in HTCONDOR_DRAINING_ACTIVITIES and state == "Claimed" \
            and value(ad, "Draining", None) is not False:
        return "offline"
    return HTCONDOR_SLOT_STATES[state]


def normalize_startds(ads: Iterable[Mapping[str, Any]], warnings: list[str] | None = None) -> list[NodeInfo]:
    machines: dict[str, dict[str, Any]] = {}
    for ad in ads:
        machine = short_hostname(str(value(ad, "Machine", "") or str(value(ad, "Name", "")).split("@")[-1]))
        if not machine:
            continue
        m = machines.setdefault(machine, {"states": [], "cores": 0, "used": 0, "jobs": [], "since": None,
                                          "natives": set(), "total": 0, "memory": 0, "gpus": 0, "instance": None})
        instance = value(ad, IDENTITY_ATTRIBUTE)
        if isinstance(instance, str) and instance:
            m["instance"] = instance
        if str(value(ad, "SlotType", "") or "") != "Dynamic":
            m["memory"] += _int(ad, "TotalSlotMemory", 0) or _int(ad, "Memory", 0)
            m["gpus"] += _int(ad, "TotalSlotGpus", 0) or _int(ad, "Gpus", 0)
        slot_type = str(value(ad, "SlotType", "") or "")
        native = f"{value(ad, 'State', '')}/{value(ad, 'Activity', '')}"
        m["natives"].add(f"{slot_type or 'Static'}:{native}")
        m["total"] = max(m["total"], _int(ad, "TotalCpus", 0))
        cpus = _int(ad, "Cpus", 0)
        state = slot_state(ad, machine, warnings)
        if slot_type == "Partitionable":
            m["cores"] += _int(ad, "TotalSlotCpus", cpus)
            if state is not None and state != "busy":
                m["states"].append(state)
        else:
            if slot_type != "Dynamic":
                m["cores"] += cpus
            if state is not None:
                m["states"].append(state)
            if state in ("busy", "offline") and value(ad, "JobId"):
                m["used"] += cpus
                m["jobs"].append(str(value(ad, "JobId")))
            elif state == "busy":
                m["used"] += cpus
        since = _int(ad, "EnteredCurrentState", 0)
        if since:
            m["since"] = max(m["since"] or 0, since)
    out = []
    for name, m in sorted(machines.items()):
        cores = m["cores"] or m["total"]
        state = combine(s for s in m["states"] if s != "busy") or "free"
        if state == "free" and cores and m["used"] >= cores:
            state = "busy"
        if not m["states"]:
            state = "busy" if m["used"] else "free"
        out.append(NodeInfo(name=name, state=state, cores=cores, cores_used=min(m["used"], cores) if cores else m["used"],  # type: ignore[arg-type]
                            jobs=sorted(m["jobs"]), state_since=float(m["since"]) if m["since"] else None,
                            native_state=",".join(sorted(m["natives"])), instance_id=m["instance"],
                            memory_mb=m["memory"], gpus=m["gpus"]))
    return out
