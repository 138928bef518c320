"""HTCondor read through the command-line tools: ``condor_q``/``condor_status -af:tr`` text.

Why: reading 100,000 job ads through the Python bindings costs ~1 s of CPU before any work is
done (a ClassAd object per ad and a C call per attribute). Asked with ``-autoformat`` (``-af``),
the tools print one line per ad — the requested attributes in order — and the line is split
in one pass like Slurm's ``squeue -O`` text (``slurm/text.py``).

The format (HTCondor's ``parse_autoformat_args`` and ``AttrListPrintMask``): ``-af:tr`` prints
each ad as one line, its attributes separated by a tab (``t``), each as its **raw**
expression (``r``): the text ``condor_q -long`` would print after ``Attr =``, unevaluated,
in old ClassAd syntax (strings quoted; ``RequestMemory`` may be an expression; an attribute
the ad lacks prints as ``undefined``). Raw, not evaluated, because ``Requirements`` is matched
against the worker template (evaluated without one it is meaningless) and expressions are
evaluated in the ad exactly as the bindings path does.

The attributes that differ from one job (slot) to the next of the same request come first
(``ClusterId ProcId QDate`` and the owner, ``Owner AcctGroup AccountingGroup``; ``Name Machine
EPUInstanceId JobId EnteredCurrentState``): a line is split only up to them, and the rest of
the line, as printed, is the group key. Each distinct rest is interpreted once, from an ad
rebuilt from the line's raw text with the old ClassAd parser (the inverse of what the tool
printed), through the same functions as the bindings path (``parse._interpret_job`` /
``parse._interpret_slot``), so both paths give the same shapes and nodes for the same ads. A
line whose field count is wrong (a value with a tab in it) is skipped with a warning naming it;
``-- `` banner lines (``condor_q -global``) and blank lines are ignored.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from epu.common.messages import NodeInfo, QueuedJob
from epu.services.sensor.htcondor.parse import (
    IDENTITY_ATTRIBUTE,
    JOB_PROJECTION,
    OWNER_ATTRIBUTES,
    STARTD_PROJECTION,
    CondorJobs,
    Owners,
    TemplateMatch,
    _int,
    _interpret_job,
    _interpret_slot,
    add_slot,
    emit_groups,
    machine_nodes,
    value,
)
from epu.services.sensor.reasons import ReasonCache
from epu.services.sensor.shapes import ShapeGrouper, short_hostname

JOB_VARYING = ("ClusterId", "ProcId", "QDate", *OWNER_ATTRIBUTES)
SLOT_VARYING = ("Name", "Machine", IDENTITY_ATTRIBUTE, "JobId", "EnteredCurrentState")
#: The attributes asked of ``condor_q -af:tr``, in this order (the per-job ones first).
JOB_AF: tuple[str, ...] = JOB_VARYING + tuple(a for a in JOB_PROJECTION if a not in JOB_VARYING)
#: The attributes asked of ``condor_status -af:tr``, in this order (the per-slot ones first).
STARTD_AF: tuple[str, ...] = SLOT_VARYING + tuple(a for a in STARTD_PROJECTION if a not in SLOT_VARYING)
UNDEFINED = "undefined"
#: At most this many malformed lines are named in the warnings (the count is always given).
MAX_NAMED_BAD_LINES = 3


def condor_q_argv(exe: str, constraint: str, *, pool: str | None = None, schedd: str | None = None) -> list[str]:
    """``condor_q`` for every user's jobs matching ``constraint``, on the named schedd or on
    every schedd of the pool (``-global``), as ``-af:tr`` lines of ``JOB_AF``."""
    argv = [exe, "-allusers"]
    argv += ["-name", schedd] if schedd else ["-global"]
    if pool:
        argv += ["-pool", pool]
    return [*argv, "-constraint", constraint, "-af:tr", *JOB_AF]


def condor_status_argv(exe: str, *, pool: str | None = None) -> list[str]:
    """``condor_status`` (slot ads, its default query) as ``-af:tr`` lines of ``STARTD_AF``."""
    argv = [exe]
    if pool:
        argv += ["-pool", pool]
    return [*argv, "-af:tr", *STARTD_AF]


def line_ad(attrs: Sequence[str], fields: Sequence[str]) -> Any:
    """The ad one ``-af:r`` line stands for: each raw value parsed back with the old ClassAd
    parser (the syntax the tool printed it in); ``undefined`` values left out, as absent."""
    import classad2  # noqa: PLC0415 — the bindings' ClassAd library, as the bindings path uses

    text = "\n".join(f"{a} = {v}" for a, v in zip(attrs, fields, strict=True) if v != UNDEFINED)
    return classad2.parseOne(text + "\n", classad2.ParserType.Old) if text else classad2.ClassAd()


def raw_str(text: str) -> Any:
    """A string attribute's raw text → its value: a plain quoted literal directly, ``undefined``
    → None, anything else (escapes, expressions, other types) evaluated as the bindings would."""
    if len(text) >= 2 and text[0] == '"' and text[-1] == '"' and "\\" not in text:
        return text[1:-1]
    if text == UNDEFINED:
        return None
    return value(line_ad(("x",), (text,)), "x")


def raw_int(text: str) -> int:
    """An integer attribute's raw text → its value (0 when undefined or not an integer)."""
    if text.isdigit():
        return int(text)
    if text == UNDEFINED:
        return 0
    return _int(line_ad(("x",), (text,)), "x", 0)


