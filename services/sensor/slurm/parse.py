"""Pure parsers for Slurm's JSON (functional core; no process is started here).

Schema differences handled (found on real daemons and in the OpenAPI plugin changelogs):

* 22.05 (openapi v0.0.38): a node's ``state`` is one lower-case base state string plus a
  ``state_flags`` list; numbers are plain integers (``node_count: 2``); ``job_state`` a string.
* 23.02+ (data_parser v0.0.39+): ``state``/``job_state`` are lists of upper-case tokens
  (``["IDLE", "DRAIN"]``); many numbers are ``{"set": true, "infinite": false, "number": N}``;
  ``sinfo --json`` groups nodes under ``"sinfo"`` records (``nodes.nodes`` names, ``node.state``,
  ``cpus.total``/``cpus.allocated``) instead of a flat ``"nodes"`` list.

Both shapes produce the same normalized ``NodeInfo``/``QueuedJob``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from common.messages import NodeInfo, QueuedJob
from services.sensor.states import (
    SLURM_JOB_STATES,
    slurm_node_state,
    slurm_pending_disposition,
    slurm_state_tokens,
)

#: Slurm's NO_VAL/INFINITE sentinels in the 22.05 plain-integer encoding
_SENTINELS = {0xFFFFFFFE, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFE, 0xFFFFFFFFFFFFFFFF, 0xFFFE, 0xFFFF}


def num(value: Any) -> int | None:
    """An integer from either encoding; ``None`` for unset/infinite/sentinel values."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        v = int(value)
        return None if v in _SENTINELS else v
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def expand_hostlist(expr: str) -> list[str]:
    """Slurm hostlist → names: ``"el[1-2],node1"`` → el1, el2, node1; keeps zero padding."""
    names: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", expr or ""):
        part = part.strip()
        if not part:
            continue
        names.extend(_expand_one(part))
    return names


def _expand_one(pattern: str) -> list[str]:
    m = re.search(r"\[([^\]]*)\]", pattern)
    if not m:
        return [pattern]
    prefix, suffix = pattern[: m.start()], pattern[m.end():]
    out = []
    for rng in m.group(1).split(","):
        if "-" in rng:
            lo, hi = rng.split("-", 1)
            width = len(lo)
            out += [f"{prefix}{i:0{width}d}" for i in range(int(lo), int(hi) + 1)]
        else:
            out.append(prefix + rng)
    return [name for head in out for name in _expand_one(head + suffix)]


def count_array_tasks(spec: str) -> int:
    """Pending elements in an ``array_task_string`` such as ``1-3``, ``1,4-9:2``, ``0-99%4``."""
    spec = (spec or "").split("%", 1)[0]
    total = 0
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        step = 1
        if ":" in part:
            part, s = part.split(":", 1)
            step = max(1, int(s))
        if "-" in part:
            lo, hi = part.split("-", 1)
            total += (int(hi) - int(lo)) // step + 1
        else:
            total += 1
    return max(total, 1)


def _state_list(value: Any) -> list[str]:
    if isinstance(value, list):
        return [str(v) for v in value]
    return [str(value)] if value else []


@dataclass
class SlurmJobs:
    queued: list[QueuedJob] = field(default_factory=list)
    running: int = 0
    finished: int = 0
    jobs_by_node: dict[str, list[str]] = field(default_factory=dict)
    unknown_states: list[str] = field(default_factory=list)


def parse_squeue(doc: dict[str, Any] | str | bytes, now: float) -> SlurmJobs:
    """``squeue --json`` → queued/held/blocked jobs, running count and jobs per node."""
    if isinstance(doc, str | bytes):
        doc = json.loads(doc)
    out = SlurmJobs()
    for job in doc.get("jobs", []):
        states = [s.upper() for s in _state_list(job.get("job_state"))]
        base = states[0] if states else "UNKNOWN"
        disposition = SLURM_JOB_STATES.get(base)
        if disposition is None:
            out.unknown_states.append(base)
            continue
        job_id = str(job.get("job_id"))
        array_task = num(job.get("array_task_id"))
        array_job = num(job.get("array_job_id")) or 0
        if array_job and array_task is not None:
            job_id = f"{array_job}_{array_task}"
        if disposition in ("running", "finished"):
            if disposition == "running":
                out.running += 1
                for node in expand_hostlist(str(job.get("nodes") or "")):
                    out.jobs_by_node.setdefault(node, []).append(job_id)
            else:
                out.finished += 1
            continue
        reason = str(job.get("state_reason") or "")
        if disposition == "queued":
            disposition = slurm_pending_disposition(reason)
        if disposition == "queued" and num(job.get("priority")) == 0:
            disposition = "held"
        nodes = max(1, num(job.get("node_count")) or num(job.get("num_nodes")) or 1)
        cpus = num(job.get("cpus")) or num(job.get("num_cpus")) or 1
        per_node = max(num(job.get("minimum_cpus_per_node")) or 1, math.ceil(cpus / nodes))
        count = 1
        task_string = str(job.get("array_task_string") or "")
        if array_job and array_task is None and task_string:
            count = count_array_tasks(task_string)
            job_id = f"{array_job}_[{task_string}]"
        mem = num(job.get("memory_per_node"))
        if mem is None:
            per_cpu = num(job.get("memory_per_cpu"))
            mem = per_cpu * per_node if per_cpu else 0
        submit = float(num(job.get("submit_time")) or 0)
        out.queued.append(QueuedJob(
            job_id=job_id, cores=per_node, nodes=nodes, memory_mb=max(0, mem or 0),
            queue=str(job.get("partition") or ""), submit_time=submit,
            wait_seconds=max(0.0, now - submit) if submit else 0.0,
            state=disposition, count=count))  # type: ignore[arg-type]
    return out


