"""The real thing on one machine: an elastic Slurm cluster driven by all four services.

A private slurmctld with six CLOUD slots and no worker; RabbitMQ; ``epu run`` for the sensor
(Slurm backend), the decision engine, the provisioner (process site: each instance is a
slurmd plus a context agent) and the context broker; ``epu record`` watching the bus. Submit
20 one-core jobs and one 4-node ``srun`` job: the engine launches, the sensor adds the nodes,
every job runs and completes (the 4-node job sees all its nodes, in srun's output and in each
node's MPI hostfile); then the idle nodes are drained, removed and terminated: back to zero,
with no slurmd left and never two for one node.

Results go to the test's tmp dir, and to results/e2e-<timestamp>/ when E2E_RESULTS is set.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest
from epu.common.broker import Broker
from epu.common.testing import wait_for

from tests.e2e.harness import E2E, ROOT, SnapshotWatch, slurmd_census

pytestmark = [pytest.mark.e2e, pytest.mark.slurm, pytest.mark.rabbitmq]

SINGLE_JOBS = 20

# Each task of the wide job waits (bounded) until its node's hostfile lists every node of the
# job — what an MPI launcher needs — then prints what it sees.
HOSTFILE_CHECK = r"""
import os, subprocess, sys, time
node = os.environ["SLURMD_NODENAME"]
want = subprocess.run(["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]],
                      capture_output=True, text=True, check=True).stdout.split()
path = os.path.join(sys.argv[1], node, "etc", "epu", "mpi_hostfile")
seen = []
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    try:
        seen = [l.split()[0] for l in open(path) if l.strip() and not l.startswith("#")]
    except OSError:
        seen = []
    if set(want) <= set(seen):
        break
    time.sleep(0.2)
print(f"task on {node}: job nodes {' '.join(want)}; hostfile {' '.join(sorted(seen))}", flush=True)
"""


def results_dirs(tmp_path: Path, name: str) -> tuple[Path, Path | None]:
    out = tmp_path / "results"
    keep = None
    if os.environ.get("E2E_RESULTS"):
        keep = ROOT / "results" / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    return out, keep


def publish(out: Path, keep: Path | None) -> None:
    if keep is not None:
        keep.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(out, keep, dirs_exist_ok=True)


def wide_job_script(run: E2E) -> Path:
    check = run.workdir / "hostfile_check.py"
    check.write_text(HOSTFILE_CHECK)
    script = run.workdir / "wide.sh"
    script.write_text("#!/bin/bash\n"
                      f"srun -N 4 --ntasks-per-node=1 printenv SLURMD_NODENAME\n"
                      f"srun -N 4 --ntasks-per-node=1 {sys.executable} {check} {run.workdir / 'ctx-root'}\n")
    script.chmod(0o755)
    return script


def test_scale_up_run_every_job_and_back_to_zero(broker: Broker, tmp_path: Path) -> None:
    started = time.monotonic()
    out, keep = results_dirs(tmp_path, "e2e")
    watch = SnapshotWatch(broker)
    with E2E(tmp_path / "run", broker.url, broker.topology.prefix) as run:
        try:
            run.start_recorder(out)
            run.start_services()
            run.start_watchers(out)
            assert not slurmd_census(run.cluster.conf_path), "starts with zero workers"

            singles = [run.submit("-n", "1", wrap="sleep 2") for _ in range(SINGLE_JOBS)]
            wide_out = run.workdir / "wide.out"
            wide = run.submit("-N", "4", "--ntasks-per-node=1", script=wide_job_script(run), output=str(wide_out))
            jobs = [*singles, wide]

            wait_for(lambda: run.census.max_total >= 1, 60, interval=0.2, message="a first worker launched")
            wait_for(lambda: set(run.job_states(jobs).values()) <= {"COMPLETED"}, 150, interval=0.5,
                     message="every job completed")
            final_states = run.job_states(jobs)
            assert set(final_states.values()) == {"COMPLETED"}
            done = watch.count()

            text = wide_out.read_text()
            names = [line.strip() for line in text.splitlines() if line.strip() and " " not in line.strip()]
            assert len(set(names)) == 4, f"srun ran on 4 distinct nodes:\n{text}"
            tasks = [line for line in text.splitlines() if line.startswith("task on ")]
            assert len(tasks) == 4, text
            for line in tasks:
                job_nodes = line.split("job nodes ")[1].split(";")[0].split()
                hostfile = line.split("hostfile ")[1].split() if "hostfile " in line else []
                assert set(job_nodes) <= set(hostfile), f"every node's hostfile lists the job's nodes:\n{text}"

            wait_for(lambda: not slurmd_census(run.cluster.conf_path) and not run.slurm_nodes_in_service(),
                     90, interval=0.5, message="idle workers drained, removed from Slurm and terminated")
            watch.wait_settled(after=done)
            summary = run.stop_recorder(out)
            run.stop_watchers()
        finally:
            watch.stop()
        census_peak = dict(run.census.peak)
        duplicates = run.census.duplicates()
        left = dict(slurmd_census(run.cluster.conf_path))

    # Completions come from Slurm itself: snapshots carry pending jobs as shapes (not one record
    # per job), so the recorder sees a job only if a snapshot caught it running on a node.
    summary.update(slurmd_peak_by_node=census_peak, slurmd_duplicates=duplicates, slurmd_left=left,
                   scenario_seconds=round(time.monotonic() - started, 1), jobs_submitted=len(jobs),
                   jobs_seen_completed=summary["jobs_completed"],
                   jobs_completed=sum(1 for s in final_states.values() if s == "COMPLETED"))
    summary["orphans"] = summary["orphans"] + sum(left.values())
    summary["duplicates"] = summary["duplicates"] + len(duplicates)
    _rewrite_summary(out, summary)
    publish(out, keep)

    assert summary["jobs_completed"] >= len(jobs), summary
    assert summary["orphans"] == 0 and summary["duplicates"] == 0, summary
    assert summary["back_to_zero"] and summary["final_workers"] == 0, summary
    assert summary["peak_workers"] >= 4, summary
    assert summary["seconds_to_first_job_running"] is not None
    assert summary["scenario_seconds"] < 240, summary
    assert_operator_views(out)


def assert_operator_views(out: Path) -> None:
    """``epu status`` showed the domain live and ``epu tap`` the event stream, the whole way."""
    boards = [json.loads(line) for line in (out / "status.jsonl").read_text().splitlines() if line.strip()]
    alpha = [b[0] for b in boards if b and b[0]["domain"] == "alpha"]
    assert max(a["queue"]["jobs"] for a in alpha) >= 1, "status showed the queue"
    assert max(sum(a["instances_by_site"].get("local", {}).values()) for a in alpha) >= 4, "instances by site"
    in_service = [sum(n for st, n in a["nodes_by_state"].items() if st in ("free", "busy")) for a in alpha]
    assert max(in_service) >= 4, "status showed the workers' nodes by state"
    kinds = {act["kind"] for a in alpha if a["last_decision"] for act in a["last_decision"]["actions"]}
    assert {"launch", "add", "offline", "remove", "terminate"} <= kinds, kinds
    assert alpha[-1]["instances_by_site"] == {}, "the last board shows no instance left"

    events = [json.loads(line) for line in (out / "tap.jsonl").read_text().splitlines() if line.strip()]
    keys = {e["routing_key"].split(".")[0] + "." + e["routing_key"].split(".")[1] for e in events}
    assert {"sensor.snapshot", "instance.state", "decision.record", "node.result",
            "context.member"} <= keys, keys
    lives: dict[str, list[str]] = {}
    for e in events:
        if e["routing_key"].startswith("instance.state."):
            lives.setdefault(e["body"]["instance_id"], []).append(e["body"]["state"])
    assert len(lives) >= 4
    # every worker was stopped by EPU on scale-down, none failed
    assert all(states[-1] == "terminated" for states in lives.values()), lives


def _rewrite_summary(out: Path, summary: dict) -> None:
    import json

    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
