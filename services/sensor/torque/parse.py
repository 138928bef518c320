"""Pure parsers for Torque's XML (functional core; no process is started here).

``qstat -f -x [-t]`` and ``pbsnodes -x`` print one XML document each. Neither is parsed into
elements: ``scan_qstat`` finds the few attributes it needs in each job's text and groups pending
jobs by their raw request as it goes (bench/bench_sensor.py measures it beside expat); nodes are
picked out by one regular expression each. pbs_python's ``pbs_statjob`` gives flat records
(``Resource_List.nodes`` style keys), normalized by the same ``TorqueJobReader``.

Resource requests (``Resource_List``):

* ``nodes=N:ppn=M`` (also ``N:ppn=M:feature``, ``host1:ppn=2+2:ppn=1``) → N nodes × M cores;
  for a ``+`` list, nodes add up and cores per node is the largest part.
* ``procs=N`` → N × 1 core, on any nodes (Torque may put several on one node).
* ``ncpus=N`` → 1 node × N cores.
"""

from __future__ import annotations

import html
import io
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from epu.common.columns import validate_nodes
from epu.common.messages import NodeInfo, QueuedJob
from epu.services.sensor.reasons import ReasonCache
from epu.services.sensor.shapes import JobsRead, ShapeGrouper
from epu.services.sensor.states import TORQUE_JOB_STATES, torque_node_state

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
    nodes, cores, _gpus, _props = parse_nodes_request(spec)
    return nodes, cores


_MEM_UNITS = {"b": 1 / (1024 * 1024), "w": 8 / (1024 * 1024), "kb": 1 / 1024, "kw": 8 / 1024, "mb": 1,
              "mw": 8, "gb": 1024, "gw": 8 * 1024, "tb": 1024 * 1024, "tw": 8 * 1024 * 1024}


