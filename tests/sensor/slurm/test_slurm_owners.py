"""Owners of running jobs (cost accounting's account, user, partition) from ``squeue --json``,
captured from a real Slurm 22.05, into the snapshot's ``owners``."""

from __future__ import annotations

import json
from pathlib import Path

from epu.services.sensor.slurm.parse import parse_squeue

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "slurm"


def test_running_jobs_carry_their_owners() -> None:
    doc = json.loads((FIXTURES / "squeue_22.05.json").read_text())
    jobs = parse_squeue(doc, max(j["submit_time"] for j in doc["jobs"]) + 100)
    assert jobs.owners == {"1": ["", "root", "debug"], "2": ["", "root", "debug"]}
    doc["jobs"][0]["account"] = "physics"
    assert parse_squeue(doc, 0.0).owners["1"] == ["physics", "root", "debug"]


def test_the_backend_puts_them_in_the_observation(tmp_path: Path) -> None:
    """The backend's own runner, on ``squeue``/``sinfo`` stand-ins that print what a real Slurm
    printed (the captured JSON)."""
    from epu.services.sensor.slurm.backend import SlurmBackend

    for name, fixture in (("squeue", "squeue_22.05.json"), ("sinfo", "sinfo_22.05.json")):
        exe = tmp_path / name
        exe.write_text(f"#!/bin/sh\nexec cat {FIXTURES / fixture}\n")
        exe.chmod(0o755)
    obs = SlurmBackend(bin_dir=str(tmp_path), read_format="json").snapshot()
    assert obs.owners == {"1": ["", "root", "debug"], "2": ["", "root", "debug"]}
