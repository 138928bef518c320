"""Slurm's text output, asked for only the fields EPU needs (the fast read path).

Why text and not ``--json``: a real Slurm 22.05 ``squeue --json`` record is ~2.7 KB with 111
keys per job (tests/sensor/fixtures/slurm/squeue_22.05_real_record.json), so 100,000 pending
jobs are ~270 MB of JSON that take seconds to produce and seconds to decode. ``squeue -O``
with the 21 fields below is ~100 bytes per job, produced many times faster, and parsed here
in one pass that groups pending jobs into shapes as it reads them (one split and one dict
update per line; each distinct field value is interpreted once, through small caches).

Every field is printed at full width (``field:0``) and followed by the ASCII unit separator
(``\\x1f``), which no Slurm value contains; the pending reason comes last because it is free
text.

The one thing text cannot give exactly is the reason enum: ``squeue`` prints the job's
``state_desc`` when slurmctld set one (e.g. ``Nodes required for job are DOWN, DRAINED or
reserved for jobs in higher priority partitions`` for a job whose ``state_reason`` is
``Resources``). ``STATE_DESC_REASONS`` maps the descriptions slurmctld 22.05–24.x writes to
their reason; a job whose text is neither a known reason nor a known description is read again
with ``squeue --json --jobs=...`` (bounded, see the backend), so its reason is exact.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from epu.common.messages import QueuedJob
from epu.services.sensor.reasons import SLURM_REASONS, ReasonCache
from epu.services.sensor.shapes import ShapeGrouper
from epu.services.sensor.slurm.parse import (
    LicenseFree,
    SlurmJobs,
    SlurmNodeRecord,
    count_array_tasks,
    gres_gpus,
    instance_from_comment,
    license_blocked,
    parse_mem_mb,
    parse_time_limit,
    split_features,
    state_of,
    tres_value,
)
from epu.services.sensor.states import SLURM_JOB_STATES, slurm_state_tokens

SEP = "\x1f"

#: Per-job fields first (the owner, account and user, among them: jobs of one shape may have
#: different owners), then the state, then the request and the reason: a pending line is split
#: only up to the state, and the rest of the line (the request and the reason, the same text
#: for every job of a shape) is the grouping key as printed.
SQUEUE_FIELDS = ("jobid", "arrayjobid", "arraytaskid", "pendingtime", "prioritylong", "nodelist", "account",
                 "username", "state",
                 "numnodes", "numcpus", "mincpus", "minmemory", "tres-alloc", "tres-per-node", "tres-per-job",
                 "feature", "partition", "timelimit", "licenses", "reason")
_PER_JOB = 9  # fields before the request: jobid .. state
_STATE = _PER_JOB - 1
_PARTITION = SQUEUE_FIELDS.index("partition") - _PER_JOB  # its place in the rest of the line
SINFO_FIELDS = ("NodeList", "StateComplete", "CPUsState", "Memory", "AllocMem", "Gres", "GresUsed",
                "features_act", "Partition", "Comment", "Timestamp", "Reason")


def long_format(fields: Iterable[str]) -> str:
    """``-O`` argument: every field full width, separated by ``SEP``, the last one free text."""
    names = list(fields)
    return ",".join([f"{name}:0{SEP}" for name in names[:-1]] + [f"{names[-1]}:0"])


def squeue_argv() -> list[str]:
    return ["--noheader", "--all", "-O", long_format(SQUEUE_FIELDS)]


def sinfo_argv() -> list[str]:
    return ["--noheader", "--all", "--Node", "-O", long_format(SINFO_FIELDS)]


#: ``state_desc`` texts slurmctld writes for pending jobs (src/slurmctld, 22.05–24.x) → reason.
#: Matched by prefix; the reason decides demand exactly as the enum would.
STATE_DESC_REASONS: tuple[tuple[str, str], ...] = (
    ("Nodes required for job are DOWN, DRAINED or reserved for jobs in higher priority partitions", "Resources"),
    ("ReqNodeNotAvail", "ReqNodeNotAvail"),
    ("Job is at or exceeds QOS", "QOSResourceLimit"),
    ("Job is at or exceeds association", "AssociationResourceLimit"),
    ("Reservation ", "ReservationDeleted"),
)


def reason_of(text: str) -> str | None:
    """The reason enum behind squeue's reason column, or None when only ``--json`` can tell."""
    text = text.strip()
    head = re.match(r"[^,(\s]+", text)
    word = head.group(0) if head else "None"
    if word in SLURM_REASONS and (len(word) == len(text) or text[len(word)] in ",( "):
        return word
    for prefix, reason in STATE_DESC_REASONS:
        if text.startswith(prefix):
            return reason
    return None


