"""Native batch states → the normalized ones. The single source of docs/sensor-states.md.

Why tables and not if-chains: every native state must be listed somewhere an operator can
read and check against their own cluster (``epu sensor snapshot``), and a state missing from
the table must be *visible* — it becomes ``unknown`` with a warning, never a crash and never a
silent ``free`` (CLUES once left Slurm ``MIXED`` unmapped and powered on nodes it did not need).

A native state is often a combination (Torque ``down,offline``, Slurm ``IDLE+DRAIN``,
``DOWN*``). Each token maps on its own to a normalized state or to ``None`` (a flag that
does not change availability, e.g. Slurm ``CLOUD``); the combination takes the strongest by
``PRECEDENCE``: down > offline > unknown > busy > free.

Normalized meaning: ``free`` = in service and can take work (it may already run some:
``cores_used``/``jobs`` say how much); ``busy`` = in service and full; ``offline`` = taken out
of service by an admin or by EPU (draining while it still runs jobs, drained when empty);
``down`` = not reachable / not usable; ``unknown`` = the sensor cannot tell.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

log = logging.getLogger("epu.sensor.states")

PRECEDENCE = {"down": 5, "offline": 4, "unknown": 3, "busy": 2, "free": 1}

# ------------------------------------------------------------------ Torque (pbsnodes <state>)
TORQUE_NODE_STATES: dict[str, str | None] = {
    "free": "free",
    "time-shared": "free",
    "job-exclusive": "busy",
    "job-sharing": "busy",
    "busy": "busy",
    "reserve": "busy",
    "offline": "offline",
    "down": "down",
    "state-unknown": "down",
    "unknown": "unknown",
    "MOM-list-not-sent": None,
    "UNKNOWN": "unknown",
}
TORQUE_NODE_NOTES = {
    "free": "has free slots (it may already run jobs)",
    "time-shared": "time-shared node, accepts jobs",
    "job-exclusive": "every slot taken (or an exclusive job)",
    "job-sharing": "runs jobs in shared mode, takes no more",
    "busy": "load above max_load",
    "reserve": "reserved by the scheduler",
    "offline": "pbsnodes -o: draining while it runs jobs, drained when empty",
    "down": "mom not reporting",
    "state-unknown": "server has not heard from the mom since it started",
    "unknown": "reported literally as unknown",
    "MOM-list-not-sent": "flag on a just-created node; the other tokens decide",
    "UNKNOWN": "reported literally as UNKNOWN",
}

#: Torque job_state → job disposition (queued/held/blocked are not running; running/finished are counted apart)
TORQUE_JOB_STATES: dict[str, str] = {
    "Q": "queued",
    "T": "queued",
    "H": "held",
    "W": "blocked",
    "R": "running",
    "E": "running",
    "S": "running",
    "B": "running",
    "C": "finished",
}
TORQUE_JOB_NOTES = {
    "Q": "queued: demand", "T": "in transit to its queue: demand",
    "H": "held (user/operator/system hold) — 'blocked' when it waits on a dependency (depend attribute)",
    "W": "waiting for its execution time (-a): never demand before then", "R": "running",
    "E": "exiting", "S": "suspended (holds its cores)", "B": "array parent with running elements",
    "C": "completed (kept for keep_completed): excluded",
}

# ------------------------------------------------------------------ Slurm (base state + flags)
SLURM_NODE_STATES: dict[str, str | None] = {
    # base states
    "IDLE": "free",
    "MIXED": "free",
    "ALLOCATED": "busy",
    "ALLOC": "busy",
    "DOWN": "down",
    "ERROR": "down",
    "FUTURE": "down",
    "UNKNOWN": "unknown",
    # flags
    "NOT_RESPONDING": "down",
    "COMPLETING": "busy",
    "DRAIN": "offline",
    "DRAINING": "offline",
    "DRAINED": "offline",
    "FAIL": "offline",
    "FAILING": "offline",
    "MAINTENANCE": "offline",
    "MAINT": "offline",
    "POWERED_DOWN": "offline",
    "POWER_DOWN": "offline",
    "POWERING_DOWN": "offline",
    "POWER_DRAIN": "offline",
    "REBOOT_REQUESTED": "offline",
    "REBOOT_ISSUED": "offline",
    "POWERING_UP": "down",
    "INVALID_REG": "down",
    "INVALID": "down",
    "CLOUD": None,
    "DYNAMIC_NORM": None,
    "DYNAMIC_FUTURE": "down",
    "DYNAMIC": None,
    "RESERVED": None,
    "PLANNED": None,
    "POWER_UP": None,
    "RESUME": None,
    "UNDRAIN": None,
    "BLOCKED": None,
    "REBOOT_CANCELED": None,
    "NO_RESPOND": "down",
    "PERFCTRS": None,
    "RES": None,
    # sinfo %t short forms
    "MIX": "free", "COMP": "busy", "DRNG": "offline", "FAILG": "offline", "FUTR": "down", "RESV": None,
    "PLND": None, "POW_DN": "offline", "POW_UP": "down", "UNK": "unknown", "NPC": None, "INVAL": "down",
    "BLOCK": None,
}
SLURM_NODE_NOTES = {
    "IDLE": "no jobs", "MIXED": "some cores allocated, some free", "ALLOCATED": "all cores allocated",
    "ALLOC": "short form of ALLOCATED",
    "DOWN": "unavailable", "ERROR": "in an error state", "FUTURE": "declared, not yet in service",
    "UNKNOWN": "slurmctld has not heard from it yet", "NOT_RESPONDING": "'*' suffix, e.g. DOWN*, IDLE*",
    "COMPLETING": "jobs finishing (epilog); e.g. IDLE+COMPLETING holds cores",
    "DRAIN": "no new jobs; e.g. IDLE+DRAIN (drained), MIXED+DRAIN (draining)",
    "DRAINING": "draining, still runs jobs", "DRAINED": "drained, empty",
    "FAIL": "failing: drains", "FAILING": "failing: drains", "MAINTENANCE": "'$' in a maintenance reservation",
    "MAINT": "short form of MAINTENANCE",
    "POWERED_DOWN": "'~' power-saved cloud/dynamic node, e.g. IDLE+CLOUD+POWERED_DOWN: not a worker",
    "POWER_DOWN": "'!' power down requested", "POWERING_DOWN": "'%' powering down",
    "POWER_DRAIN": "drain before power down",
    "REBOOT_REQUESTED": "'@' reboot pending", "REBOOT_ISSUED": "'^' rebooting",
    "POWERING_UP": "'#' being powered up, not usable yet", "INVALID_REG": "registered with a bad config",
    "INVALID": "invalid node", "CLOUD": "cloud node flag (state decided by the rest)",
    "DYNAMIC_NORM": "dynamic node (scontrol create nodename=...)", "DYNAMIC_FUTURE": "dynamic future slot",
    "DYNAMIC": "dynamic node flag",
    "RESERVED": "in an advanced reservation", "PLANNED": "'-' planned for a pending job",
    "POWER_UP": "power up requested", "RESUME": "resume requested", "UNDRAIN": "undrain requested",
    "BLOCKED": "blocked by a job (MCS)", "REBOOT_CANCELED": "reboot cancelled", "NO_RESPOND": "not responding",
    "PERFCTRS": "network performance counters in use", "RES": "short form of RESERVED",
    "MIX": "sinfo short form of MIXED", "COMP": "short form of COMPLETING", "DRNG": "short form of DRAINING",
    "FAILG": "short form of FAILING", "FUTR": "short form of FUTURE", "RESV": "short form of RESERVED",
    "PLND": "short form of PLANNED", "POW_DN": "short form of POWERED_DOWN", "POW_UP": "short form of POWERING_UP",
    "UNK": "short form of UNKNOWN", "NPC": "short form of PERFCTRS", "INVAL": "short form of INVALID",
    "BLOCK": "short form of BLOCKED",
}
#: sinfo/scontrol text suffixes → flag names (``DOWN*`` → DOWN + NOT_RESPONDING)
SLURM_SUFFIXES = {"*": "NOT_RESPONDING", "~": "POWERED_DOWN", "#": "POWERING_UP", "%": "POWERING_DOWN",
                  "!": "POWER_DOWN", "$": "MAINTENANCE", "@": "REBOOT_REQUESTED", "^": "REBOOT_ISSUED",
                  "-": "PLANNED"}

#: Slurm job_state → disposition; a PENDING job is demand or not by its reason (``reasons.py``)
SLURM_JOB_STATES: dict[str, str] = {
    "PENDING": "queued", "REQUEUED": "queued", "REQUEUE_FED": "queued",
    "REQUEUE_HOLD": "held", "RESV_DEL_HOLD": "held", "SPECIAL_EXIT": "held",
    "RUNNING": "running", "CONFIGURING": "running", "COMPLETING": "running", "SUSPENDED": "running",
    "STOPPED": "running", "RESIZING": "running", "SIGNALING": "running", "STAGE_OUT": "running",
    "COMPLETED": "finished", "CANCELLED": "finished", "FAILED": "finished", "TIMEOUT": "finished",
    "NODE_FAIL": "finished", "PREEMPTED": "finished", "BOOT_FAIL": "finished", "DEADLINE": "finished",
    "OUT_OF_MEMORY": "finished", "REVOKED": "finished",
}
# ------------------------------------------------------------------ HTCondor (startd State/Activity)
HTCONDOR_SLOT_STATES: dict[str, str | None] = {
    "Unclaimed": "free",
    "Backfill": "free",
    "Claimed": "busy",
    "Matched": "busy",
    "Preempting": "busy",
    "Owner": "offline",
    "Drained": "offline",
    "Delete": None,
}
HTCONDOR_SLOT_NOTES = {
    "Unclaimed": "idle slot", "Backfill": "runs backfill work that yields to real jobs: free",
    "Claimed": "runs a job (a partitionable slot's cores: TotalSlotCpus - Cpus)",
    "Matched": "matched, about to run a job", "Preempting": "evicting its job",
    "Owner": "START is false / owner using it: not available to EPU",
    "Drained": "drained by condor_drain (Activity Retiring while jobs finish)",
    "Delete": "dynamic slot being removed; ignored",
}
#: Activity values that mean the machine is draining whatever its State says
HTCONDOR_DRAINING_ACTIVITIES = frozenset({"Retiring"})
HTCONDOR_JOB_STATUS: dict[int, str] = {
    1: "queued", 2: "running", 3: "finished", 4: "finished", 5: "held", 6: "running", 7: "running",
}
HTCONDOR_JOB_NOTES = {1: "Idle", 2: "Running", 3: "Removed", 4: "Completed", 5: "Held",
                      6: "Transferring output", 7: "Suspended"}


def combine(states: Iterable[str]) -> str | None:
    best: str | None = None
    for s in states:
        if best is None or PRECEDENCE[s] > PRECEDENCE[best]:
            best = s
    return best


def normalize_tokens(tokens: Iterable[str], table: dict[str, str | None], system: str,
                     node: str = "", warnings: list[str] | None = None) -> str:
    """Map every token through ``table`` and combine. An unmapped token → ``unknown`` + warning."""
    mapped: list[str] = []
    toks = [t for t in tokens if t]
    for tok in toks:
        if tok in table:
            value = table[tok]
            if value is not None:
                mapped.append(value)
        else:
            msg = f"{system}: unmapped native node state {tok!r} (node {node or '?'}, full state " \
                  f"{'+'.join(toks)!r}); reporting 'unknown' — add it to services/sensor/states.py"
            log.warning(msg)
            if warnings is not None:
                warnings.append(msg)
            return "unknown"
    return combine(mapped) or ("free" if toks else "unknown")


def torque_node_state(native: str, node: str = "", warnings: list[str] | None = None) -> str:
    return normalize_tokens([t.strip() for t in native.split(",")], TORQUE_NODE_STATES, "torque", node, warnings)


def slurm_state_tokens(native: str | list[str], flags: Iterable[str] = ()) -> list[str]:
    """Tokens of a Slurm node state in any of its spellings: ``"IDLE+DRAIN"``, ``"DOWN*"``,
    ``"idle~"`` (sinfo), ``["IDLE", "DRAIN"]`` (sinfo --json ≥ 23.02), or ``"idle"`` plus
    ``state_flags`` (22.05)."""
    parts = list(native) if isinstance(native, list) else re.split(r"[+,]", native or "")
    tokens: list[str] = []
    for part in parts:
        part = part.strip()
        suffix_flags: list[str] = []
        while part and part[-1] in SLURM_SUFFIXES:
            suffix_flags.insert(0, SLURM_SUFFIXES[part[-1]])
            part = part[:-1]
        if part:
            tokens.append(part.upper())
        tokens.extend(suffix_flags)
    tokens.extend(f.upper() for f in flags)
    # preserve order, drop duplicates
    return list(dict.fromkeys(tokens))


def slurm_node_state(native: str | list[str], flags: Iterable[str] = (), node: str = "",
                     warnings: list[str] | None = None) -> str:
    return normalize_tokens(slurm_state_tokens(native, flags), SLURM_NODE_STATES, "slurm", node, warnings)
