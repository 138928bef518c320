"""What slurmctld's power saving hands its programs, turned into a ``slurm.power`` message.

Why a module of its own: ``epu slurm resume|suspend|resume-fail`` runs as the slurmctld user on
the head node, with nothing but its argument (a hostlist) and, for a resume on Slurm ≥ 22.05, the
file named by ``SLURM_RESUME_FILE`` (JSON: ``all_nodes_resume`` and ``jobs[]`` with ``job_id``,
``nodes_alloc``, ``nodes_resume``, ``features``, ``extra``, ``partition``, ``reservation``,
``oversubscribe``; Slurm's power_save guide, and ParallelCluster ≥ 3.8 reads it the same way).
Both are parsed here without I/O beyond reading that one file, every name checked
(``common.hostlist``), so the CLI stays a thin shell and the parsing is tested directly.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from epu.common.hostlist import HostlistError, expand
from epu.common.messages import SlurmPower, SlurmPowerAction, SlurmResumeJob, new_id

MAX_RESUME_FILE_BYTES = 64 * 1024 * 1024
"""A resume file larger than this is refused: slurmctld writes one job per line-ish, and 10,000
jobs fit in a few MB."""


class ResumeFileError(ValueError):
    """A ``SLURM_RESUME_FILE`` that cannot be used; the message says why."""


def _text(job: dict[str, Any], key: str) -> str:
    value = job.get(key)
    return "" if value is None else str(value)


def parse_resume_file(data: Any) -> list[SlurmResumeJob]:
    """The jobs of a decoded ``SLURM_RESUME_FILE``; ``ResumeFileError`` for a file that is not
    what slurmctld writes (a bad hostlist included)."""
    if not isinstance(data, dict):
        raise ResumeFileError("resume file: expected a JSON object")
    jobs = data.get("jobs", [])
    if not isinstance(jobs, list):
        raise ResumeFileError("resume file: 'jobs' is not a list")
    out: list[SlurmResumeJob] = []
    for i, job in enumerate(jobs):
        if not isinstance(job, dict):
            raise ResumeFileError(f"resume file: jobs[{i}] is not an object")
        job_id = job.get("job_id")
        if isinstance(job_id, bool) or not isinstance(job_id, int) or job_id < 0:
            raise ResumeFileError(f"resume file: jobs[{i}].job_id {job_id!r} is not a job id")
        try:
            alloc = expand(job["nodes_alloc"]) if job.get("nodes_alloc") else []
            resume = expand(job["nodes_resume"]) if job.get("nodes_resume") else []
        except (HostlistError, TypeError) as exc:
            raise ResumeFileError(f"resume file: job {job_id}: {exc}") from None
        out.append(SlurmResumeJob(job_id=job_id, nodes_alloc=alloc, nodes_resume=resume,
                                  features=_text(job, "features")[:1024], extra=_text(job, "extra")[:1024],
                                  partition=_text(job, "partition")[:256],
                                  reservation=_text(job, "reservation")[:256],
                                  oversubscribe=_text(job, "oversubscribe")[:32]))
    return out


def read_resume_file(path: str | Path) -> list[SlurmResumeJob]:
    """``parse_resume_file`` of the file at ``path``."""
    p = Path(path)
    try:
        if p.stat().st_size > MAX_RESUME_FILE_BYTES:
            raise ResumeFileError(f"resume file {p}: larger than {MAX_RESUME_FILE_BYTES} bytes")
        data = json.loads(p.read_text())
    except OSError as exc:
        raise ResumeFileError(f"resume file {p}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ResumeFileError(f"resume file {p}: not JSON ({exc})") from None
    return parse_resume_file(data)


def power_message(domain: str, action: SlurmPowerAction, hostlist: str, *,
                  jobs: list[SlurmResumeJob] | None = None, batch_id: str | None = None,
                  now: float | None = None) -> SlurmPower:
    """One call of a power-saving program as the message the engine acts on. Raises
    ``HostlistError`` for a bad hostlist, ``ValueError`` (pydantic's) for a name the contract
    refuses."""
    return SlurmPower(batch_id=batch_id or new_id(), domain=domain, action=action, nodes=expand(hostlist),
                      jobs=list(jobs or []) if action == "resume" else [],
                      called_at=time.time() if now is None else now)


__all__ = ["MAX_RESUME_FILE_BYTES", "ResumeFileError", "parse_resume_file", "power_message", "read_resume_file"]
