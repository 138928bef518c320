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
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from epu.common.columns import validate_nodes
from epu.common.messages import NodeInfo, QueuedJob
from epu.services.sensor.reasons import ReasonCache
from epu.services.sensor.shapes import JobsRead, ShapeGrouper
from epu.services.sensor.states import (
    SLURM_JOB_STATES,
    slurm_node_state,
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
class SlurmJobs(JobsRead):
    """One read of the queue: pending jobs grouped into shapes as they were read, a bounded
    sample of per-job records for operators, and what running jobs occupy."""

    jobs_by_node: dict[str, list[str]] = field(default_factory=dict)
    owners: dict[str, list[str]] = field(default_factory=dict)
    """Running job → [account, user, partition] (both reads: ``--json``, and the text read's
    ``account``/``username``/``partition`` columns; cost accounting)."""

    def add_running(self, job_id: str, nodelist: str, owner: list[str] | None = None) -> None:
        self.running += 1
        if owner is not None and any(owner):
            self.owners[job_id] = owner
        if not nodelist or nodelist == "(null)":
            return
        names = [nodelist] if "[" not in nodelist and "," not in nodelist else expand_hostlist(nodelist)
        for node in names:
            self.jobs_by_node.setdefault(node, []).append(job_id)


_MEM_UNIT_MB = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024, "P": 1024 ** 3}


def parse_mem_mb(text: str) -> int:
    """``12000M``/``4G``/``1.50G``/``512`` (MB) → MB; 0 for anything else."""
    text = (text or "").strip()
    if not text:
        return 0
    unit = text[-1].upper()
    factor = _MEM_UNIT_MB.get(unit)
    number = text[:-1] if factor is not None else text
    try:
        return int(math.ceil(float(number) * (factor or 1)))
    except ValueError:
        return 0


def tres_value(tres: str, key: str) -> str:
    """``cpu=4,mem=12000M,node=1,gres/gpu=2`` → the value of ``key`` ("" if absent)."""
    for part in (tres or "").split(","):
        k, _, v = part.partition("=")
        if k == key:
            return v
    return ""


def gres_gpus(spec: str) -> int:
    """GPUs in a gres/TRES request: ``gres:gpu:2``, ``gres/gpu:a100:2``, ``gpu:2(S:0)``,
    ``gres/gpu=2``, ``gres:gpu`` (= 1), several comma-separated entries; 0 when none."""
    total = 0
    for part in (spec or "").split(","):
        part = part.strip()
        if part.startswith(("gres:", "gres/")):
            part = part[5:]
        if not part.startswith("gpu"):
            continue
        part = part.split("(", 1)[0]
        rest = part[3:]
        if rest.startswith("="):
            count = rest[1:]
        elif not rest:
            count = "1"
        else:
            count = rest.rsplit(":", 1)[-1] if rest.count(":") else "1"
        try:
            total += int(count)
        except ValueError:
            total += 1  # "gpu:a100" (a type, no count) asks for one
    return total


def parse_time_limit(value: str) -> int:
    """squeue/scontrol time text → seconds: ``30:00``, ``2:00:00``, ``1-12:00:00``, ``365-00:00:00``;
    0 for ``UNLIMITED``/``NOT_SET``/``INVALID`` (no limit known)."""
    text = (value or "").strip()
    if not text or not text[0].isdigit():
        return 0
    days = 0
    if "-" in text:
        d, text = text.split("-", 1)
        days = int(d)
    try:
        parts = [int(p) for p in text.split(":")]
    except ValueError:
        return 0
    h, m, sec = ([0] * (3 - len(parts)) + parts)[-3:]
    return days * 86400 + h * 3600 + m * 60 + sec


def split_features(expr: str) -> tuple[str, ...]:
    """A job's ``--constraint`` → the features every node must have. ``a&b`` → (a, b). An
    expression with OR, counts or brackets (``a|b``, ``[a*2&b]``) cannot be reduced to one
    list: it is kept whole as a single token (matched literally, so typically unsatisfiable
    by a catalogue unless a type lists it; see docs/sensor.md)."""
    expr = (expr or "").strip()
    if not expr or expr == "(null)":
        return ()
    if any(c in expr for c in "|[]*"):
        return (expr,)
    return tuple(sorted({f.strip() for f in expr.split("&") if f.strip()}))


