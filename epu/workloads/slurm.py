"""Slurm accounting: ``sacct --parsable2`` and ``sacct --json`` as workloads.

Text form — the command (one line per job allocation, ``-X``: no steps; ``-P``: ``|``-separated
with a header line)::

    sacct -a -X -P -S 2024-01-01 -E 2024-02-01 \\
          -o JobID,JobName,User,Partition,Submit,Start,End,Elapsed,Timelimit,NNodes,NCPUS,ReqCPUS,State

Required fields: ``JobID``, ``Submit``, ``Start``, ``End``, ``NCPUS`` (or ``ReqCPUS``); used when
present: ``NNodes``, ``Timelimit``, ``Elapsed``, ``User``, ``Partition``, ``State``. Times are the
local ISO form sacct prints (``2024-01-05T13:02:11``, read as UTC: only differences matter);
durations are ``[D-]HH:MM:SS`` or ``MM:SS``; ``UNLIMITED`` / ``Partition_Limit`` is no limit.

JSON form — ``sacct --json`` (22.05: ``time.submission/start/end`` epoch seconds,
``time.limit`` minutes; 23.02+: ``{"set": .., "number": ..}`` objects are read too).

Jobs that never started (cancelled while pending), are still running or pending are skipped and
counted by reason; a job's run is End − Start, its wait Start − Submit.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from epu.workloads.model import TraceJob, Workload, WorkloadError
from epu.workloads.swf import open_text

REQUIRED = ("JobID", "Submit", "Start", "End")
NO_TIME = {"", "Unknown", "None", "N/A"}
NO_LIMIT = {"", "UNLIMITED", "Partition_Limit", "INVALID", "NONE"}


def parse_time(text: str) -> float | None:
    text = text.strip()
    if text in NO_TIME:
        return None
    try:
        return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()
    except ValueError:
        raise ValueError(f"not a sacct time: {text!r}") from None


def parse_duration(text: str) -> float | None:
    """``[D-]HH:MM:SS``, ``MM:SS`` or ``MM:SS.mmm`` → seconds; None for no limit."""
    text = text.strip()
    if text in NO_LIMIT:
        return None
    days = 0
    if "-" in text:
        d, text = text.split("-", 1)
        days = int(d)
    parts = [float(p) for p in text.split(":")]
    if len(parts) == 3:
        h, m, s = parts
    elif len(parts) == 2:
        h, (m, s) = 0.0, parts
    else:
        raise ValueError(f"not a sacct duration: {text!r}")
    return days * 86400 + h * 3600 + m * 60 + s


def _skip(skipped: dict[str, int], why: str) -> None:
    skipped[why] = skipped.get(why, 0) + 1


def _finish(name: str, source: str, rows: list[tuple[float, TraceJob]], skipped: dict[str, int]) -> Workload:
    if not rows:
        raise WorkloadError(f"{source}: no finished job (skipped: {skipped or 'none'})")
    t0 = min(t for t, _ in rows)
    jobs = [TraceJob(j.job_id, t - t0, j.run, j.procs, j.nodes, j.time_limit, j.user, j.queue, j.status, j.wait,
                     j.account) for t, j in rows]
    return Workload(name, jobs, source=source, start_epoch=t0, skipped=skipped)


def read_sacct(path: str | Path) -> Workload:
    with open_text(path) as f:
        return parse_sacct(f.read().splitlines(), Path(path).stem, str(path))


def parse_sacct(lines: list[str], name: str = "sacct", source: str = "<sacct>") -> Workload:
    lines = [ln for ln in lines if ln.strip()]
    if not lines:
        raise WorkloadError(f"{source}: empty")
    head = lines[0].split("|")
    missing = [f for f in REQUIRED if f not in head]
    if missing or not ({"NCPUS", "ReqCPUS"} & set(head)):
        raise WorkloadError(f"{source}:1: the header needs {', '.join(REQUIRED)} and NCPUS or ReqCPUS "
                            f"(missing: {', '.join(missing) or 'NCPUS/ReqCPUS'}); see docs/experiments.md")
    col = {f: i for i, f in enumerate(head)}
    rows: list[tuple[float, TraceJob]] = []
    skipped: dict[str, int] = {}
    for lineno, line in enumerate(lines[1:], 2):
        v = line.split("|")
        if len(v) != len(head):
            raise WorkloadError(f"{source}:{lineno}: {len(v)} fields, the header has {len(head)}")

        def get(f: str, default: str = "", v: list[str] = v) -> str:
            return v[col[f]] if f in col else default

        if "." in get("JobID"):
            continue  # a step (sacct without -X): the allocation line has the job
        try:
            submit, start, end = parse_time(get("Submit")), parse_time(get("Start")), parse_time(get("End"))
            limit = parse_duration(get("Timelimit")) if "Timelimit" in col else None
            procs = int(get("NCPUS") or 0) or int(get("ReqCPUS") or 0)
            nodes = int(get("NNodes") or 0)
        except ValueError as exc:
            raise WorkloadError(f"{source}:{lineno}: {exc}") from None
        state = get("State").split(" ")[0]
        if submit is None:
            _skip(skipped, "no submit time")
        elif start is None:
            _skip(skipped, "never started")
        elif end is None or state in ("RUNNING", "PENDING", "REQUEUED", "SUSPENDED"):
            _skip(skipped, "not finished")
        elif procs <= 0:
            _skip(skipped, "processors unknown")
        else:
            rows.append((submit, TraceJob(get("JobID"), 0.0, max(0.0, end - start), procs, nodes, limit or 0.0,
                                          get("User"), get("Partition"), state.lower(), max(0.0, start - submit),
                                          get("Account"))))
    return _finish(name, source, rows, skipped)


def _number(x: Any) -> float | None:
    """22.05 plain numbers; 23.02+ ``{"set": bool, "infinite": bool, "number": n}``."""
    if isinstance(x, dict):
        if not x.get("set", True) or x.get("infinite"):
            return None
        x = x.get("number")
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def read_sacct_json(path: str | Path) -> Workload:
    try:
        with open_text(path) as f:
            data = json.load(f)
    except json.JSONDecodeError as exc:
        raise WorkloadError(f"{path}: not valid JSON: {exc}") from None
    return parse_sacct_json(data, Path(path).stem, str(path))


def parse_sacct_json(data: Any, name: str = "sacct", source: str = "<sacct --json>") -> Workload:
    if not isinstance(data, dict) or not isinstance(data.get("jobs"), list):
        raise WorkloadError(f"{source}: not sacct --json output (no 'jobs' list)")
    rows: list[tuple[float, TraceJob]] = []
    skipped: dict[str, int] = {}
    for i, job in enumerate(data["jobs"]):
        where = f"{source}: jobs[{i}]"
        if not isinstance(job, dict) or not isinstance(job.get("time"), dict):
            raise WorkloadError(f"{where}: no 'time' object")
        t = job["time"]
        submit, start, end = _number(t.get("submission")), _number(t.get("start")), _number(t.get("end"))
        limit_min = _number(t.get("limit"))
        state = job.get("state", {})
        current = state.get("current") if isinstance(state, dict) else state
        if isinstance(current, list):
            current = current[0] if current else ""
        current = str(current or "")
        tres = {x.get("type"): x.get("count") for x in job.get("tres", {}).get("allocated", []) if isinstance(x, dict)}
        procs = int(tres.get("cpu") or _number(job.get("required", {}).get("CPUs")) or 0)
        nodes = int(_number(job.get("allocation_nodes")) or tres.get("node") or 0)
        jid = str(job.get("job_id", i))
        array = job.get("array", {})
        task = _number(array.get("task_id")) if isinstance(array, dict) else None
        if task is not None and _number(array.get("job_id")):
            jid = f"{int(_number(array.get('job_id')) or 0)}_{int(task)}"
        if not submit:
            _skip(skipped, "no submit time")
        elif not start:
            _skip(skipped, "never started")
        elif not end or current in ("RUNNING", "PENDING", "REQUEUED", "SUSPENDED"):
            _skip(skipped, "not finished")
        elif procs <= 0:
            _skip(skipped, "processors unknown")
        else:
            rows.append((submit, TraceJob(jid, 0.0, max(0.0, end - start), procs, nodes,
                                          (limit_min or 0.0) * 60.0, str(job.get("user", "")),
                                          str(job.get("partition", "")), current.lower(), max(0.0, start - submit),
                                          str(job.get("account", "") or ""))))
    return _finish(name, source, rows, skipped)
