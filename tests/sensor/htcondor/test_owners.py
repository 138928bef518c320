"""Owners of running jobs (cost accounting's account, user, partition) from HTCondor job ads:
``Owner``, and ``AcctGroup`` or ``AccountingGroup``, through both reads (bindings and ``-af``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import classad2
from epu.common.clock import ManualClock
from epu.services.sensor.htcondor.autoformat import JOB_AF, STARTD_AF, normalize_job_lines, render
from epu.services.sensor.htcondor.backend import HTCondorBackend
from epu.services.sensor.htcondor.canned import CannedCondor, projected
from epu.services.sensor.htcondor.parse import JOB_PROJECTION, STARTD_PROJECTION, Owners, normalize_jobs

from tests.sensor.htcondor.test_autoformat import Tools

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "htcondor"
NOW = 1795323000.0

#: jobs.ads: 102.0 running with accounting_group (AcctGroup, AccountingGroup), 107.0 (transferring
#: output) with only a +AccountingGroup of a nested group, 107.1 (suspended) with neither.
JOBS_OWNERS = {"102.0": ["group_physics", "alice", ""], "107.0": ["group_chem.hpc", "alice", ""],
               "107.1": ["", "alice", ""]}


def ads(name: str) -> list[Any]:
    return list(classad2.parseAds((FIXTURES / name).read_text()))


def test_the_schedd_is_asked_for_the_owner() -> None:
    assert {"Owner", "AcctGroup", "AccountingGroup"} <= set(JOB_PROJECTION) == set(JOB_AF)


def test_bindings_read_gives_running_jobs_owners() -> None:
    jobs = normalize_jobs(projected(ads("jobs.ads"), JOB_PROJECTION), NOW)
    assert jobs.owners == JOBS_OWNERS and jobs.running == len(JOBS_OWNERS)
    lost = normalize_jobs(projected(ads("jobs_on_lost_node.ads"), JOB_PROJECTION), NOW)
    assert lost.owners == {"120.0": ["", "alice", ""], "122.0": ["", "bob", ""]}


def test_af_read_gives_the_same_owners() -> None:
    text = (FIXTURES / "af" / "condor_q_jobs.txt").read_text()
    assert normalize_job_lines(text, NOW).owners == JOBS_OWNERS
    lost = render(projected(ads("jobs_on_lost_node.ads"), JOB_PROJECTION), JOB_AF)
    assert normalize_job_lines(lost, NOW).owners == {"120.0": ["", "alice", ""], "122.0": ["", "bob", ""]}


def test_both_backends_put_them_in_the_observation() -> None:
    jobs = projected(ads("jobs.ads"), JOB_PROJECTION)
    slots = projected(ads("startds.ads"), STARTD_PROJECTION)
    clock = ManualClock(NOW)
    b = HTCondorBackend(CannedCondor(jobs, slots), clock=clock).snapshot()
    a = HTCondorBackend(runner=Tools(render(jobs, JOB_AF), render(slots, STARTD_AF)), read_format="af",
                        clock=clock).snapshot()
    assert b.owners == a.owners == JOBS_OWNERS
    # keyed as the slots name their jobs (JobId), which is what cost accounting joins them on
    assert {j for n in b.nodes for j in n.jobs} & set(b.owners) == set(JOBS_OWNERS)


def test_plain_mapping_ads() -> None:
    """Ads given as plain dicts (the benchmark's) are read attribute by attribute."""
    ad = {"ClusterId": 7, "ProcId": 1, "JobStatus": 2, "Owner": "carol", "AccountingGroup": "group_bio"}
    assert normalize_jobs([ad], NOW).owners == {"7.1": ["group_bio", "carol", ""]}


def test_owner_rule() -> None:
    o = Owners()
    assert o("alice", "group_a", "group_b.alice") == ["group_a", "alice", ""]  # AcctGroup first
    assert o("alice", None, "group_b.alice") == ["group_b", "alice", ""]
    assert o("alice", None, "group_b.bob") == ["group_b.bob", "alice", ""]  # another user's suffix: kept
    assert o("alice", None, "group_b") == ["group_b", "alice", ""]
    assert o(None, None, None) is None
    assert o("alice", None, None) is o("alice", None, None)  # one list per distinct owner
