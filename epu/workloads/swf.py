"""The Standard Workload Format (SWF) of the Parallel Workloads Archive, gzip or plain.

One job per line, 18 whitespace-separated fields (-1 = unknown): 1 job number, 2 submit time,
3 wait time, 4 run time, 5 allocated processors, 6 average CPU time, 7 used memory,
8 requested processors, 9 requested time, 10 requested memory, 11 status, 12 user, 13 group,
14 executable, 15 queue, 16 partition, 17 preceding job, 18 think time. Header comments start
with ``;`` (``; MaxProcs: 128``, ``; UnixStartTime: ...``, ``; Note: ...``).

What is kept: submit, run time, processors (allocated, else requested), requested time (the
job's time limit), wait, status, user, queue. A record whose run time or processors are unknown
cannot be replayed: it is skipped and counted by reason (``Workload.skipped``), never silently.
A line that is not SWF at all (wrong field count, not a number) is an error naming the line.
Notes of the header are kept; the archive's remark that "submit times are actually start times"
(the NASA iPSC/860 log) is kept too, since it changes how waits must be read.
"""

from __future__ import annotations

import gzip
import io
from pathlib import Path

from epu.workloads.model import TraceJob, Workload, WorkloadError

STATUS = {"1": "completed", "0": "failed", "5": "cancelled", "2": "partial", "3": "partial-last",
          "4": "partial-failed", "-1": ""}


def open_text(path: str | Path) -> io.TextIOBase:
    """A text stream over a plain or gzip file (detected by its magic bytes, not its name)."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            magic = f.read(2)
    except OSError as exc:
        raise WorkloadError(f"{p}: cannot read: {exc.strerror}") from None
    if magic == b"\x1f\x8b":
        return io.TextIOWrapper(gzip.open(p, "rb"), encoding="utf-8", errors="replace")
    return open(p, encoding="utf-8", errors="replace")


def read_swf(path: str | Path, name: str | None = None) -> Workload:
    p = Path(path)
    with open_text(p) as f:
        try:
            return parse_swf(f, name or p.name.split(".swf")[0], str(p))
        except (OSError, EOFError) as exc:  # a truncated gzip
            raise WorkloadError(f"{p}: cannot read: {exc}") from None


def parse_swf(lines: io.TextIOBase | list[str], name: str = "swf", source: str = "<swf>") -> Workload:
    header: dict[str, str] = {}
    notes: list[str] = []
    jobs: list[TraceJob] = []
    skipped: dict[str, int] = {}
    note: list[str] = []

    def flush_note() -> None:
        if note:
            notes.append(" ".join(note))
            note.clear()

    for lineno, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith(";"):
            body = line[1:].strip()
            key, sep, value = body.partition(":")
            if sep and key and " " not in key.strip():
                flush_note()
                key = key.strip()
                if key == "Note":
                    note.append(value.strip())
                else:
                    header.setdefault(key, value.strip())
            elif note and body:
                note.append(body)  # a note continued on the next comment line
            else:
                flush_note()
            continue
        flush_note()
        fields = line.split()
        if len(fields) != 18:
            raise WorkloadError(f"{source}:{lineno}: an SWF record has 18 fields, this line has {len(fields)}")
        try:
            v = [float(x) for x in fields]
        except ValueError:
            bad = next(x for x in fields if not _is_number(x))
            raise WorkloadError(f"{source}:{lineno}: field {fields.index(bad) + 1} is not a number: {bad!r}") from None
        submit, wait, run, alloc, req_procs, req_time = v[1], v[2], v[3], v[4], v[7], v[8]
        procs = int(alloc) if alloc > 0 else int(req_procs)
        reason = ("submit time unknown" if submit < 0 else "run time unknown" if run < 0
                  else "processors unknown" if procs <= 0 else "")
        if reason:
            skipped[reason] = skipped.get(reason, 0) + 1
            continue
        jobs.append(TraceJob(job_id=fields[0], submit=submit, run=run, procs=procs,
                             time_limit=req_time if req_time > 0 else 0.0,
                             user=fields[11] if v[11] >= 0 else "", queue=fields[14] if v[14] >= 0 else "",
                             account=fields[12] if v[12] >= 0 else "",
                             status=STATUS.get(fields[10], fields[10]), wait=wait if wait >= 0 else None))
    flush_note()
    if not jobs:
        raise WorkloadError(f"{source}: no job records (is it an SWF file?)")
    w = Workload(name, jobs, source=source, machine_procs=_int(header.get("MaxProcs")),
                 machine_nodes=_int(header.get("MaxNodes")), notes=notes, skipped=skipped)
    if "UnixStartTime" in header:
        w.start_epoch = float(_int(header["UnixStartTime"]))
    return w


def submit_is_start(w: Workload) -> bool:
    """The archive says this log's submit times are really start times (no wait information)."""
    return any("submit" in n.lower() and "start times" in n.lower() for n in w.notes)


def _is_number(x: str) -> bool:
    try:
        float(x)
    except ValueError:
        return False
    return True


def _int(text: str | None) -> int:
    try:
        return int(float((text or "0").split()[0]))
    except (ValueError, IndexError):
        return 0
