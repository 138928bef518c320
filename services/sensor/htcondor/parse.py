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
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from epu.common.columns import validate_nodes
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

#: Whose a job is, for cost accounting (``owners``): the submitter, and the accounting group
#: ``condor_submit`` writes for ``accounting_group`` (``AcctGroup``; ``AccountingGroup`` is
#: ``<group>.<user>``, or whatever a ``+AccountingGroup`` line set).
OWNER_ATTRIBUTES = ("Owner", "AcctGroup", "AccountingGroup")
JOB_PROJECTION = ["ClusterId", "ProcId", "JobStatus", "RequestCpus", "RequestMemory", "RequestGpus", "RequestDisk",
                  "QDate", "JobUniverse", "MachineCount", "MinHosts", "HoldReasonCode", "DeferralTime",
                  "AllowedJobDuration", "Requirements", *OWNER_ATTRIBUTES]
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

    owners: dict[str, list[str]] = field(default_factory=dict)
    """Running job ("cluster.proc", as slots name it in ``JobId``) → [account, user, ""]
    (HTCondor has no partitions; cost accounting)."""


class Owners:
    """A running job's [account, user, partition] from its ``OWNER_ATTRIBUTES``: the user is
    ``Owner``; the account is ``AcctGroup``, else ``AccountingGroup`` without the trailing
    ``.<Owner>`` (``group_physics.alice`` → ``group_physics``), else "". Jobs with the same
    attributes share one list, built once (the snapshot only reads it); None when all are
    absent."""

    __slots__ = ("cache",)

    def __init__(self) -> None:
        self.cache: dict[tuple[Any, Any, Any], list[str] | None] = {}

    def __call__(self, user: Any, acct_group: Any, accounting_group: Any) -> list[str] | None:
        key = (user, acct_group, accounting_group)
        if key in self.cache:
            return self.cache[key]
        who = str(user) if user is not None else ""
        account = str(acct_group) if acct_group else ""
        if not account and accounting_group:
            account = str(accounting_group)
            if who and account.endswith("." + who):
                account = account[:-len(who) - 1]
        owner = self.cache[key] = [account, who, ""] if account or who else None
        return owner


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


#: Job attributes that differ from one job to the next of the same request: left out of the
#: text a job is grouped by, and read per job.
_JOB_VARYING = re.compile(r"^(ClusterId|ProcId|QDate|Owner|AcctGroup|AccountingGroup) = (.*)\n", re.M)


def split_old(ad: Mapping[str, Any], varying: re.Pattern[str]) -> tuple[Any, dict[str, str]]:
    """(the ad's text without its ``varying`` attributes, their raw values): one C call
    (``printOld``) and one regular-expression split, where reading the attributes one by one
    costs ~0.35 µs each and ~5 µs to wrap an expression such as ``Requirements``. Ads with the
    same text are the same request; only the first of them is interpreted. A mapping without
    ``printOld`` (a plain dict) is its own group."""
    print_old = getattr(ad, "printOld", None)
    if print_old is None:
        return id(ad), {}
    parts = varying.split(print_old())
    return "".join(parts[0::3]), dict(zip(parts[1::3], parts[2::3], strict=True))


def _raw_int(raw: dict[str, str], ad: Mapping[str, Any], key: str) -> int:
    """An integer attribute from ``split_old``'s raw text, or read from the ad when it is not a
    plain integer literal (an expression, or a plain mapping)."""
    text = raw.get(key)
    if text is not None and text.isdigit():
        return int(text)
    return _int(ad, key, 0)


def _interpret_job(ad: Mapping[str, Any], now: float, reasons: ReasonCache, match: TemplateMatch) -> tuple:
    """("running" | "finished" | "unknown", status) or ("pending", shape fields, state word,
    nodes, cores, memory) for one job ad."""
    status = _int(ad, "JobStatus", -1)
    disposition = HTCONDOR_JOB_STATUS.get(status)
    if disposition is None:
        return ("unknown", status)
    if disposition in ("running", "finished"):
        return (disposition, status)
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
    shape = dict(nodes=nodes, cores=cores, memory_mb=mem, gpus=gpus, features=(), partition="",
                 time_limit_s=max(0, _int(ad, "AllowedJobDuration", 0)), demand=verdict.demand,
                 reason=verdict.reason, reason_class=verdict.reason_class)
    state = "queued" if verdict.demand else ("held" if verdict.reason_class == "held" else "blocked")
    return ("pending", shape, state, nodes, cores, mem)


