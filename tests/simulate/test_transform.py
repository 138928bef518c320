from __future__ import annotations

from pathlib import Path

import pytest

from epu.workloads.model import TraceJob, Workload, WorkloadError
from epu.workloads.swf import read_swf
from epu.workloads.transform import DAY, limit, scale_size, scale_time, window


def test_a_month_of_nasa(nasa: Path) -> None:
    w = read_swf(nasa)
    m = window(w, 0, 30)
    assert 5500 < len(m.jobs) < 6500  # "about 6,000 jobs"
    assert all(0 <= j.submit < 30 * DAY for j in m.jobs)
    second = window(w, 30, 30)
    assert second.jobs[0].submit >= 0 and second.start_epoch == w.start_epoch + 30 * DAY
    assert not {j.job_id for j in m.jobs} & {j.job_id for j in second.jobs}


def _w() -> Workload:
    return Workload("t", [TraceJob("1", 0, 10, 4), TraceJob("2", 100, 10, 3, nodes=3)], machine_procs=8)


def test_scales() -> None:
    t = scale_time(_w(), 0.5)
    assert [j.submit for j in t.jobs] == [0, 50] and [j.run for j in t.jobs] == [10, 10]
    s = scale_size(_w(), 2)
    assert [j.procs for j in s.jobs] == [8, 6] and s.jobs[1].nodes == 6 and s.machine_procs == 16
    assert [j.procs for j in scale_size(_w(), 0.1).jobs] == [1, 1]  # at least one processor
    assert len(limit(_w(), 1).jobs) == 1


def test_bad_transforms() -> None:
    with pytest.raises(WorkloadError, match="no job submitted"):
        window(_w(), 5, 1)
    with pytest.raises(WorkloadError, match="> 0"):
        scale_time(_w(), 0)


def test_shape_on_a_cluster() -> None:
    j = TraceJob("1", 0, 10, 128)
    assert j.shape(1) == (128, 1) and j.shape(4) == (32, 4)
    assert TraceJob("2", 0, 1, 3).shape(4) == (1, 3)
    assert TraceJob("3", 0, 1, 8, nodes=2).shape(4) == (2, 4)
