"""Faults in the real harness (tests/e2e/harness.py): a worker that never joins is replaced;
a provisioner killed with SIGKILL mid-scale-up and restarted leaves no duplicate and no orphan
slurmd; the active decision engine killed with SIGKILL hands over to its standby.

Each test runs the whole system (Slurm, RabbitMQ, four ``epu run`` processes) and ends with
the same checks as the scenario: every job completed, back to zero, no slurmd left, never
two slurmd for one node name.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from epu.common.broker import Broker
from epu.common.testing import wait_for

from tests.e2e.harness import E2E, EPU, slurmd_census

pytestmark = [pytest.mark.e2e, pytest.mark.slurm, pytest.mark.rabbitmq]


def instances(run: E2E) -> list[dict]:
    proc = subprocess.run([*EPU, "instances", "list", "--json", "-c", str(run.config)], env=run.env,
                          cwd=run.workdir, capture_output=True, text=True, timeout=30, check=True)
    return json.loads(proc.stdout)


def finish(run: E2E, jobs: list[str], timeout: float = 120) -> None:
    """Every job completes, then the cluster goes back to zero: no slurmd, no slot in service,
    no live instance in the provisioner's store."""
    wait_for(lambda: set(run.job_states(jobs).values()) <= {"COMPLETED"}, timeout, interval=0.5,
             message="every job completed")
    wait_for(lambda: not slurmd_census(run.cluster.conf_path) and not run.slurm_nodes_in_service()
             and not [i for i in instances(run) if i["state"] not in ("terminated", "failed")],
             90, interval=0.5, message="back to zero workers")
    assert not run.census.duplicates(), f"two slurmd for one node: {dict(run.census.peak)}"
    assert sum(slurmd_census(run.cluster.conf_path).values()) == 0


def worker_processes(run: E2E) -> int:
    """Worker launchers (tests.e2e.worker) of this run still alive, stalled ones included."""
    count = 0
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            args = (pid_dir / "cmdline").read_bytes()
            state = (pid_dir / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X") and b"tests.e2e.worker" in args and str(run.workdir).encode() in args:
            count += 1
    return count


def test_worker_that_never_joins_is_replaced(broker: Broker, tmp_path: Path) -> None:
    marker = tmp_path / "run" / "stalled-worker"
    replace = {"stall_seconds = 60.0": "stall_seconds = 6.0",
               '"--name", "{node_name}",': f'"--name", "{{node_name}}", "--stall-once", "{marker}",'}
    with E2E(tmp_path / "run", broker.url, broker.topology.prefix, replace=replace) as run:
        run.start_services()
        jobs = [run.submit("-n", "1", wrap="sleep 2") for _ in range(2)]
        wait_for(marker.exists, 60, interval=0.2, message="a worker stalled")
        stalled = marker.read_text().strip()
        finish(run, jobs)
        rows = instances(run)
        on_stalled = [i for i in rows if i["node_name"] == stalled]
        assert len(rows) >= 2, rows
        assert on_stalled and all(i["state"] == "terminated" for i in on_stalled), rows
        assert worker_processes(run) == 0, "the stalled worker was terminated too"


def test_provisioner_killed_mid_scale_up_then_restarted(broker: Broker, tmp_path: Path) -> None:
    with E2E(tmp_path / "run", broker.url, broker.topology.prefix) as run:
        run.start_services()
        jobs = [run.submit("-n", "1", wrap="sleep 3") for _ in range(12)]
        wait_for(lambda: sum(slurmd_census(run.cluster.conf_path).values()) >= 1, 60, interval=0.05,
                 message="scale-up under way")
        run.kill9("provisioner")
        before = dict(slurmd_census(run.cluster.conf_path))
        run.start("provisioner#restarted", None)
        finish(run, jobs)
        assert max(run.census.peak.values()) == 1 and run.census.max_total <= 6, (before, run.census.peak)


def test_active_decision_engine_killed_standby_carries_on(broker: Broker, tmp_path: Path) -> None:
    with E2E(tmp_path / "run", broker.url, broker.topology.prefix) as run:
        run.start_services()  # "decision" is the first consumer: the active one
        standby_log = run.workdir / "logs" / "decision#standby.log"
        run.start("decision#standby", None)
        wait_for(lambda: standby_log.exists() and "serving" in standby_log.read_text(), 30, interval=0.2,
                 message="standby engine connected")
        first = [run.submit("-n", "1", wrap="sleep 2") for _ in range(4)]
        wait_for(lambda: sum(slurmd_census(run.cluster.conf_path).values()) >= 1, 60, interval=0.1,
                 message="the active engine scaled up")
        run.kill9("decision")
        killed_at = time.monotonic()
        # new demand after the kill: only the standby can answer it, and only it can scale down
        second = [run.submit("-n", "1", wrap="sleep 2") for _ in range(6)]
        finish(run, first + second, timeout=150)
        assert time.monotonic() - killed_at < 170