def normalize_jobs(ads: Iterable[Mapping[str, Any]], now: float, warnings: list[str] | None = None,
                   grouper: ShapeGrouper | None = None, template: Mapping[str, Any] | None = None) -> CondorJobs:
    """Job ads → shapes. Ads are grouped by their text without the per-job attributes
    (``split_old``) as they are read, and each group is interpreted once (expressions
    evaluated, ``Requirements`` matched against the template): 100,000 jobs of a few hundred
    requests cost one ``printOld`` and one split each."""
    out = CondorJobs(grouper=grouper or ShapeGrouper(), warnings=warnings if warnings is not None else [])
    reasons = ReasonCache("htcondor", out.warnings)
    match = TemplateMatch(template)
    groups: dict[Any, list] = {}  # text → [interpretation, jobs, earliest QDate, first job ids]
    sample_size = out.sample_size
    owners = Owners()
    for ad in ads:
        ident, raw = split_old(ad, _JOB_VARYING)
        g = groups.get(ident)
        if g is None:
            g = groups[ident] = [_interpret_job(ad, now, reasons, match), 0, 0, []]
        seen = g[0]
        kind = seen[0]
        if kind != "pending":
            if kind == "running":
                out.running += 1
                owner = owners(*(_raw_str(raw, ad, a) for a in OWNER_ATTRIBUTES))
                if owner is not None:
                    out.owners[f"{_raw_int(raw, ad, 'ClusterId')}.{_raw_int(raw, ad, 'ProcId')}"] = owner
            elif kind == "finished":
                out.finished += 1
            else:
                out.unknown_states.append(seen[1])
            continue
        g[1] += 1
        qdate = _raw_int(raw, ad, "QDate")
        if qdate and (qdate < g[2] or not g[2]):
            g[2] = qdate
        if len(g[3]) < 3 or len(out.sample) < sample_size:
            job_id = f"{_raw_int(raw, ad, 'ClusterId')}.{_raw_int(raw, ad, 'ProcId')}"
            if len(g[3]) < 3:
                g[3].append(job_id)
            if len(out.sample) < sample_size:
                _, _shape, state, nodes, cores, mem = seen
                wait = max(0.0, now - qdate) if qdate else 0.0
                out.sample.append(QueuedJob(job_id=job_id, cores=cores, nodes=nodes, memory_mb=mem,
                                            submit_time=float(qdate), wait_seconds=wait, state=state))
    return emit_groups(out, groups, now)


def emit_groups(out: CondorJobs, groups: dict[Any, list], now: float) -> CondorJobs:
    """The pending groups of a read ([interpretation, jobs, earliest QDate, first job ids]) as
    shapes; shared by the bindings and the ``-af`` text readers."""
    for (seen, jobs, first, ids) in groups.values():
        if seen[0] == "pending":
            out.grouper.add_group(**seen[1], wait_s=max(0.0, now - first) if first else 0.0, count=jobs, job_ids=ids)
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


#: Slot attributes that name or identify one slot (left out of the text slots are grouped by).
_SLOT_VARYING = re.compile(r"^(Name|Machine|EPUInstanceId|JobId|EnteredCurrentState) = (.*)\n", re.M)


def _raw_str(raw: dict[str, str], ad: Mapping[str, Any], key: str) -> Any:
    """A string attribute from ``split_old``'s raw text (a plain quoted literal), else its value
    read from the ad (escapes, expressions, other types, plain mappings); None when absent."""
    text = raw.get(key)
    if text is not None and len(text) >= 2 and text[0] == '"' and text[-1] == '"' and "\\" not in text:
        return text[1:-1]
    return value(ad, key) if text is not None or not raw else None


def _interpret_slot(ad: Mapping[str, Any], machine: str, warnings: list[str] | None) -> tuple:
    """What a slot contributes to its machine, whatever its name: (slot type, memory, GPUs,
    native state, total cores, cores, state, partitionable cores)."""
    slot_type = str(value(ad, "SlotType", "") or "")
    memory = gpus = 0
    if slot_type != "Dynamic":
        memory = _int(ad, "TotalSlotMemory", 0) or _int(ad, "Memory", 0)
        gpus = _int(ad, "TotalSlotGpus", 0) or _int(ad, "Gpus", 0)
    native = f"{slot_type or 'Static'}:{value(ad, 'State', '')}/{value(ad, 'Activity', '')}"
    cpus = _int(ad, "Cpus", 0)
    partitionable = _int(ad, "TotalSlotCpus", cpus) if slot_type == "Partitionable" else 0
    return (slot_type, memory, gpus, native, _int(ad, "TotalCpus", 0), cpus, slot_state(ad, machine, warnings),
            partitionable)


