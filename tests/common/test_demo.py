"""The embedded demo (issue 14): it leaves nothing behind, and its context ends empty when its
instances do (``context_members_final`` was 1 with ``final_instances`` 0 in 5 of 9 runs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from epu.common.messages import ContextMembership, Envelope

from epu.demo import Demo, DemoSettings, Observed, run_demo

EPU = [sys.executable, "-m", "epu.cli"]


def test_the_demo_leaves_no_working_directory_behind(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.run([*EPU, "demo", "--jobs", "2", "--job-seconds", "1", "--boot-seconds", "0.5",
                           "--idle-seconds", "0.5", "--json"], capture_output=True, text=True, timeout=240,
                          env={**os.environ, "TMPDIR": str(tmp)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout)
    assert summary["jobs_completed"] == 2 and summary["context_joins"] >= 1
    assert list(tmp.iterdir()) == []  # no epu-demo-*: no stores, TLS key, admin token or context secret


def _membership(entry_id: int, kind: str, host: str = "wn-1") -> ContextMembership:
    return ContextMembership(context_id="c", entry_id=entry_id, kind=kind, hostname=host, at=time.time())


def test_membership_events_arriving_out_of_order_are_put_in_entry_order() -> None:
    """A node's join is announced from the broker's HTTP side and its leave from its AMQP
    consumer, so the leave can reach a tap first."""
    obs = Observed()
    env = Envelope.model_construct()
    obs.on_event(_membership(2, "leave"), env)
    obs.on_event(_membership(1, "join"), env)
    assert obs.context_members == set()
    obs.on_event(_membership(3, "join"), env)
    obs.on_event(_membership(3, "join"), env)  # a duplicate
    assert obs.context_members == {"wn-1"} and obs.context_joins == 1


def test_one_job_runs_end_with_an_empty_context() -> None:
    for seed in range(3):
        s = DemoSettings(jobs=1, job_seconds=1.0, boot_seconds=0.5, idle_seconds=0.5, stall_seconds=10,
                         timeout=90, seed=seed)
        summary = run_demo(s, live_display=False, out=None)
        assert not summary["timed_out"], summary
        assert summary["final_instances"] == 0 and summary["context_members_final"] == 0, summary
        assert summary["context_joins"] >= 1


def test_the_mixed_workload_launches_a_type_per_partition_and_nothing_for_stuck_jobs() -> None:
    s = DemoSettings(jobs=12, job_seconds=2.0, boot_seconds=0.5, idle_seconds=0.5, stall_seconds=20, timeout=120,
                     seed=1, workload="mixed", with_ctxbroker=False)
    summary = run_demo(s, live_display=False, out=None)
    assert not summary["timed_out"], summary
    # 10 x 1c cpu -> 3 c4; 1 x 200 GB bigmem -> 1 r16; 1 GPU job -> 1 g8; nothing for the 2 limit-blocked
    # jobs (a 4th c4) or the 64-core one
    assert summary["instances_by_type"] == {"c4": 3, "g8": 1, "r16": 1}, summary
    assert summary["jobs_completed"] == summary["jobs_submitted"] - summary["jobs_stuck"] == 12
    assert summary["final_instances"] == 0 and summary["unsatisfiable"] == ["1 x 64c @cpu (cores)"]


def test_a_demo_whose_service_does_not_start_stops_the_ones_it_started(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 34's title: a half-started demo. Its tap, left running, kept a connection to the broker
    for as long as the process lived; ``start()`` now stops what it started before raising."""
    monkeypatch.setattr(Demo, "START_SECONDS", 1.0)
    before = set(threading.enumerate())
    demo = Demo(DemoSettings(broker_url="amqp://guest:guest@127.0.0.1:1/nowhere", with_ctxbroker=False))
    try:
        with pytest.raises(RuntimeError, match="demo-tap did not start within 1 s: .*cannot reach the broker"):
            demo.start()
        left = [t.name for t in threading.enumerate() if t not in before and t.is_alive() and t.name.startswith("svc-")]
        assert left == []
    finally:
        demo.close()
