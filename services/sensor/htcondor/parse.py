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

Jobs: ``JobStatus`` 1 (Idle) is demand; 5 (Held) is reported apart; procs of one cluster
with the same request are one entry with ``count`` (HTCondor's arrays). Parallel-universe
jobs ask ``MachineCount`` (or ``MinHosts``) nodes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from common.messages import NodeInfo, QueuedJob
from services.sensor.states import (
    HTCONDOR_DRAINING_ACTIVITIES,
    HTCONDOR_JOB_STATUS,
    HTCONDOR_SLOT_STATES,
    combine,
)

log = logging.getLogger("epu.sensor.htcondor")

JOB_PROJECTION = ["ClusterId", "ProcId", "JobStatus", "RequestCpus", "RequestMemory", "QDate", "JobUniverse",
                  "MachineCount", "MinHosts", "HoldReason", "RemoteHost", "DeferralTime", "JobPrio", "Owner"]
STARTD_PROJECTION = ["Name", "Machine", "State", "Activity", "SlotType", "PartitionableSlot", "DynamicSlot",
                     "Cpus", "TotalSlotCpus", "TotalCpus", "JobId", "EnteredCurrentState", "Draining",
                     "SlotID", "Memory"]
PARALLEL_UNIVERSE = 11


def value(ad: Mapping[str, Any], key: str, default: Any = None) -> Any:
    """An attribute's value, evaluating expressions; ``default`` when absent or undefined."""
    if key not in ad:
        return default
    v = ad[key]
    if hasattr(v, "eval") and not isinstance(v, str | int | float | bool):
        try:
            v = ad.eval(key)  # type: ignore[attr-defined]
        except Exception:
            return default
    if v is None or type(v).__name__ in ("Value",):  # classad2.Value.Undefined / Error
        return default
    return v


def _int(ad: Mapping[str, Any], key: str, default: int = 0) -> int:
    v = value(ad, key, default)
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


@dataclass
class CondorJobs:
    queued: list[QueuedJob] = field(default_factory=list)
    running: int = 0
    finished: int = 0
    unknown_states: list[int] = field(default_factory=list)


def normalize_jobs(ads: Iterable[Mapping[str, Any]], now: float) -> CondorJobs:
    out = CondorJobs()
    groups: dict[tuple[Any, ...], list[Any]] = {}
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
        if disposition == "queued" and _int(ad, "DeferralTime", 0) > now:
            disposition = "blocked"  # deferred start: not demand before its time
        cores = max(1, _int(ad, "RequestCpus", 1))
        nodes = 1
        if _int(ad, "JobUniverse", 5) == PARALLEL_UNIVERSE:
            nodes = max(1, _int(ad, "MachineCount", 0) or _int(ad, "MinHosts", 1))
        mem = max(0, _int(ad, "RequestMemory", 0))
        cluster = _int(ad, "ClusterId", 0)
        qdate = float(_int(ad, "QDate", 0))
        key = (cluster, disposition, cores, nodes, mem)
        entry = groups.get(key)
        if entry is None:
            groups[key] = [cluster, _int(ad, "ProcId", 0), 1, qdate]
        else:
            entry[2] += 1
            entry[3] = min(entry[3], qdate) if qdate else entry[3]
    for (cluster, disposition, cores, nodes, mem), (_, proc, count, qdate) in groups.items():
        job_id = f"{cluster}.{proc}" if count == 1 else f"{cluster}.*"
        out.queued.append(QueuedJob(job_id=job_id, cores=cores, nodes=nodes, memory_mb=mem, queue="",
                                    submit_time=qdate, wait_seconds=max(0.0, now - qdate) if qdate else 0.0,
                                    state=disposition, count=count))  # type: ignore[arg-type]
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
        machine = str(value(ad, "Machine", "") or str(value(ad, "Name", "")).split("@")[-1])
        if not machine:
            continue
        m = machines.setdefault(machine, {"states": [], "cores": 0, "used": 0, "jobs": [], "since": None,
                                          "natives": set(), "total": 0})
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
                            native_state=",".join(sorted(m["natives"]))))
    return out
