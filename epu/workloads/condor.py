"""HTCondor history: ``condor_history -json`` (a JSON array of job ClassAds) as a workload.

Attributes read: ``ClusterId``/``ProcId`` (the id), ``QDate`` (submit), ``JobCurrentStartDate``
(else ``JobStartDate``: start of the run that completed), ``CompletionDate`` (end), else
``RemoteWallClockTime`` for the run time, ``RequestCpus``, ``MinHosts``/``MaxHosts`` (parallel
universe: nodes), ``AllowedJobDuration`` (a time limit, HTCondor 9.x+; else none), ``Owner``,
``JobStatus`` (4 = completed; 3 = removed). The command::

    condor_history -json -completedsince $(date -d '30 days ago' +%s) \\
        -af:j ... (or simply: condor_history -json > history.json)

Removed jobs that never ran, and ads without a submit or start time, are skipped and counted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from epu.workloads.model import TraceJob, Workload, WorkloadError
from epu.workloads.slurm import _finish, _skip
from epu.workloads.swf import open_text

STATUS = {1: "idle", 2: "running", 3: "removed", 4: "completed", 5: "held", 6: "transferring", 7: "suspended"}


def _num(ad: dict[str, Any], *keys: str) -> float | None:
    for k in keys:
        v = ad.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
            return float(v)
    return None


def read_condor_history(path: str | Path) -> Workload:
    try:
        with open_text(path) as f:
            data = json.load(f)
    except json.JSONDecodeError as exc:
        raise WorkloadError(f"{path}: not valid JSON: {exc}") from None
    return parse_condor_history(data, Path(path).stem, str(path))


def parse_condor_history(data: Any, name: str = "condor", source: str = "<condor_history -json>") -> Workload:
    if not isinstance(data, list):
        raise WorkloadError(f"{source}: condor_history -json prints a JSON array of job ads")
    rows: list[tuple[float, TraceJob]] = []
    skipped: dict[str, int] = {}
    for i, ad in enumerate(data):
        if not isinstance(ad, dict):
            raise WorkloadError(f"{source}: [{i}] is not a job ad (a JSON object)")
        status = STATUS.get(int(ad.get("JobStatus", 0) or 0), "")
        submit = _num(ad, "QDate")
        start = _num(ad, "JobCurrentStartDate", "JobStartDate")
        end = _num(ad, "CompletionDate")
        wall = _num(ad, "RemoteWallClockTime")
        if submit is None:
            _skip(skipped, "no QDate")
            continue
        if start is None:
            _skip(skipped, "never started")
            continue
        if status != "completed":
            _skip(skipped, f"status {status or ad.get('JobStatus')}")
            continue
        run = end - start if end is not None else wall
        if run is None:
            _skip(skipped, "run time unknown")
            continue
        cpus = int(_num(ad, "RequestCpus") or 1)
        hosts = int(_num(ad, "MaxHosts", "MinHosts") or 1)
        jid = f"{int(ad.get('ClusterId', i))}.{int(ad.get('ProcId', 0))}"
        rows.append((submit, TraceJob(jid, 0.0, max(0.0, run), cpus * hosts, hosts if hosts > 1 else 1,
                                      _num(ad, "AllowedJobDuration") or 0.0, str(ad.get("Owner", "")), "",
                                      status, max(0.0, start - submit), str(ad.get("AcctGroup", "") or ""))))
    return _finish(name, source, rows, skipped)
