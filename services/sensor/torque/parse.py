"""Pure parsers for Torque's XML (functional core; no process is started here).

``qstat -f -x [-t]`` and ``pbsnodes -x`` print one XML document each. Jobs are streamed with
``iterparse`` and each ``<Job>`` element is cleared once read, so memory stays flat on a
100,000-job queue (see bench/bench_sensor.py for the DOM baseline). Records are flat dicts
(``Resource_List.nodes`` style keys), the same shape pbs_python's ``pbs_statjob`` gives, so
both read paths share the normalization below.

Resource requests (``Resource_List``):

* ``nodes=N:ppn=M`` (also ``N:ppn=M:feature``, ``host1:ppn=2+2:ppn=1``) → N nodes × M cores;
  for a ``+`` list, nodes add up and cores per node is the largest part.
* ``procs=N`` → N × 1 core, on any nodes (Torque may put several on one node).
* ``ncpus=N`` → 1 node × N cores.
"""

from __future__ import annotations

import io
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from common.messages import NodeInfo, QueuedJob
from services.sensor.states import TORQUE_JOB_STATES, torque_node_state

Record = dict[str, str]


# ------------------------------------------------------------------ XML → flat records
def _flatten(elem: ET.Element) -> Record:
    rec: Record = {}
    for child in elem:
        if len(child):
            for sub in child:
                rec[f"{child.tag}.{sub.tag}"] = sub.text or ""
        else:
            rec[child.tag] = child.text or ""
    return rec


def iter_records(xml: str | bytes, tag: str) -> Iterator[Record]:
    """Stream ``<tag>`` elements of a Torque XML document as flat records."""
    data = xml.encode() if isinstance(xml, str) else xml
    data = data.strip()
    if not data:
        return
    for _event, elem in ET.iterparse(io.BytesIO(data), events=("end",)):
        if elem.tag == tag:
            yield _flatten(elem)
            elem.clear()


# ------------------------------------------------------------------ requests
def parse_nodes_spec(spec: str) -> tuple[int, int]:
    """``2:ppn=4`` → (2, 4); ``host1:ppn=2+2:ppn=1`` → (3, 2); ``1`` → (1, 1)."""
    total_nodes = 0
    max_ppn = 1
    for part in (spec or "1").split("+"):
        fields = part.split(":")
        head = fields[0].strip()
        count = int(head) if head.isdigit() else 1  # a host name stands for one node
        ppn = 1
        for f in fields[1:]:
            if f.startswith("ppn="):
                try:
                    ppn = max(1, int(f[4:]))
                except ValueError:
                    ppn = 1
        total_nodes += max(1, count)
        max_ppn = max(max_ppn, ppn)
    return max(1, total_nodes), max_ppn


_MEM_UNITS = {"b": 1 / (1024 * 1024), "w": 8 / (1024 * 1024), "kb": 1 / 1024, "kw": 8 / 1024, "mb": 1,
              "mw": 8, "gb": 1024, "gw": 8 * 1024, "tb": 1024 * 1024, "tw": 8 * 1024 * 1024}


def parse_mem_mb(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([kmgt]?[bw])?\s*", (text or "").lower())
    if not m:
        return 0
    return int(int(m.group(1)) * _MEM_UNITS[m.group(2) or "b"])


def job_request(rec: Record) -> tuple[int, int]:
    """(nodes, cores per node) requested by a job record."""
    if rec.get("Resource_List.nodes"):
        return parse_nodes_spec(rec["Resource_List.nodes"])
    procs = rec.get("Resource_List.procs")
    if procs and procs.isdigit():
        return max(1, int(procs)), 1
    ncpus = rec.get("Resource_List.ncpus")
    if ncpus and ncpus.isdigit():
        return 1, max(1, int(ncpus))
    return 1, 1


def _array_count(spec: str) -> int:
    total = 0
    for part in (spec or "").split("%", 1)[0].split(","):
        if "-" in part:
            lo, hi = part.split("-", 1)
            if lo.strip().isdigit() and hi.strip().isdigit():
                total += int(hi) - int(lo) + 1
        elif part.strip().isdigit():
            total += 1
    return max(1, total)


# ------------------------------------------------------------------ jobs
@dataclass
class TorqueJobs:
    queued: list[QueuedJob] = field(default_factory=list)
    running: int = 0
    finished: int = 0
    unknown_states: list[str] = field(default_factory=list)


def normalize_jobs(records: Iterable[Record], now: float) -> TorqueJobs:
    out = TorqueJobs()
    for rec in records:
        native = rec.get("job_state", "")
        disposition = TORQUE_JOB_STATES.get(native)
        if disposition is None:
            out.unknown_states.append(native)
            continue
        if disposition == "running":
            out.running += 1
            continue
        if disposition == "finished":
            out.finished += 1
            continue
        if disposition == "held" and rec.get("depend"):
            disposition = "blocked"  # a system hold waiting on a dependency
        job_id = rec.get("Job_Id", "")
        count = 1
        if "[]" in job_id and rec.get("job_array_request"):
            count = _array_count(rec["job_array_request"])  # array parent (qstat without -t)
        nodes, cores = job_request(rec)
        submit = float(rec.get("qtime") or rec.get("ctime") or 0)
        out.queued.append(QueuedJob(
            job_id=job_id, cores=cores, nodes=nodes, memory_mb=parse_mem_mb(rec.get("Resource_List.mem", "")),
            queue=rec.get("queue", ""), submit_time=submit, wait_seconds=max(0.0, now - submit) if submit else 0.0,
            state=disposition, count=count))  # type: ignore[arg-type]
    return out


def parse_qstat(xml: str | bytes, now: float) -> TorqueJobs:
    return normalize_jobs(iter_records(xml, "Job"), now)


# ------------------------------------------------------------------ nodes
def parse_node_jobs(text: str) -> tuple[list[str], int]:
    """``0-1/2.vm`` or ``0/3.vm,1/4.vm`` → (job ids, slots used)."""
    jobs: list[str] = []
    slots = 0
    for part in (text or "").split(","):
        part = part.strip()
        if "/" not in part:
            continue
        cores, job = part.split("/", 1)
        for rng in cores.split("+"):
            if "-" in rng:
                lo, hi = rng.split("-", 1)
                slots += int(hi) - int(lo) + 1 if lo.isdigit() and hi.isdigit() else 1
            else:
                slots += 1
        if job not in jobs:
            jobs.append(job)
    return jobs, slots


def normalize_nodes(records: Iterable[Record], warnings: list[str] | None = None) -> list[NodeInfo]:
    out = []
    for rec in records:
        name = rec.get("name", "")
        if not name:
            continue
        native = rec.get("state", "")
        state = torque_node_state(native, name, warnings)
        np = int(rec["np"]) if rec.get("np", "").isdigit() else 0
        jobs, used = parse_node_jobs(rec.get("jobs", ""))
        if state == "free" and np and used >= np:
            state = "busy"
        out.append(NodeInfo(name=name, state=state, cores=np, cores_used=min(used, np) if np else used,  # type: ignore[arg-type]
                            jobs=jobs, native_state=native))
    return out


def parse_pbsnodes(xml: str | bytes, warnings: list[str] | None = None) -> list[NodeInfo]:
    return normalize_nodes(iter_records(xml, "Node"), warnings)
