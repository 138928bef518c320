"""A provisioner SIGKILLed between the cloud call and the store update, then restarted: every
cloud instance ends tracked or swept, none twice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

from epu.common.clock import RealClock
from epu.services.provisioner.cloud import TAG_DEPLOYMENT, TAG_LAUNCH, TAG_STORE
from epu.services.provisioner.sim import SimulatedNodeDriver

ROOT = Path(__file__).resolve().parents[2]


def test_killed_between_cloud_call_and_store_then_restarted(tmp_path, make_provisioner, sqlite_url) -> None:
    cloud_db = str(tmp_path / "cloud.db")
    env = {**os.environ, "EPU_PROVISIONER_CRASH_AT": "after_cloud_call", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "tests.provisioner.crash_worker", sqlite_url, cloud_db, "12"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    assert "not killed" not in proc.stdout

    cloud = SimulatedNodeDriver(path=cloud_db)
    before = cloud.list_nodes()
    assert before, "the killed process made at least one node the store does not know"
    prov, events = make_provisioner({"sim": cloud}, grace=0, clock_=RealClock())
    # and a node from some other lost run of this store: our deployment and store, launch id unknown
    cloud.create_node("stray", cloud.list_sizes()[0], cloud.list_images()[0],
                      ex_metadata={TAG_DEPLOYMENT: "epu", TAG_STORE: prov.identity.store_id, TAG_LAUNCH: "lost-run-1"})
    # one of another store that shares the deployment name: never ours to sweep
    cloud.create_node("foreign", cloud.list_sizes()[0], cloud.list_images()[0],
                      ex_metadata={TAG_DEPLOYMENT: "epu", TAG_STORE: "another", TAG_LAUNCH: "lost-run-2"})
    untracked = [r for r in prov.store.list() if r.cloud_id is None]
    assert untracked, "the crash left records without their cloud id"
    report = prov.reconcile("sim", resume_after=0.0)
    assert report.adopted and report.swept and report.resumed
    assert prov.wait_idle(30)

    live = [n for n in cloud.list_nodes() if n.state.value != "terminated"]
    assert [n.name for n in live if n.name in ("stray", "foreign")] == ["foreign"]
    live = [n for n in live if n.name != "foreign"]
    per_launch = Counter(n.extra["tags"][TAG_LAUNCH] for n in live)
    stored = {r.instance_id for r in prov.store.list()}
    assert stored == {f"crash-{i}" for i in range(12)}
    assert set(per_launch) == stored          # every stored launch has its node ...
    assert max(per_launch.values()) == 1      # ... exactly one
    records = {r.instance_id: r for r in prov.store.list()}
    for n in live:
        assert records[n.extra["tags"][TAG_LAUNCH]].cloud_id == n.id  # and the store tracks it
    assert all(r.state == "pending" for r in records.values())
