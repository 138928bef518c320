"""epu.common.timeline: events → rows → summary, with hand-made events (no broker, no files);
and the results folder writer on top of it."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from epu.common.messages import InstanceEvent, NodeInfo, QueuedJob, SensorSnapshot
from epu.common.timeline import Timeline, csv_header, csv_rows

from epu.cli_record import write_results


def snap(at: float, queued: list[str] = (), nodes: dict[str, tuple[str, list[str]]] | None = None,
         available: bool = True) -> SensorSnapshot:
    nodes = nodes or {}
    return SensorSnapshot(domain="alpha", backend="test", available=available, taken_at=at,
                          jobs=[QueuedJob(job_id=j) for j in queued],
                          nodes=[NodeInfo(name=n, state=s, cores=1, jobs=jobs) for n, (s, jobs) in nodes.items()],
                          running_jobs=len({j for _, jobs in nodes.values() for j in jobs}))


def inst(iid: str, state: str, seq: int, node: str = "", site: str = "local") -> InstanceEvent:
    return InstanceEvent(instance_id=iid, domain="alpha", site=site, state=state, seq=seq,
                         node_name=node or f"w-{iid}", at=0.0)


def scale_up_and_down() -> Timeline:
    tl = Timeline()
    tl.observe(snap(0, queued=["1", "2"]), 100.0)
    tl.observe(inst("a", "requested", 1), 101.0)
    tl.observe(inst("a", "pending", 2), 102.0)
    tl.observe(inst("a", "started", 3), 103.0)
    tl.observe(snap(0, queued=["2"], nodes={"w-a": ("busy", ["1"])}), 104.0)
    tl.observe(snap(0, nodes={"w-a": ("busy", ["2"])}), 106.0)
    tl.observe(snap(0, nodes={"w-a": ("free", [])}), 108.0)
    tl.observe(snap(0, nodes={"w-a": ("offline", [])}), 109.0)
    tl.observe(inst("a", "terminating", 4), 110.0)
    tl.observe(snap(0), 111.0)
    tl.observe(inst("a", "terminated", 5), 112.0)
    return tl


def test_rows_follow_queue_nodes_and_instances() -> None:
    tl = scale_up_and_down()
    first = tl.rows[0]
    assert (first.t, first.queued_jobs, first.workers) == (0.0, 2, 0)
    started = tl.rows[3]
    assert started.instances == {("local", "started"): 1}
    assert started.instances_by_site() == {"local": 1}
    assert tl.rows[4].nodes == {"busy": 1} and tl.rows[4].running_jobs == 1
    assert tl.rows[-1].workers == 0 and tl.rows[-1].nodes == {}


def test_summary_of_a_clean_run() -> None:
    s = scale_up_and_down().summary()
    assert s["jobs_completed"] == 2 and s["jobs_left"] == 0 and s["jobs_seen"] == 2
    assert s["peak_workers"] == 1
    assert s["seconds_to_first_job_running"] == 4.0
    assert s["seconds_to_zero"] == 12.0
    assert s["seconds_from_work_done_to_zero"] == 4.0  # idle at 108, zero at 112
    assert s["back_to_zero"] is True and s["orphans"] == 0 and s["duplicates"] == 0


def test_unavailable_snapshot_is_not_an_empty_cluster() -> None:
    tl = Timeline()
    tl.observe(snap(0, queued=["1"]), 0.0)
    assert tl.observe(snap(0, available=False), 1.0) is None
    assert tl.rows[-1].queued_jobs == 1
    assert tl.summary()["jobs_completed"] == 0


def test_stale_instance_events_never_move_back() -> None:
    tl = Timeline()
    tl.observe(inst("a", "started", 3), 0.0)
    assert tl.observe(inst("a", "pending", 2), 1.0) is None
    assert tl.observe(inst("a", "started", 3), 2.0) is None
    assert tl.live_instances() == {"a": "started"}


def test_requeued_job_is_not_counted_as_completed() -> None:
    tl = Timeline()
    tl.observe(snap(0, nodes={"n": ("busy", ["7"])}), 0.0)
    tl.observe(snap(0, nodes={"n": ("free", [])}), 1.0)
    tl.observe(snap(0, queued=["7"]), 2.0)
    assert tl.summary()["jobs_completed"] == 0


def test_duplicates_and_orphans() -> None:
    tl = Timeline()
    tl.observe(inst("a", "started", 1, node="w1"), 0.0)
    tl.observe(inst("b", "started", 1, node="w1"), 1.0)
    tl.observe(snap(0, nodes={"w1": ("free", []), "stray": ("free", [])}), 2.0)
    s = tl.summary()
    assert s["duplicates"] == 1 and s["duplicate_list"] == ["w1"]
    assert s["orphans"] == 3  # two live instances and a node nobody launched, with nothing to do
    assert s["back_to_zero"] is False


def test_no_orphans_while_work_remains() -> None:
    tl = Timeline()
    tl.observe(inst("a", "started", 1), 0.0)
    tl.observe(snap(0, queued=["1"]), 1.0)
    assert tl.orphans() == []


def test_csv_columns_match_rows() -> None:
    tl = scale_up_and_down()
    header = csv_header(tl.sites)
    rows = csv_rows(tl.rows, tl.sites)
    assert all(len(r) == len(header) for r in rows)
    assert "instances_local_started" in header and "nodes_busy" in header


def test_results_folder(tmp_path: Path) -> None:
    summary = write_results(scale_up_and_down(), tmp_path / "out", extra={"orphan_processes": 0})
    out = tmp_path / "out"
    with open(out / "timeline.csv") as f:
        table = list(csv.reader(f))
    assert table[0][0] == "t_seconds" and len(table) == 12
    assert json.loads((out / "summary.json").read_text()) == summary
    assert summary["orphan_processes"] == 0
    assert (out / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_results_folder_of_an_empty_recording(tmp_path: Path) -> None:
    summary = write_results(Timeline(), tmp_path)
    assert summary["rows"] == 0 and summary["peak_workers"] == 0
    assert (tmp_path / "timeline.png").exists()
