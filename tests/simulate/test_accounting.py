"""Slurm accounting (real captures from Slurm 22.05, capture_sacct.py) and HTCondor history."""

from __future__ import annotations

from pathlib import Path

import pytest

from epu.workloads.condor import parse_condor_history
from epu.workloads.load import load_trace, sniff
from epu.workloads.model import WorkloadError
from epu.workloads.slurm import parse_duration, parse_sacct, parse_sacct_json

DATA = Path(__file__).parent / "data"


def _rows(w) -> list[tuple]:  # type: ignore[no-untyped-def]
    return [(j.job_id, j.submit, j.run, j.procs, j.nodes, j.time_limit, j.status, j.wait) for j in w.jobs]


def test_real_sacct_text_and_json_agree() -> None:
    text, js = DATA / "sacct-parsable2.txt", DATA / "sacct.json"
    assert (sniff(text), sniff(js)) == ("sacct", "sacct-json")
    a, b = load_trace(text), load_trace(js)
    assert _rows(a) == _rows(b)
    by_id = {j.job_id: j for j in a.jobs}
    assert set(by_id) == {"1", "2", "3", "4", "5_1", "5_2", "5_3"}
    two = by_id["2"]  # sbatch -N2 -n4 -t 1 sleep 3
    assert (two.nodes, two.procs, two.time_limit, two.run) == (2, 4, 60.0, 3.0)
    assert by_id["4"].status == "failed" and by_id["3"].time_limit == 300.0
    assert a.start_epoch is not None and min(j.submit for j in a.jobs) == 0.0


def test_sacct_skips_what_cannot_be_replayed() -> None:
    head = "JobID|Submit|Start|End|NCPUS|NNodes|Timelimit|State"
    w = parse_sacct([head, "1|2024-01-01T00:00:00|2024-01-01T00:01:00|2024-01-01T00:11:00|8|2|01:00:00|COMPLETED",
                     "1.batch|2024-01-01T00:00:00|2024-01-01T00:01:00|2024-01-01T00:11:00|8|2||COMPLETED",
                     "2|2024-01-01T00:02:00|None|2024-01-01T00:03:00|1|1|10:00|CANCELLED by 0",
                     "3|2024-01-01T00:02:00|2024-01-01T00:02:05|Unknown|1|1|UNLIMITED|RUNNING"])
    assert [(j.job_id, j.run, j.procs, j.nodes, j.time_limit, j.wait) for j in w.jobs] == \
        [("1", 600.0, 8, 2, 3600.0, 60.0)]
    assert w.skipped == {"never started": 1, "not finished": 1}


@pytest.mark.parametrize("lines, msg", [
    (["JobID|Start|End"], "header needs"),
    (["JobID|Submit|Start|End|NCPUS", "1|x|y"], ":2: 3 fields"),
    (["JobID|Submit|Start|End|NCPUS", "1|yesterday|None|None|1"], "not a sacct time: 'yesterday'"),
])
def test_bad_sacct_names_the_line(lines: list[str], msg: str) -> None:
    with pytest.raises(WorkloadError, match=msg):
        parse_sacct(lines, source="s.txt")


def test_durations() -> None:
    assert parse_duration("1-02:03:04") == 93784
    assert parse_duration("10:00") == 600
    assert parse_duration("UNLIMITED") is None and parse_duration("Partition_Limit") is None


def test_sacct_json_2302_numbers_and_bad_input() -> None:
    job = {"job_id": 7, "time": {"submission": {"set": True, "number": 100}, "start": {"set": True, "number": 160},
                                 "end": {"set": True, "number": 460}, "limit": {"set": True, "infinite": False,
                                                                                "number": 10}},
           "state": {"current": ["COMPLETED"]}, "tres": {"allocated": [{"type": "cpu", "count": 2}]},
           "allocation_nodes": 1}
    (j,) = parse_sacct_json({"jobs": [job]}).jobs
    assert (j.run, j.procs, j.time_limit, j.wait) == (300.0, 2, 600.0, 60.0)
    with pytest.raises(WorkloadError, match="no 'jobs' list"):
        parse_sacct_json({"meta": {}})


def test_condor_history() -> None:
    w = load_trace(DATA / "condor_history.json")
    assert sniff(DATA / "condor_history.json") == "condor-json"
    rows = {j.job_id: j for j in w.jobs}
    assert set(rows) == {"12.0", "12.1", "13.0"}
    assert (rows["12.0"].run, rows["12.0"].wait, rows["12.0"].procs) == (600.0, 30.0, 1)
    # a restarted job: the completing run counts, the wait is to its last start
    assert (rows["12.1"].run, rows["12.1"].procs, rows["12.1"].time_limit) == (900.0, 4, 3600.0)
    assert (rows["13.0"].nodes, rows["13.0"].procs) == (4, 8)  # parallel universe: 4 hosts x 2 cpus
    assert w.skipped == {"never started": 1, "status removed": 1}
    with pytest.raises(WorkloadError, match="JSON array"):
        parse_condor_history({"ClusterId": 1})