def parse_mem_mb(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([kmgt]?[bw])?\s*", (text or "").lower())
    if not m:
        return 0
    return int(int(m.group(1)) * _MEM_UNITS[m.group(2) or "b"])


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
_PLAIN_SPEC = re.compile(r"^\d+$")


def parse_nodes_request(spec: str) -> tuple[int, int, int, tuple[str, ...]]:
    """``nodes=`` → (nodes, cores per node, GPUs per node, required properties).
    ``2:ppn=4:gpus=1:bigmem`` → (2, 4, 1, ("bigmem",)); a ``+`` list adds nodes and keeps the
    largest per-node request; a host name stands for one node (not a property)."""
    total_nodes = 0
    max_ppn, max_gpus = 1, 0
    props: set[str] = set()
    for part in (spec or "1").split("+"):
        fields = part.split(":")
        head = fields[0].strip()
        count = int(head) if head.isdigit() else 1
        ppn, gpus = 1, 0
        for f in fields[1:]:
            key, _, value = f.partition("=")
            if key == "ppn":
                ppn = max(1, int(value)) if value.isdigit() else 1
            elif key == "gpus":
                gpus = int(value) if value.isdigit() else 1
            elif not value and f:
                props.add(f)
        total_nodes += max(1, count)
        max_ppn, max_gpus = max(max_ppn, ppn), max(max_gpus, gpus)
    return max(1, total_nodes), max_ppn, max_gpus, tuple(sorted(props))


def parse_walltime(text: str) -> int:
    """``01:30:00`` / ``90:00`` / ``3600`` → seconds (0 when absent or unreadable)."""
    parts = (text or "").strip().split(":")
    if not all(p.isdigit() for p in parts) or not parts[0]:
        return 0
    total = 0
    for p in parts:
        total = total * 60 + int(p)
    return total


@dataclass
class TorqueJobs(JobsRead):
    """What one read saw (see ``JobsRead``)."""

    owners: dict[str, list[str]] = field(default_factory=dict)
    """Running job → [account, user, partition] (the XML scan; cost accounting): ``Account_Name``
    (else ``egroup``), ``euser``, ``queue``."""


def _request(nodes_spec: str, procs: str, ncpus: str, mem: str, pmem: str, walltime: str) -> tuple:
    """(nodes, cores per node, memory per node MB, GPUs per node, properties, time limit s).
    Torque's ``mem`` is for the whole job (split over its nodes); ``pmem`` is per process."""
    gpus, props = 0, ()
    if nodes_spec:
        nodes, cores, gpus, props = parse_nodes_request(nodes_spec)
    elif procs.isdigit():
        nodes, cores = max(1, int(procs)), 1
    elif ncpus.isdigit():
        nodes, cores = 1, max(1, int(ncpus))
    else:
        nodes, cores = 1, 1
    memory = -(-parse_mem_mb(mem) // nodes) if mem else 0
    if pmem:
        memory = max(memory, parse_mem_mb(pmem) * cores)
    return nodes, cores, memory, gpus, props, parse_walltime(walltime)


def torque_reason(state: str, hold_types: str, depend: str) -> str:
    """The key of ``reasons.TORQUE_REASONS`` for a pending job."""
    if state != "H":
        return state
    if depend:
        return "H/depend"
    for kind in ("u", "o", "s", "p"):
        if kind in hold_types:
            return f"H/{kind}"
    return "H"


class TorqueJobReader:
    """Interprets pending jobs into shapes; shared by the XML scan and pbs_python's records."""

    def __init__(self, now: float, warnings: list[str] | None = None, grouper: ShapeGrouper | None = None) -> None:
        self.now = now
        self.out = TorqueJobs(grouper=grouper or ShapeGrouper(), warnings=warnings if warnings is not None else [])
        self.reasons = ReasonCache("torque", self.out.warnings)
        self._requests: dict[tuple, tuple] = {}

    def job(self, job_id: str, state: str, queue: str, qtime: str, hold_types: str, depend: str,
            array_request: str, resources: tuple[str, str, str, str, str, str]) -> None:
        disposition = TORQUE_JOB_STATES.get(state)
        out = self.out
        if disposition is None:
            out.unknown_states.append(state)
            return
        if disposition == "running":
            out.running += 1
            return
        if disposition == "finished":
            out.finished += 1
            return
        count = _array_count(array_request) if "[]" in job_id and array_request else 1
        submit = float(qtime) if qtime.isdigit() else 0.0
        seen = self.pending(state, queue, hold_types, depend, resources, jobs=1, elements=count,
                            first_submit=submit, job_ids=(job_id,))
        self.sample(seen, job_id, submit, count)

    def pending(self, state: str, queue: str, hold_types: str, depend: str,
                resources: tuple[str, str, str, str, str, str], *, jobs: int, elements: int, first_submit: float,
                job_ids: tuple[str, ...]) -> tuple[int, int, int, str, str]:
        """Counts ``jobs`` pending jobs that share a state, queue, hold, dependency and request
        (each ``elements`` array elements; ``first_submit`` the earliest submit time, 0 when
        unknown; ``job_ids`` the first few, for the shape's sample). Returns what ``sample``
        needs: (nodes, cores, memory MB, queue, state word)."""
        verdict = self.reasons(torque_reason(state, hold_types, depend))
        req = self._requests.get(resources)
        if req is None:
            req = self._requests[resources] = _request(*resources)
        nodes, cores, memory, gpus, props, limit = req
        wait = max(0.0, self.now - first_submit) if first_submit else 0.0
        self.out.grouper.add_group(nodes=nodes, cores=cores, memory_mb=memory, gpus=gpus, features=props,
                                   partition=queue, time_limit_s=limit, demand=verdict.demand, reason=verdict.reason,
                                   reason_class=verdict.reason_class, wait_s=wait, count=jobs * elements,
                                   job_ids=job_ids)
        state_word = "queued" if verdict.demand else ("held" if verdict.reason_class == "held" else "blocked")
        return nodes, cores, memory, queue, state_word

    def sample(self, seen: tuple[int, int, int, str, str], job_id: str, submit: float, elements: int) -> None:
        """One job of the bounded per-job sample shown to operators."""
        out = self.out
        if len(out.sample) < out.sample_size:
            nodes, cores, memory, queue, state_word = seen
            out.sample.append(QueuedJob(job_id=job_id, cores=cores, nodes=nodes, memory_mb=memory, queue=queue,
                                        submit_time=submit, wait_seconds=max(0.0, self.now - submit) if submit else 0.0,
                                        state=state_word, count=elements))  # type: ignore[arg-type]


def normalize_jobs(records: Iterable[Record], now: float, warnings: list[str] | None = None,
                   grouper: ShapeGrouper | None = None) -> TorqueJobs:
    """Flat records (pbs_python's ``pbs_statjob``, or ``_flatten``ed XML) → shapes."""
    reader = TorqueJobReader(now, warnings, grouper)
    for rec in records:
        reader.job(rec.get("Job_Id", ""), rec.get("job_state", ""), rec.get("queue", ""),
                   rec.get("qtime") or rec.get("ctime") or "", rec.get("Hold_Types", ""), rec.get("depend", ""),
                   rec.get("job_array_request", ""),
                   tuple(rec.get(f"Resource_List.{k}", "") for k in RESOURCE_KEYS))  # type: ignore[arg-type]
    return reader.out


#: The job attributes the sensor needs — what it asks pbs_python's ``pbs_statjob`` for (a
#: server-side projection) and what the XML scan picks out of ``qstat -f -x``.
JOB_ATTRIBUTES = ("job_state", "queue", "qtime", "Hold_Types", "depend", "job_array_request", "Resource_List")
RESOURCE_KEYS = ("nodes", "procs", "ncpus", "mem", "pmem", "walltime")
_RESOURCE_SCAN = re.compile(r"<(nodes|procs|ncpus|mem|pmem|walltime)>([^<]*)</")
_SAMPLE_IDS = 3  # job ids kept per group of identical pending jobs (ShapeGrouper keeps 3 per shape)


def _text(value: str) -> str:
    return html.unescape(value) if "&" in value else value


def _element(text: str, tag: str, start: int, end: int) -> str:
    """The text of the first ``tag`` element in ``text[start:end]`` ("" when absent)."""
    i = text.find(tag, start, end)
    if i < 0:
        return ""
    i += len(tag)
    return _text(text[i:text.find("<", i)])


def _resources(block: str) -> tuple[str, ...]:
    found = dict(_RESOURCE_SCAN.findall(block))
    return tuple(_text(found.get(k, "")) for k in RESOURCE_KEYS)


def scan_qstat(xml: str | bytes, now: float, warnings: list[str] | None = None,
               grouper: ShapeGrouper | None = None) -> TorqueJobs:
    """``qstat -f -x [-t]`` → shapes in one pass over the document, with no element tree and no
    per-element work: a real record is ~1.6 KB of ~45 elements of which the sensor needs a
    handful, so each job is located by its ``<Job_Id>`` and only the needed attributes are
    looked up in it (``str.find``, which skips through the text in C), and only for the jobs
    that need them: a running or finished job costs its ``job_state``; ``Hold_Types`` and
    ``depend`` are read only for held jobs, ``job_array_request`` only for an array's ``[]``
    summary. Pending jobs are counted under their raw text (state, queue, hold, dependency,
    array request, ``Resource_List`` block), so each distinct request is interpreted once,
    after the scan. Output that does not end its ``<Data>`` document (cut short) raises
    ``ValueError``: a truncated queue is unreadable, never a shorter one."""
    text = xml.decode("utf-8", "replace") if isinstance(xml, bytes) else xml
    reader = TorqueJobReader(now, warnings, grouper)
    out = reader.out
    if not text or text.isspace():
        return out
    last = len(text)  # the document's end before trailing whitespace, found without copying it
    while text[last - 1].isspace():  # (qstat ends with a newline; strip() would copy ~170 MB)
        last -= 1
    if not text.endswith("</Data>", 0, last):
        raise ValueError("qstat XML is not a complete <Data> document (output cut short?)")
    dispositions = TORQUE_JOB_STATES
    groups: dict[tuple, list] = {}  # raw key → [jobs, earliest submit, first job ids]
    samples: list[tuple[tuple, str, int]] = []  # the first pending jobs in document order
    sample_size = out.sample_size
    find = text.find
    end_of_text = len(text)
    nxt = find("<Job_Id>")
    while nxt >= 0:
        start = nxt + 8
        nxt = find("<Job_Id>", start)
        end = nxt if nxt >= 0 else end_of_text
        i = find("<job_state>", start, end)
        state = text[i + 11:find("<", i + 11)] if i >= 0 else ""
        disposition = dispositions.get(state)
        if disposition == "running":
            out.running += 1
            owner = [_element(text, tag, start, end) for tag in ("<Account_Name>", "<euser>", "<queue>")]
            if not owner[0]:
                owner[0] = _element(text, "<egroup>", start, end)
            if any(owner):
                out.owners[_text(text[start:find("<", start)])] = owner
            continue
        if disposition == "finished":
            out.finished += 1
            continue
        if disposition is None:
            out.unknown_states.append(_text(state))
            continue
        job_id = text[start:find("<", start)]
        # queue, qtime and Resource_List follow job_state in that order in Torque's output, so
        # each is looked for after the one before (the record is scanned once, not once per
        # field); one that is not there is looked for from the record's start, so any order reads
        # the same.
        p = i + 11 if i >= 0 else start
        i = find("<queue>", p, end)
        if i < 0 and p != start:
            i = find("<queue>", start, end)
        if i >= 0:
            p = find("<", i + 7)
            queue = text[i + 7:p]
        else:
            queue = ""
        i = find("<qtime>", p, end)
        if i < 0 and p != start:
            i = find("<qtime>", start, end)
        if i >= 0:
            p = find("<", i + 7)
            qtime = text[i + 7:p]
        else:
            qtime = ""
        if not qtime:  # as normalize_jobs: an array's summary record has a ctime and no qtime
            k = find("<ctime>", start, end)
            qtime = text[k + 7:find("<", k + 7)] if k >= 0 else ""
        i = find("<Resource_List>", p, end)
        if i < 0 and p != start:
            i = find("<Resource_List>", start, end)
        j = find("</Resource_List>", i, end) if i >= 0 else -1
        block = text[i + 15:j] if j >= 0 else ""
        hold = depend = array = ""
        if state == "H":
            i = find("<Hold_Types>", start, end)
            hold = text[i + 12:find("<", i + 12)] if i >= 0 else ""
            i = find("<depend>", start, end)
            depend = text[i + 8:find("<", i + 8)] if i >= 0 else ""
        if "[]" in job_id:
            i = find("<job_array_request>", start, end)
            array = text[i + 19:find("<", i + 19)] if i >= 0 else ""
        submit = int(qtime) if qtime.isdigit() else 0
        key = (state, queue, hold, depend, array, block)
        g = groups.get(key)
        if g is None:
            groups[key] = [1, submit, [job_id]]
        else:
            g[0] += 1
            if submit and (submit < g[1] or not g[1]):
                g[1] = submit
            if len(g[2]) < _SAMPLE_IDS:
                g[2].append(job_id)
        if len(samples) < sample_size:
            samples.append((key, job_id, submit))
    seen: dict[tuple, tuple] = {}
    for key, (jobs, first, ids) in groups.items():
        state, queue, hold, depend, array, block = key
        elements = _array_count(_text(array)) if array else 1
        seen[key] = (reader.pending(state, _text(queue), _text(hold), depend, _resources(block), jobs=jobs,
                                    elements=elements, first_submit=float(first),
                                    job_ids=tuple(_text(j) for j in ids)), elements)
    for key, job_id, submit in samples:
        info, elements = seen[key]
        reader.sample(info, _text(job_id), float(submit), elements)
    return out


def parse_qstat(xml: str | bytes, now: float, warnings: list[str] | None = None) -> TorqueJobs:
    return scan_qstat(xml, now, warnings)


# ------------------------------------------------------------------ nodes
def parse_node_jobs(text: str) -> tuple[list[str], int]:
    """``0-1/2.vm`` or ``0/3.vm,1/4.vm`` → (job ids, slots used)."""
    jobs: list[str] = []
    slots = 0
    if not text:
        return jobs, slots
    for part in text.split(","):
        cores, slash, job = part.strip().partition("/")
        if not slash:
            continue
        for rng in cores.split("+") if "+" in cores else (cores,):
            lo, dash, hi = rng.partition("-")
            slots += (int(hi) - int(lo) + 1 if lo.isdigit() and hi.isdigit() else 1) if dash else 1
        if job not in jobs:
            jobs.append(job)
    return jobs, slots


#: The property EPU gives a node it adds, carrying the instance (launch) id: ``epu-<id>``.
EPU_PROPERTY_PREFIX = "epu-"
_PHYSMEM = re.compile(r"(?:^|,)physmem=(\d+)(kb|mb|gb|b)?")


def instance_property(instance_id: str | None) -> str | None:
    """The node property for ``instance_id``, or None when the id has characters a Torque
    property cannot hold (then the node is matched by name only)."""
    if instance_id and re.fullmatch(r"[A-Za-z0-9_-]{1,60}", instance_id):
        return EPU_PROPERTY_PREFIX + instance_id
    return None


def split_properties(text: str) -> tuple[list[str], str | None]:
    """``<properties>`` → (features, EPU instance id)."""
    features, instance = [], None
    for prop in (text or "").split(","):
        prop = prop.strip()
        if not prop:
            continue
        if prop.startswith(EPU_PROPERTY_PREFIX):
            instance = prop[len(EPU_PROPERTY_PREFIX):]
        else:
            features.append(prop)
    return sorted(set(features)), instance


_PHYSMEM_VALUE = re.compile(r"(\d+)(kb|mb|gb|b)?")


def _physmem_mb(status: str, cache: dict[str, int]) -> int:
    """``physmem=`` of a node's ``<status>`` in MB (0 when absent): as ``_PHYSMEM.search``, but
    found with ``str.find`` (a regular expression that starts with an alternation tries every
    position of the ~350-character status) and each distinct value converted once."""
    i = status.find("physmem=")
    if i > 0 and status[i - 1] != ",":
        m = _PHYSMEM.search(status)  # "...xphysmem=": not the field; look further as the regex does
    else:
        m = _PHYSMEM_VALUE.match(status, i + 8) if i >= 0 else None
    if m is None:
        return 0
    raw = m.group(1) + (m.group(2) or "b")
    mb = cache.get(raw)
    if mb is None:
        mb = cache[raw] = parse_mem_mb(raw)
    return mb


def normalize_nodes(records: Iterable[Record], warnings: list[str] | None = None) -> list[NodeInfo]:
    out = []
    states: dict[str, str] = {}
    mem_cache: dict[str, int] = {}
    for rec in records:
        name = rec.get("name", "")
        if not name:
            continue
        native = rec.get("state", "")
        state = states.get(native)
        if state is None:
            state = states[native] = torque_node_state(native, name, warnings)
        np = int(rec["np"]) if rec.get("np", "").isdigit() else 0
        jobs, used = parse_node_jobs(rec.get("jobs", ""))
        if state == "free" and np and used >= np:
            state = "busy"
        features, instance = split_properties(rec.get("properties", ""))
        memory = _physmem_mb(rec.get("status", ""), mem_cache)
        gpus = int(rec["gpus"]) if rec.get("gpus", "").isdigit() else 0
        out.append({"name": name, "state": state, "cores": np, "cores_used": min(used, np) if np else used,
                    "jobs": jobs, "native_state": native, "instance_id": instance, "memory_mb": memory, "gpus": gpus,
                    "features": features})
    return validate_nodes(out)


_NODE_TAGS = ("name", "state", "np", "jobs", "properties", "note", "gpus", "status")
_NODE_OPENS = tuple((f"<{tag}>", len(tag) + 2, tag) for tag in _NODE_TAGS)


def scan_node_records(xml: str | bytes) -> list[Record]:
    """``pbsnodes -x`` → flat records of the fields the sensor uses, with no element tree: the
    document is split at each ``<Node>`` and each field found with ``str.find`` (a field is
    text up to the next tag, which must be a closing one; ``scan_node_records_plain`` is the
    regular-expression form it replaces, kept as the reference the tests compare with).
    Output that does not end its ``<Data>`` document raises ``ValueError`` (cut short)."""
    data = (xml.decode("utf-8", "replace") if isinstance(xml, bytes) else xml).strip()
    if not data:
        return []
    if not data.endswith("</Data>"):
        raise ValueError("pbsnodes XML is not a complete <Data> document (output cut short?)")
    out = []
    chunks = data.split("<Node>")
    for k in range(1, len(chunks)):
        chunk = chunks[k]
        end = chunk.find("</Node>")
        if end < 0:
            continue
        find = chunk.find
        rec: Record = {}
        for open_tag, skip, tag in _NODE_OPENS:
            i = find(open_tag, 0, end)
            if i < 0:
                continue
            i += skip
            j = find("<", i, end + 1)
            if chunk[j + 1] == "/":
                value = chunk[i:j]
                rec[tag] = html.unescape(value) if "&" in value else value
        out.append(rec)
    return out


_NODE_SCAN = re.compile(r"<Node>(.*?)</Node>", re.S)
_NODE_FIELDS = re.compile(r"<(name|state|np|jobs|properties|note|gpus|status)>([^<]*)</")


def scan_node_records_plain(xml: str | bytes) -> list[Record]:
    """The reference form of ``scan_node_records``: one regular-expression pass per node."""
    data = (xml.decode("utf-8", "replace") if isinstance(xml, bytes) else xml).strip()
    if not data:
        return []
    if not data.endswith("</Data>"):
        raise ValueError("pbsnodes XML is not a complete <Data> document (output cut short?)")
    return [{k: _text(v) for k, v in _NODE_FIELDS.findall(node)} for node in _NODE_SCAN.findall(data)]


def parse_pbsnodes(xml: str | bytes, warnings: list[str] | None = None) -> list[NodeInfo]:
    return normalize_nodes(scan_node_records(xml), warnings)


_JOB_CHUNK = re.compile(r"<Job>(.*?)</Job>", re.S)
_JOB_FIELD = re.compile(r"<(Job_Id|job_state|exec_host)>([^<]*)</")


def jobs_on_node(xml: str, node: str) -> list[str]:
    """Ids of the jobs ``qstat -f -x`` lists on ``node`` (an ``exec_host`` entry ``node/N`` or
    ``node.domain/N``), except completed ones (``C`` keeps its ``exec_host``). Raises on output
    that is cut short (no closing ``</Data>``): an unreadable list is not an empty one."""
    text = (xml or "").strip()
    if text and not text.endswith("</Data>"):
        raise ValueError("qstat XML cut short (no closing </Data>)")
    want = node.split(".")[0].lower()
    out = []
    for chunk in _JOB_CHUNK.finditer(text):
        fields = dict(_JOB_FIELD.findall(chunk.group(1)))
        if fields.get("job_state", "") == "C":
            continue
        hosts = {h.split("/")[0].split(".")[0].lower() for h in fields.get("exec_host", "").split("+") if h}
        if want in hosts:
            out.append(fields.get("Job_Id", "?"))
    return out
