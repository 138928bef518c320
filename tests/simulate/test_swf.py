"""The SWF reader on the real NASA trace and on hand-broken copies."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from epu.workloads.load import load_trace, sniff
from epu.workloads.model import WorkloadError
from epu.workloads.swf import parse_swf, read_swf, submit_is_start


def test_reads_the_shared_nasa_trace(nasa: Path) -> None:
    w = read_swf(nasa)
    assert len(w.jobs) == 18239  # the README's count
    assert w.machine_procs == 128 and w.machine_nodes == 128
    assert w.start_epoch == 749458803.0
    assert submit_is_start(w)  # the archive's caveat is kept
    assert not w.skipped
    assert {j.procs for j in w.jobs} == {1, 2, 4, 8, 16, 32, 64, 128}
    first = w.jobs[0]
    assert (first.job_id, first.submit, first.run, first.procs) == ("1", 0.0, 1451.0, 128)
    assert all(j.time_limit == 0 for j in w.jobs)  # the log has no requested time
    assert round(w.span / 86400) == 92
    # the archive's utilization of this log
    assert abs(w.core_seconds() / (128 * (w.jobs[-1].submit + 86400)) - 0.466) < 0.01


def test_plain_and_gzip_read_the_same(nasa: Path, tmp_path: Path) -> None:
    plain = tmp_path / "nasa.swf"
    plain.write_bytes(gzip.decompress(nasa.read_bytes()))
    a, b = read_swf(nasa), read_swf(plain)
    assert a.jobs == b.jobs
    assert sniff(plain) == "swf" and load_trace(plain).jobs == a.jobs


def test_unknown_run_time_is_skipped_and_counted() -> None:
    lines = ["; MaxProcs: 8", "1 0 -1 10 4 -1 -1 -1 -1 -1 1 1 1 -1 -1 -1 -1 -1",
             "2 5 -1 -1 4 -1 -1 -1 -1 -1 5 1 1 -1 -1 -1 -1 -1",
             "3 7 -1 20 -1 -1 -1 2 60 -1 1 1 1 -1 -1 -1 -1 -1"]
    w = parse_swf(lines)
    assert [j.job_id for j in w.jobs] == ["1", "3"]
    assert w.jobs[1].procs == 2 and w.jobs[1].time_limit == 60  # requested procs and time used
    assert w.skipped == {"run time unknown": 1}


@pytest.mark.parametrize("line, msg", [
    ("1 0 -1 10 4", "has 5"),
    ("1 0 -1 ten 4 -1 -1 -1 -1 -1 1 1 1 -1 -1 -1 -1 -1", "field 4 is not a number: 'ten'"),
])
def test_a_line_that_is_not_swf_names_the_line(line: str, msg: str) -> None:
    with pytest.raises(WorkloadError, match=f"x.swf:2: .*{msg}"):
        parse_swf(["; Version: 2.2", line], source="x.swf")


def test_not_a_trace(tmp_path: Path) -> None:
    p = tmp_path / "empty.swf"
    p.write_text("; only comments\n")
    with pytest.raises(WorkloadError, match="no job records"):
        read_swf(p)
    with pytest.raises(WorkloadError, match="no such file"):
        load_trace(tmp_path / "missing.swf")