def normalize_startds(ads: Iterable[Mapping[str, Any]], warnings: list[str] | None = None) -> list[NodeInfo]:
    """Slot ads → one node per machine. Slots are grouped by their text without the attributes
    that name them (``split_old``), so the state, cores and memory of identical slots are
    interpreted once; per slot only its name, identity, job and state time are read."""
    machines: dict[str, dict[str, Any]] = {}
    interpreted: dict[Any, tuple] = {}
    short_names: dict[str, str] = {}
    for ad in ads:
        ident, raw = split_old(ad, _SLOT_VARYING)
        name = str(_raw_str(raw, ad, "Machine") or str(_raw_str(raw, ad, "Name") or "").split("@")[-1])
        machine = short_names.get(name)
        if machine is None:
            machine = short_names[name] = short_hostname(name)
        if not machine:
            continue
        slot = interpreted.get(ident)
        if slot is None:
            slot = interpreted[ident] = _interpret_slot(ad, machine, warnings)
        add_slot(machines, machine, slot, _raw_str(raw, ad, IDENTITY_ATTRIBUTE), slot_job(slot, raw, ad),
                 _raw_int(raw, ad, "EnteredCurrentState"))
    return machine_nodes(machines)


def slot_job(slot: tuple, raw: dict[str, str], ad: Mapping[str, Any]) -> Any:
    """The slot's ``JobId`` when it can matter (a busy or offline static/dynamic slot), else None
    (not read)."""
    if slot[0] != "Partitionable" and slot[6] in ("busy", "offline"):
        return _raw_str(raw, ad, "JobId")
    return None


def add_slot(machines: dict[str, dict[str, Any]], machine: str, slot: tuple, instance: Any, job: Any,
             since: int) -> None:
    """Fold one slot (its interpretation, ``_interpret_slot``, and the attributes that name it)
    into its machine; shared by the bindings and the ``-af`` text readers."""
    slot_type, memory, gpus, native, total, cpus, state, partitionable = slot
    m = machines.get(machine)
    if m is None:
        m = machines[machine] = {"states": [], "cores": 0, "used": 0, "jobs": [], "since": None,
                                 "natives": set(), "total": 0, "memory": 0, "gpus": 0, "instance": None}
    if isinstance(instance, str) and instance:
        m["instance"] = instance
    m["memory"] += memory
    m["gpus"] += gpus
    m["natives"].add(native)
    if total > m["total"]:
        m["total"] = total
    if slot_type == "Partitionable":
        m["cores"] += partitionable
        if state is not None and state != "busy":
            m["states"].append(state)
    else:
        if slot_type != "Dynamic":
            m["cores"] += cpus
        if state is not None:
            m["states"].append(state)
        if state in ("busy", "offline"):
            m["used"] += cpus if job or state == "busy" else 0
            if job:
                m["jobs"].append(str(job))
    if since:
        m["since"] = max(m["since"] or 0, since)


def machine_nodes(machines: dict[str, dict[str, Any]]) -> list[NodeInfo]:
    """The folded machines (``add_slot``) as validated nodes, sorted by name."""
    out = []
    for name, m in sorted(machines.items()):
        cores = m["cores"] or m["total"]
        state = combine(s for s in m["states"] if s != "busy") or "free"
        if state == "free" and cores and m["used"] >= cores:
            state = "busy"
        if not m["states"]:
            state = "busy" if m["used"] else "free"
        out.append({"name": name, "state": state, "cores": cores,
                    "cores_used": min(m["used"], cores) if cores else m["used"], "jobs": sorted(m["jobs"]),
                    "state_since": float(m["since"]) if m["since"] else None,
                    "native_state": ",".join(sorted(m["natives"])), "instance_id": m["instance"],
                    "memory_mb": m["memory"], "gpus": m["gpus"]})
    return validate_nodes(out)
