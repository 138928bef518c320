"""Owners of running jobs (cost accounting's account, user, partition) from ``squeue --json``
and from the text read (``squeue -O``), captured from a real Slurm 22.05, into the snapshot's
``owners``."""

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


OWNERS = FIXTURES / "owners_22.05"


def test_the_text_read_gives_the_owners_the_json_read_gives() -> None:
    """Real 22.05 at one moment (owners_22.05): running jobs of two accounts, one without an
    account (text ``(null)``) run by ``nobody``, an array's tasks in another partition. The fast
    text read gives each the same [account, user, partition] as ``--json``; a pending job none."""
    from epu.services.sensor.slurm.text import parse_squeue_text

    ids = json.loads((OWNERS / "ids.json").read_text())
    doc = json.loads((OWNERS / "squeue.json").read_text())
    text = parse_squeue_text((OWNERS / "squeue_O.txt").read_text()).jobs
    arr = ids["chem_array"]
    assert text.owners == {ids["physics"]: ["physics", "root", "cpu"], ids["no_account"]: ["", "nobody", "cpu"],
                           f"{arr}_1": ["chem", "root", "short"], f"{arr}_2": ["chem", "root", "short"]}
    assert text.owners == parse_squeue(doc, 0.0).owners
    assert text.running == 4 and text.jobs_by_node == {"node1": [ids["physics"], ids["no_account"]],
                                                       "node2": [f"{arr}_1", f"{arr}_2"]}


def test_text_and_json_owners_agree_on_the_mixed_capture() -> None:
    from epu.services.sensor.slurm.text import parse_squeue_text

    mixed = FIXTURES / "mixed_22.05"
    text = parse_squeue_text((mixed / "squeue_O.txt").read_text()).jobs
    assert text.owners and all(o[1] == "root" for o in text.owners.values())
    assert text.owners == parse_squeue(json.loads((mixed / "squeue.json").read_text()), 0.0).owners


def test_the_text_read_asks_squeue_for_the_owner() -> None:
    from epu.services.sensor.slurm.text import SQUEUE_FIELDS, squeue_argv

    assert {"account", "username", "partition"} <= set(SQUEUE_FIELDS)
    assert "account:0\x1f,username:0\x1f" in squeue_argv()[-1]