def _features_list(value: Any) -> list[str]:
    if isinstance(value, list):
        return sorted({str(v) for v in value if v})
    return sorted({f for f in str(value or "").split(",") if f and f != "(null)"})


LicenseFree = Callable[[], "dict[str, int] | None"]
"""Lazily read licenses: name → how many a job could take now (``None``: unknown)."""


def parse_licenses(text: str) -> dict[str, int]:
    """``scontrol show licenses`` (22.05–24.x; one or two lines per license) → name → count a
    new job could take now: ``Total − Used − Reserved``, and never more than ``Free`` (whether a
    version's ``Free`` already leaves out the reserved ones or not)."""
    out: dict[str, int] = {}
    name = ""
    fields: dict[str, str] = {}

    def close() -> None:
        if name:
            total, used, reserved = (num(fields.get(k)) or 0 for k in ("Total", "Used", "Reserved"))
            free = num(fields.get("Free"))
            left = total - used - reserved
            out[name] = max(0, min(left, free) if free is not None else left)

    for token in text.split():
        key, _, value = token.partition("=")
        if key == "LicenseName":
            close()
            name, fields = value, {}
        else:
            fields[key] = value
    close()
    return out


def license_blocked(spec: str, free: LicenseFree | None) -> bool:
    """Does a job asking for licenses ``spec`` (``matlab:1,stata:2``; ``a|b`` is either) wait for
    licenses no new node brings? Slurm tests a job's nodes before its licenses, so in a cluster
    whose nodes are all powered-down pool slots a job stuck on licenses shows a node reason
    (``Nodes required for job are DOWN, DRAINED...``, ``ReqNodeNotAvail``) that reads as demand:
    the licenses themselves say it cannot start. A license Slurm does not list (remote, or the
    read failed) is not held against the job."""
    if not spec or spec == "(null)" or free is None:
        return False
    counts = free()
    if not counts:
        return False
    either = "|" in spec
    blocked = []
    for item in spec.replace("|", ",").split(","):
        lic, _, n = item.strip().partition(":")
        if not lic or lic not in counts:
            blocked.append(False)
            continue
        blocked.append((int(n) if n.isdigit() else 1) > counts[lic])
    return all(blocked) if either else any(blocked)


def parse_squeue(doc: dict[str, Any] | str | bytes, now: float, warnings: list[str] | None = None,
                 grouper: ShapeGrouper | None = None, licenses: LicenseFree | None = None) -> SlurmJobs:
    """``squeue --json`` (22.05 plain values, 23.02+ ``{set, number}`` values and state lists)
    → pending jobs grouped into shapes, running count and jobs per node. ``licenses``: read
    when a job that looks like demand asks for licenses (``license_blocked``)."""
    if isinstance(doc, str | bytes):
        doc = json.loads(doc)
    out = SlurmJobs(grouper=grouper or ShapeGrouper(), warnings=warnings if warnings is not None else [])
    reasons = ReasonCache("slurm", out.warnings)
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
        if disposition == "running":
            out.add_running(job_id, str(job.get("nodes") or ""),
                            [str(job.get("account") or ""), str(job.get("user_name") or ""),
                             str(job.get("partition") or "")])
            continue
        if disposition == "finished":
            out.finished += 1
            continue
        verdict = reasons(str(job.get("state_reason") or "None"))
        demand, reason, cls = verdict.demand, verdict.reason, verdict.reason_class
        if disposition == "held" and demand:  # REQUEUE_HOLD, SPECIAL_EXIT: held whatever the reason says
            demand, reason, cls = False, base, "held"
        if demand and num(job.get("priority")) == 0:
            demand, cls = False, "held"
        if demand and license_blocked(str(job.get("licenses") or ""), licenses):
            demand, reason, cls = False, "Licenses", "limit"
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
        gpus = gres_gpus(str(job.get("tres_per_node") or ""))
        if not gpus:
            per_job = gres_gpus(str(job.get("tres_per_job") or ""))
            gpus = math.ceil(per_job / nodes) if per_job else 0
        limit = num(job.get("time_limit"))
        submit = float(num(job.get("submit_time")) or 0)
        wait = max(0.0, now - submit) if submit else 0.0
        features = split_features(str(job.get("features") or ""))
        partition = str(job.get("partition") or "")
        out.grouper.add(nodes=nodes, cores=per_node, memory_mb=max(0, mem or 0), gpus=gpus, features=features,
                        partition=partition, time_limit_s=(limit or 0) * 60, demand=demand, reason=reason,
                        reason_class=cls, wait_s=wait, count=count, job_id=job_id)
        if len(out.sample) < out.sample_size:
            out.sample.append(QueuedJob(job_id=job_id, cores=per_node, nodes=nodes, memory_mb=max(0, mem or 0),
                                        queue=partition, submit_time=submit, wait_seconds=wait,
                                        state=state_of(demand, cls), count=count))
    return out


