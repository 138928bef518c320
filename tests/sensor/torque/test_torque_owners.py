"""Owners of running jobs (cost accounting's account, user, partition) from ``qstat -f -x``
captured from a real Torque: ``Account_Name`` (else ``egroup``), ``euser``, ``queue``."""

from __future__ import annotations

from pathlib import Path

from epu.services.sensor.torque.parse import scan_qstat

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "torque" / "30_qstat_-f_-x.txt"


def _xml() -> str:
    text = FIXTURE.read_text()
    return text[text.index("<?xml"):]


def test_running_jobs_carry_their_owners() -> None:
    jobs = scan_qstat(_xml(), 0.0)
    assert jobs.running == 1 and jobs.owners == {"2.vm": ["alice", "alice", "batch"]}


def test_an_account_name_is_the_account() -> None:
    xml = _xml().replace("<Job_Id>2.vm</Job_Id>", "<Job_Id>2.vm</Job_Id><Account_Name>physics</Account_Name>", 1)
    assert scan_qstat(xml, 0.0).owners["2.vm"] == ["physics", "alice", "batch"]