@dataclass(frozen=True)
class SlurmNodeRecord:
    """One node as read, before jobs are attached."""

    name: str
    tokens: tuple[str, ...]
    cpus: int
    alloc_cpus: int
    reason: str = ""
    state_since: float | None = None


def node_records(doc: dict[str, Any] | str | bytes) -> list[SlurmNodeRecord]:
    """``sinfo --json`` (22.05 flat ``nodes`` or 23.02+ grouped ``sinfo``) or
    ``scontrol show nodes --json`` → one record per node."""
    if isinstance(doc, str | bytes):
        doc = json.loads(doc)
    records: dict[str, SlurmNodeRecord] = {}
    for node in doc.get("nodes", []) or []:
        name = str(node.get("name") or node.get("hostname") or "")
        if not name:
            continue
        tokens = slurm_state_tokens(_state_list(node.get("state")), node.get("state_flags") or [])
        since = num(node.get("reason_changed_at")) or None
        records[name] = SlurmNodeRecord(name, tuple(tokens), num(node.get("cpus")) or 0,
                                        num(node.get("alloc_cpus")) or 0, str(node.get("reason") or ""),
                                        float(since) if since else None)
    for group in doc.get("sinfo", []) or []:
        tokens = slurm_state_tokens(_state_list((group.get("node") or {}).get("state")))
        cpus = group.get("cpus") or {}
        names = (group.get("nodes") or {}).get("nodes") or []
        if isinstance(names, str):
            names = expand_hostlist(names)
        per_node_total = num(cpus.get("maximum")) or num(cpus.get("minimum")) or 0
        n = max(1, len(names))
        alloc = (num(cpus.get("allocated")) or 0) // n
        for name in names:
            if name not in records:  # a node in several partitions appears once per partition
                records[name] = SlurmNodeRecord(name, tuple(tokens), per_node_total, alloc,
                                                str((group.get("reason") or {}).get("description", "")
                                                    if isinstance(group.get("reason"), dict) else ""))
    return list(records.values())


def normalize_nodes(records: Iterable[SlurmNodeRecord], jobs_by_node: dict[str, list[str]],
                    warnings: list[str] | None = None, include_powered_down: bool = False) -> list[NodeInfo]:
    """Records + running jobs → ``NodeInfo``. Unused CLOUD pool slots (``POWERED_DOWN`` with no
    jobs) are left out unless asked: they are not workers, just names EPU may add."""
    out = []
    for rec in records:
        if (not include_powered_down and "POWERED_DOWN" in rec.tokens and "CLOUD" in rec.tokens
                and not jobs_by_node.get(rec.name)):
            continue
        state = slurm_node_state(list(rec.tokens), node=rec.name, warnings=warnings)
        if state == "free" and rec.cpus and rec.alloc_cpus >= rec.cpus:
            state = "busy"
        out.append(NodeInfo(name=rec.name, state=state, cores=rec.cpus,  # type: ignore[arg-type]
                            cores_used=min(rec.alloc_cpus, rec.cpus) if rec.cpus else rec.alloc_cpus,
                            jobs=sorted(jobs_by_node.get(rec.name, [])),
                            state_since=rec.state_since, native_state="+".join(rec.tokens)))
    return sorted(out, key=lambda n: n.name)


def parse_scontrol_show_node(text: str) -> dict[str, str]:
    """``scontrol show node NAME`` (text, all versions) → key/value pairs of the first node.
    Values never contain spaces except Reason=, which runs to the end of its line."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("Reason="):
            fields["Reason"] = line[len("Reason="):]
            continue
        for m in re.finditer(r"(\w+)=(\S*)", line):
            fields.setdefault(m.group(1), m.group(2))
    return fields
