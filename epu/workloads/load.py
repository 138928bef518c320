"""Read a workload file of any supported format (chosen by content, or named)."""

from __future__ import annotations

from pathlib import Path

from epu.workloads.model import Workload, WorkloadError
from epu.workloads.swf import open_text, read_swf

FORMATS = ("auto", "swf", "sacct", "sacct-json", "condor-json")


def sniff(path: str | Path) -> str:
    with open_text(path) as f:
        head = f.read(4096)
    text = head.lstrip()
    if text.startswith("{") and '"jobs"' in head:
        return "sacct-json"
    if text.startswith("["):
        return "condor-json"
    first = text.splitlines()[0] if text else ""
    if "|" in first and "JobID" in first:
        return "sacct"
    return "swf"


def load_trace(path: str | Path, fmt: str = "auto") -> Workload:
    if fmt not in FORMATS:
        raise WorkloadError(f"unknown trace format {fmt!r} (known: {', '.join(FORMATS)})")
    if not Path(path).exists():
        raise WorkloadError(f"{path}: no such file")
    if fmt == "auto":
        fmt = sniff(path)
    if fmt == "swf":
        return read_swf(path)
    if fmt == "sacct":
        from epu.workloads.slurm import read_sacct

        return read_sacct(path)
    if fmt == "sacct-json":
        from epu.workloads.slurm import read_sacct_json

        return read_sacct_json(path)
    from epu.workloads.condor import read_condor_history

    return read_condor_history(path)