@dataclass
class TextRead:
    """What one pass over ``squeue -O`` gives: the jobs, and the ids whose reason text is a
    description no table knows (to be read again as JSON)."""

    jobs: SlurmJobs
    unexplained: list[str] = field(default_factory=list)


class _Request:
    """Interprets one distinct request (the fields that decide a shape) once."""

    __slots__ = ("cache",)

    def __init__(self) -> None:
        self.cache: dict[tuple[str, ...], tuple] = {}

    def __call__(self, r: list[str]) -> tuple:
        """``r``: the request fields numnodes .. licenses (11 strings)."""
        key = tuple(r[:11])
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        nodes = max(1, _int(r[0]) or 1)
        cpus = max(1, _int(r[1]) or 1)
        per_node = max(_int(r[2]) or 1, -(-cpus // nodes))
        memory = 0
        if parse_mem_mb(r[3]):
            # MinMemory loses whether it is per CPU or per node; the TRES request says the total.
            total = parse_mem_mb(tres_value(r[4], "mem"))
            memory = -(-total // nodes) if total else parse_mem_mb(r[3])
        gpus = gres_gpus(r[5])
        if not gpus:
            per_job = gres_gpus(r[6]) or _int(tres_value(r[4], "gres/gpu"))
            gpus = -(-per_job // nodes) if per_job else 0
        hit = self.cache[key] = (nodes, per_node, memory, gpus, split_features(r[7]), r[8], parse_time_limit(r[9]),
                                 r[10])
        return hit


class _Owners:
    """A running job's [account, user, partition] for cost accounting (``SlurmJobs.owners``),
    as the ``--json`` read gives them. squeue prints ``(null)`` for an account a job does not
    have (no accounting): "" as in the JSON. Jobs of one owner and partition share one list,
    built once (the snapshot only reads it)."""

    __slots__ = ("cache",)

    def __init__(self) -> None:
        self.cache: dict[tuple[str, str, str], list[str]] = {}

    def __call__(self, account: str, user: str, rest: str) -> list[str]:
        r = rest.split(SEP, _PARTITION + 1)
        partition = r[_PARTITION] if len(r) > _PARTITION else ""
        key = (account, user, partition)
        hit = self.cache.get(key)
        if hit is None:
            hit = self.cache[key] = [_text(account), _text(user), _text(partition)]
        return hit


def _text(value: str) -> str:
    return "" if value in ("(null)", "N/A") else value


def _int(text: str) -> int:
    return int(text) if text.isdigit() else 0


def parse_squeue_text(text: str, warnings: list[str] | None = None, grouper: ShapeGrouper | None = None,
                      sample_size: int = 200, licenses: LicenseFree | None = None) -> TextRead:
    """``squeue -O <SQUEUE_FIELDS>`` → shapes, running jobs per node, and unexplained reasons.

    One pass: a pending line is split only up to its state; the rest of the line (request and
    reason, as printed) is counted under itself. Each distinct rest is interpreted once at the
    end (request, reason, demand) and added to the shapes with its count. Only array records
    (``1-100%10``) and the first ``sample_size`` jobs get per-job work. ``licenses`` is read
    only if a request that looks like demand asks for licenses (``parse.license_blocked``)."""
    jobs = SlurmJobs(grouper=grouper or ShapeGrouper(), warnings=warnings if warnings is not None else [],
                     sample_size=sample_size)
    read = TextRead(jobs)
    raw: dict[tuple[str, bool], list] = {}  # (rest of line, held) → [count, max wait, ids]
    pending_states = {state for state, d in SLURM_JOB_STATES.items() if d in ("queued", "held")}
    held_states = {state for state, d in SLURM_JOB_STATES.items() if d == "held"}
    running_states = {state for state, d in SLURM_JOB_STATES.items() if d == "running"}
    sample_lines: list[list[str]] = []
    owner = _Owners()
    for line in text.split("\n"):
        if not line:
            continue
        f = line.split(SEP, _PER_JOB)
        if len(f) != _PER_JOB + 1:
            jobs.warnings.append(f"slurm: squeue line with too few fields: {line[:200]!r}")
            continue
        state = f[_STATE]
        if state in pending_states:
            task = f[2]
            count = 1 if task == "N/A" or task.isdigit() else count_array_tasks(task)
            key = (f[_PER_JOB], f[4] == "0" or state in held_states)  # priority 0 or REQUEUE_HOLD...: held
            wait = int(f[3]) if f[3].isdigit() else 0
            g = raw.get(key)
            if g is None:
                raw[key] = [count, wait, [_job_id(f)]]
            else:
                g[0] += count
                if wait > g[1]:
                    g[1] = wait
                if len(g[2]) < 3:
                    g[2].append(_job_id(f))
            if len(sample_lines) < sample_size:
                sample_lines.append(f)
        elif state in running_states:
            jobs.add_running(_job_id(f), f[5], owner(f[6], f[7], f[_PER_JOB]))
        elif state in SLURM_JOB_STATES:
            jobs.finished += 1
        else:
            jobs.unknown_states.append(state)
    reasons = ReasonCache("slurm", jobs.warnings)
    request = _Request()
    verdicts: dict[tuple[str, bool], tuple | None] = {}
    for key, (count, wait, ids) in raw.items():
        v = verdicts[key] = _interpret(key, reasons, request, jobs.warnings, licenses)
        if v is None:
            continue
        nodes, cores, memory, gpus, features, partition, limit, demand, reason, cls = v
        for i, job_id in enumerate(ids):
            jobs.grouper.add(nodes=nodes, cores=cores, memory_mb=memory, gpus=gpus, features=features,
                             partition=partition, time_limit_s=limit, demand=demand, reason=reason,
                             reason_class=cls, wait_s=float(wait), job_id=job_id,
                             count=count - len(ids) + 1 if i == 0 else 1)
    if any(v is None for v in verdicts.values()):
        # jobs whose reason text only --json can explain: collect all their ids (one more pass)
        for line in text.split("\n"):
            f = line.split(SEP, _PER_JOB)
            if (len(f) == _PER_JOB + 1 and f[_STATE] in pending_states
                    and verdicts.get((f[_PER_JOB], f[4] == "0" or f[_STATE] in held_states), 0) is None):
                read.unexplained.append(f[0])
    for f in sample_lines:
        v = verdicts.get((f[_PER_JOB], f[4] == "0" or f[_STATE] in held_states))
        if v is None:
            continue
        nodes, cores, memory, gpus, features, partition, limit, demand, reason, cls = v
        task = f[2]
        jobs.sample.append(QueuedJob(job_id=_job_id(f), cores=cores, nodes=nodes, memory_mb=memory, queue=partition,
                                     wait_seconds=float(int(f[3]) if f[3].isdigit() else 0),
                                     state=state_of(demand, cls),  # type: ignore[arg-type]
                                     count=1 if task == "N/A" or task.isdigit() else count_array_tasks(task)))
    return read


def _job_id(f: list[str]) -> str:
    task = f[2]
    if task == "N/A":
        return f[0]
    return f"{f[1]}_{task}" if task.isdigit() else f"{f[1]}_[{task}]"


def _interpret(key: tuple[str, bool], reasons: ReasonCache, request: _Request,
               warnings: list[str], licenses: LicenseFree | None = None) -> tuple | None:
    """A grouping key → (nodes, cores, memory, gpus, features, partition, limit, demand,
    reason, class); None when the reason text is a description only ``--json`` can explain."""
    rest, held = key
    r = rest.split(SEP)
    if len(r) != len(SQUEUE_FIELDS) - _PER_JOB:
        warnings.append(f"slurm: squeue request with {len(r)} fields: {rest[:200]!r}")
        return None
    word = reason_of(r[-1])
    if word is None:
        return None
    verdict = reasons(word)
    demand, reason, cls = verdict.demand, verdict.reason, verdict.reason_class
    if demand and held:  # priority 0, or a held state (REQUEUE_HOLD, SPECIAL_EXIT...)
        demand, cls = False, "held"
    nodes, cores, memory, gpus, features, partition, limit, wanted = request(r)
    if demand and license_blocked(wanted, licenses):
        demand, reason, cls = False, "Licenses", "limit"
    return nodes, cores, memory, gpus, features, partition, limit, demand, reason, cls


# ------------------------------------------------------------------ nodes
_TIME_CACHE: dict[str, float | None] = {}


def _epoch(text: str) -> float | None:
    if text in _TIME_CACHE:
        return _TIME_CACHE[text]
    try:
        value: float | None = time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        value = None
    if len(_TIME_CACHE) < 100_000:
        _TIME_CACHE[text] = value
    return value


def parse_sinfo_text(text: str) -> list[SlurmNodeRecord]:
    """``sinfo -N -O <SINFO_FIELDS>`` → one record per node (a node in several partitions is
    listed once per partition; the partitions are merged)."""
    records: dict[str, SlurmNodeRecord] = {}
    tokens_cache: dict[str, tuple[str, ...]] = {}
    gpu_cache: dict[str, int] = {}
    feature_cache: dict[str, tuple[str, ...]] = {}
    n_fields = len(SINFO_FIELDS)
    for line in text.split("\n"):
        if not line:
            continue
        f = line.split(SEP, n_fields - 1)
        if len(f) != n_fields:
            continue
        name = f[0]
        partition = f[8].rstrip("*")
        prev = records.get(name)
        if prev is not None:
            if partition and partition not in prev.partitions:
                prev.partitions = tuple(sorted({*prev.partitions, partition}))
            continue
        tokens = tokens_cache.get(f[1])
        if tokens is None:
            tokens = tokens_cache[f[1]] = tuple(slurm_state_tokens(f[1]))
        cpus_state = f[2].split("/")
        alloc = int(cpus_state[0]) if cpus_state[0].isdigit() else 0
        total = int(cpus_state[-1]) if cpus_state[-1].isdigit() else 0
        reason = f[11] if f[11] not in ("none", "(null)") else ""
        gpus = gpu_cache.get(f[5])
        if gpus is None:
            gpus = gpu_cache[f[5]] = gres_gpus(f[5])
        used = gpu_cache.get(f[6])
        if used is None:
            used = gpu_cache[f[6]] = gres_gpus(f[6])
        features = feature_cache.get(f[7])
        if features is None:
            features = feature_cache[f[7]] = tuple(sorted({x for x in f[7].split(",") if x and x != "(null)"}))
        comment = f[9]
        records[name] = SlurmNodeRecord(
            name, tokens, total, alloc, reason, _epoch(f[10]) if reason else None,
            memory_mb=_int(f[3]), alloc_memory_mb=_int(f[4]), gpus=gpus, gpus_used=used, features=features,
            partitions=(partition,) if partition else (),
            instance_id=instance_from_comment(comment) if "epu:" in comment else None)
    return list(records.values())