class BadLines:
    """Counts malformed lines and names the first few in one warning."""

    def __init__(self, tool: str, width: int) -> None:
        self.tool, self.width, self.count, self.named = tool, width, 0, []  # type: ignore[var-annotated]

    def add(self, line: str) -> None:
        self.count += 1
        if len(self.named) < MAX_NAMED_BAD_LINES:
            self.named.append(line[:200])

    def report(self, warnings: list[str]) -> None:
        if self.count:
            warnings.append(f"htcondor: {self.count} {self.tool} -af line(s) without the {self.width} tab-separated "
                            f"fields asked for (a value with a tab in it?) ignored; first: {self.named!r}")


def _skip(line: str) -> bool:
    return not line or line.startswith("-- ")


def normalize_job_lines(text: str, now: float, warnings: list[str] | None = None,
                        grouper: ShapeGrouper | None = None,
                        template: Mapping[str, Any] | None = None) -> CondorJobs:
    """``condor_q -af:tr JOB_AF`` output → shapes (see the module docstring). Per job: one split
    up to the per-job attributes, one dict lookup of the rest, a count and a comparison."""
    out = CondorJobs(grouper=grouper or ShapeGrouper(), warnings=warnings if warnings is not None else [])
    reasons = ReasonCache("htcondor", out.warnings)
    match = TemplateMatch(template)
    groups: dict[str, list] = {}  # rest of the line → [interpretation, jobs, earliest QDate, first job ids]
    sample = out.sample
    sample_size = out.sample_size
    width = len(JOB_AF)
    bad = BadLines("condor_q", width)
    running = finished = 0
    owners = Owners()
    per_job = len(JOB_VARYING)
    for line in text.split("\n"):
        parts = line.split("\t", per_job)
        if len(parts) != per_job + 1:
            if not _skip(line):
                bad.add(line)
            continue
        cluster, proc, qd, user, acct_group, accounting_group, rest = parts
        g = groups.get(rest)
        if g is None:
            fields = line.split("\t")
            if len(fields) != width:
                bad.add(line)
                continue
            g = groups[rest] = [_interpret_job(line_ad(JOB_AF, fields), now, reasons, match), 0, 0, []]
        seen = g[0]
        kind = seen[0]
        if kind != "pending":
            if kind == "running":
                running += 1
                owner = owners(raw_str(user), raw_str(acct_group), raw_str(accounting_group))
                if owner is not None:
                    out.owners[f"{raw_int(cluster)}.{raw_int(proc)}"] = owner
            elif kind == "finished":
                finished += 1
            else:
                out.unknown_states.append(seen[1])
            continue
        g[1] += 1
        qdate = int(qd) if qd.isdigit() else raw_int(qd)
        if qdate and (qdate < g[2] or not g[2]):
            g[2] = qdate
        ids = g[3]
        if len(ids) < 3 or len(sample) < sample_size:
            job_id = f"{raw_int(cluster)}.{raw_int(proc)}"
            if len(ids) < 3:
                ids.append(job_id)
            if len(sample) < sample_size:
                _, _shape, state, nodes, cores, mem = seen
                wait = max(0.0, now - qdate) if qdate else 0.0
                sample.append(QueuedJob(job_id=job_id, cores=cores, nodes=nodes, memory_mb=mem,
                                        submit_time=float(qdate), wait_seconds=wait, state=state))
    out.running += running
    out.finished += finished
    bad.report(out.warnings)
    return emit_groups(out, groups, now)


def normalize_slot_lines(text: str, warnings: list[str] | None = None) -> list[NodeInfo]:
    """``condor_status -af:tr STARTD_AF`` output → one node per machine (see the module
    docstring): per slot one split up to the attributes that name it and one dict lookup."""
    machines: dict[str, dict[str, Any]] = {}
    interpreted: dict[str, tuple] = {}
    short_names: dict[str, str] = {}
    width = len(STARTD_AF)
    bad = BadLines("condor_status", width)
    for line in text.split("\n"):
        parts = line.split("\t", 5)
        if len(parts) != 6:
            if not _skip(line):
                bad.add(line)
            continue
        name_t, machine_t, instance_t, job_t, since_t, rest = parts
        machine = short_names.get(machine_t)  # slots of one machine print the same Machine text
        if machine is None:
            machine = short_hostname(str(raw_str(machine_t) or str(raw_str(name_t) or "").split("@")[-1]))
            if machine_t != UNDEFINED:  # else the name came from this slot's Name
                short_names[machine_t] = machine
        if not machine:
            continue
        slot = interpreted.get(rest)
        if slot is None:
            fields = line.split("\t")
            if len(fields) != width:
                bad.add(line)
                continue
            slot = interpreted[rest] = _interpret_slot(line_ad(STARTD_AF, fields), machine, warnings)
        job = raw_str(job_t) if slot[0] != "Partitionable" and slot[6] in ("busy", "offline") else None
        add_slot(machines, machine, slot, raw_str(instance_t), job,
                 int(since_t) if since_t.isdigit() else raw_int(since_t))
    if warnings is not None:
        bad.report(warnings)
    return machine_nodes(machines)


def render(ads: Iterable[Any], attrs: Sequence[str]) -> str:
    """What ``-af:tr attrs`` prints for ``ads`` (classad2 ads): each attribute's old-syntax
    text as ``printOld`` (``condor_q -long``) writes it, ``undefined`` when absent — the
    inverse of the readers above, for tests and the benchmark."""
    lines = []
    for ad in ads:
        raw: dict[str, str] = {}
        for row in ad.printOld().split("\n"):
            name, sep, text = row.partition(" = ")
            if sep:
                raw[name.lower()] = text  # attribute names are case-insensitive
        lines.append("\t".join(raw.get(a.lower(), UNDEFINED) for a in attrs))
    return "\n".join(lines) + ("\n" if lines else "")