def state_of(demand: bool, reason_class: str) -> str:
    """The old three-way job state, for the per-job sample: queued (demand), held, blocked."""
    if demand:
        return "queued"
    return "held" if reason_class == "held" else "blocked"


#: What EPU writes into a node's Comment when it adds the node (``add`` with an instance id), and
#: reads back as ``NodeInfo.instance_id``. Anything else in the comment is the administrator's.
EPU_COMMENT = re.compile(r"epu:instance=([A-Za-z0-9_.:-]+)")


def instance_from_comment(comment: str) -> str | None:
    m = EPU_COMMENT.search(comment or "")
    return m.group(1) if m else None


def comment_with_instance(comment: str, instance_id: str | None) -> str:
    """The node comment with EPU's token set to ``instance_id`` (or removed when None), the
    administrator's text kept."""
    rest = " ".join(EPU_COMMENT.sub("", comment or "").split())
    if rest == "(null)":
        rest = ""
    if instance_id is None:
        return rest
    return f"{rest} epu:instance={instance_id}".strip()


@dataclass(slots=True)
class SlurmNodeRecord:
    """One node as read, before jobs are attached."""

    name: str
    tokens: tuple[str, ...]
    cpus: int
    alloc_cpus: int
    reason: str = ""
    state_since: float | None = None
    memory_mb: int = 0
    alloc_memory_mb: int = 0
    gpus: int = 0
    gpus_used: int = 0
    features: tuple[str, ...] = ()
    partitions: tuple[str, ...] = ()
    instance_id: str | None = None


