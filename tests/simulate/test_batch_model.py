"""Sanity of the batch model every simulation runs on: a static cluster of the trace's size."""

from __future__ import annotations

from pathlib import Path

from epu.simulate.static import replay_static, static_summary
from epu.workloads.model import TraceJob, Workload
from epu.workloads.swf import read_swf
from epu.workloads.transform import window


def test_nasa_on_its_own_machine(nasa: Path) -> None:
    w = window(read_swf(nasa), 0, 10)
    jobs, skipped = replay_static(w, 128, 1)
    assert not skipped and len(jobs) == len(w.jobs)
    assert all(j["end"] is not None for j in jobs)
    # no job starts before its submit time
    assert all(j["start"] >= j["submit"] for j in jobs)
    # never more processors busy than the machine has
    events = sorted([(j["start"], j["nodes"]) for j in jobs] + [(j["end"], -j["nodes"]) for j in jobs],
                    key=lambda e: (e[0], e[1]))
    busy = peak = 0
    for _, d in events:
        busy += d
        peak = max(peak, busy)
    assert peak <= 128
    # this log's submit times are the machine's own start times: nearly every job starts at once
    at_once = sum(1 for j in jobs if j["start"] == j["submit"])
    assert at_once / len(jobs) > 0.97


def test_fifo_when_every_job_needs_the_whole_machine() -> None:
    jobs = [TraceJob(str(i), float(i), 100.0 + (7 * i) % 50, 8) for i in range(30)]
    out, _ = replay_static(Workload("fifo", jobs), 8, 1)
    starts = [j["start"] for j in out]
    assert starts == sorted(starts)  # nothing can backfill: strict submit order
    for a, b in zip(out, out[1:], strict=False):
        assert b["start"] == max(b["submit"], a["end"])  # and no gap


def test_backfill_never_delays_the_head_job() -> None:
    # an 8-node job waits behind a long 4-node one; short 1-node jobs may run beside it only
    # if they end before the head job can start
    jobs = [TraceJob("long", 0, 1000, 4), TraceJob("head", 1, 500, 8), TraceJob("short", 2, 100, 1),
            TraceJob("too-long", 3, 5000, 1)]
    out = {j: r for j, r in zip(["long", "head", "short", "too-long"], replay_static(Workload("bf", jobs), 8, 1)[0],
                                             strict=True)}
    assert out["head"]["start"] == 1000  # when "long" ends
    assert out["short"]["start"] == 2  # backfilled: ends at 102 < 1000
    assert out["too-long"]["start"] >= out["head"]["end"]  # would have delayed the head job


def test_static_summary_of_nasa(nasa: Path) -> None:
    s = static_summary(window(read_swf(nasa), 0, 30), 128, 1, 0.1)
    assert s["jobs_completed"] == s["jobs"] and s["wait_p50_s"] == 0
    assert 0.3 < s["utilization"] < 0.7 and s["peak_nodes"] == 128
    assert s["cost"] == round(s["node_hours"] * 0.1, 4)