def node_records(doc: dict[str, Any] | str | bytes) -> list[SlurmNodeRecord]:
    """``sinfo --json`` (22.05 flat ``nodes`` or 23.02+ grouped ``sinfo``) or
    ``scontrol show nodes --json`` (23.02+) → one record per node."""
    if isinstance(doc, str | bytes):
        doc = json.loads(doc)
    records: dict[str, SlurmNodeRecord] = {}
    for node in doc.get("nodes", []) or []:
        name = str(node.get("name") or node.get("hostname") or "")
        if not name:
            continue
        tokens = slurm_state_tokens(_state_list(node.get("state")), node.get("state_flags") or [])
        since = num(node.get("reason_changed_at")) or None
        features = node.get("active_features") or node.get("features") or ""
        records[name] = SlurmNodeRecord(
            name, tuple(tokens), num(node.get("cpus")) or 0, num(node.get("alloc_cpus")) or 0,
            str(node.get("reason") or ""), float(since) if since else None,
            memory_mb=num(node.get("real_memory")) or 0, alloc_memory_mb=num(node.get("alloc_memory")) or 0,
            gpus=gres_gpus(str(node.get("gres") or "")), gpus_used=gres_gpus(str(node.get("gres_used") or "")),
            features=tuple(_features_list(features)),
            partitions=tuple(_features_list(node.get("partitions") or [])),
            instance_id=instance_from_comment(str(node.get("comment") or "")))
    for group in doc.get("sinfo", []) or []:
        tokens = slurm_state_tokens(_state_list((group.get("node") or {}).get("state")))
        cpus = group.get("cpus") or {}
        names = (group.get("nodes") or {}).get("nodes") or []
        if isinstance(names, str):
            names = expand_hostlist(names)
        per_node_total = num(cpus.get("maximum")) or num(cpus.get("minimum")) or 0
        n = max(1, len(names))
        alloc = (num(cpus.get("allocated")) or 0) // n
        memory = group.get("memory") or {}
        partition = str((group.get("partition") or {}).get("name") or "")
        for name in names:
            prev = records.get(name)
            if prev is not None:  # a node in several partitions appears once per partition
                if partition and partition not in prev.partitions:
                    records[name] = replace(prev, partitions=tuple(sorted({*prev.partitions, partition})))
                continue
            records[name] = SlurmNodeRecord(
                name, tuple(tokens), per_node_total, alloc,
                str((group.get("reason") or {}).get("description", "") if isinstance(group.get("reason"), dict) else ""),
                memory_mb=num(memory.get("maximum")) or num(memory.get("minimum")) or 0,
                gpus=gres_gpus(str((group.get("gres") or {}).get("total") or "")),
                features=tuple(_features_list((group.get("features") or {}).get("active") or "")),
                partitions=(partition,) if partition else ())
    return list(records.values())


def normalize_nodes(records: Iterable[SlurmNodeRecord], jobs_by_node: dict[str, list[str]],
                    warnings: list[str] | None = None, include_powered_down: bool = False) -> list[NodeInfo]:
    """Records + running jobs → ``NodeInfo``. Unused CLOUD pool slots (``POWERED_DOWN`` with no
    jobs) are left out unless asked: they are not workers, just names EPU may add. All nodes
    are validated in one call."""
    rows = []
    state_cache: dict[tuple[str, ...], tuple[str, str]] = {}  # tokens → (state, native state)
    for rec in records:
        if (not include_powered_down and "POWERED_DOWN" in rec.tokens and "CLOUD" in rec.tokens
                and not jobs_by_node.get(rec.name)):
            continue
        tokens = rec.tokens
        cached = state_cache.get(tokens)
        if cached is None:
            cached = state_cache[tokens] = (slurm_node_state(list(tokens), node=rec.name, warnings=warnings),
                                            "+".join(tokens))
        state, native = cached
        if state == "free" and rec.cpus and rec.alloc_cpus >= rec.cpus:
            state = "busy"
        jobs = jobs_by_node.get(rec.name)
        rows.append({"name": rec.name, "state": state, "cores": rec.cpus,
                     "cores_used": min(rec.alloc_cpus, rec.cpus) if rec.cpus else rec.alloc_cpus,
                     "jobs": sorted(jobs) if jobs else [], "state_since": rec.state_since,
                     "native_state": native, "instance_id": rec.instance_id,
                     "memory_mb": rec.memory_mb, "memory_used_mb": rec.alloc_memory_mb, "gpus": rec.gpus,
                     "gpus_used": min(rec.gpus_used, rec.gpus) if rec.gpus else rec.gpus_used,
                     "features": list(rec.features), "partitions": list(rec.partitions)})
    rows.sort(key=lambda r: r["name"])
    return validate_nodes(rows)


def parse_scontrol_show_node(text: str) -> dict[str, str]:
    """``scontrol show node NAME`` (text, all versions) → key/value pairs of the first node.
    Values never contain spaces except Reason=, Comment= and Extra=, each on a line of its own."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        for free_text in ("Reason=", "Comment=", "Extra="):
            if line.startswith(free_text):
                fields[free_text[:-1]] = line[len(free_text):]
                break
        else:
            free_text = ""
        if free_text:
            continue
        for m in re.finditer(r"(\w+)=(\S*)", line):
            fields.setdefault(m.group(1), m.group(2))
    return fields
