"""Jobs as shapes and node identity against real Slurm 22.05 daemons (issue 13).

The cluster: partitions ``cpu`` (node1, 2 CPUs, a running slurmd; CLOUD slot cpu1), ``bigmem``
(CLOUD slots big1, big2: RealMemory=16000, Features=bigmem) and ``gpu`` (CLOUD slot gpu1:
Gres=gpu:2, Features=a100, and a gres.conf without device files: ``AutoDetect=off`` and
``NodeName=gpu1 Name=gpu Count=2``, no ``File=``), plus a local license ``matlab:1``.

The limits this cluster has without accounting: ``Licenses`` (a license held by a running
job) and ``JobArrayTaskLimit`` (``--array=1-3%1``). QOS and association limits need slurmdbd:
``QOSMaxJobsPerUserLimit`` and ``AssocGrpCpuLimit`` are tested on real Slurm 22.05 with a
private slurmdbd and MariaDB in test_slurm_limits_integration.py (a separate cluster, because
starting the database costs about 10 s); the rest of the table (docs/pending-reasons.md) is
tested on the parser in test_slurm_shapes.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from epu.common.testing import wait_for
from epu.services.sensor.slurm.backend import SlurmBackend

from tests.support.slurm import SlurmNodeSpec, SlurmPartitionSpec, SlurmTestCluster

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmTestCluster]:
    c = SlurmTestCluster(
        nodes=[SlurmNodeSpec("node1", cpus=2, memory_mb=1000)],
        cloud_nodes=[SlurmNodeSpec("cpu1", cpus=2, memory_mb=2000, state="CLOUD"),
                     SlurmNodeSpec("big1", cpus=4, memory_mb=16000, features=("bigmem",), state="CLOUD"),
                     SlurmNodeSpec("big2", cpus=4, memory_mb=16000, features=("bigmem",), state="CLOUD"),
                     SlurmNodeSpec("gpu1", cpus=2, memory_mb=4000, gpus=2, features=("a100",), state="CLOUD")],
        partitions=[SlurmPartitionSpec("cpu", ["node1", "cpu1"], default=True),
                    SlurmPartitionSpec("bigmem", ["big1", "big2"]),
                    SlurmPartitionSpec("gpu", ["gpu1"])],
        licenses="matlab:1")
    c.start()
    yield c
    c.stop()


@pytest.fixture(scope="module")
def backend(cluster: SlurmTestCluster) -> SlurmBackend:
    return cluster.sensor_backend()


@pytest.fixture(scope="module")
def jobs(cluster: SlurmTestCluster) -> dict[str, str]:
    j = {"array": cluster.sbatch("--array=1-3%1", "-n", "1")}
    wait_for(lambda: "RUNNING" in cluster.run("squeue", "-h", "-o", "%T", "-j", j["array"]).stdout, 30,
             message="first array task running")
    j["lic_run"] = cluster.sbatch("-L", "matlab:1", "-n", "1")
    cluster.wait_job_state(j["lic_run"], "RUNNING")
    j["lic"] = cluster.sbatch("-L", "matlab:1", "-n", "1")
    j["mem"] = cluster.sbatch("-p", "bigmem", "--mem=12000", "-c", "4", "--constraint=bigmem", "--time=2:00:00")
    j["wide"] = cluster.sbatch("-p", "bigmem", "-N", "2", "--ntasks-per-node=2", "--mem-per-cpu=1000")
    j["gpu"] = cluster.sbatch("-p", "gpu", "--gres=gpu:1", "-c", "1", "--time=30")
    j["held"] = cluster.sbatch("--hold", "-n", "1")
    j["dep"] = cluster.sbatch(f"--dependency=afterok:{j['lic_run']}", "-n", "1")
    return j


def shape_of(snapshot, job_id: str):
    return next(s for s in snapshot.shapes if any(i == job_id or i.startswith(f"{job_id}_") for i in s.sample_job_ids))


def test_each_pending_job_has_its_shape_and_reason(cluster: SlurmTestCluster, backend: SlurmBackend,
                                                   jobs: dict[str, str]) -> None:
    def settled():
        snap = backend.snapshot()
        pending = sum(s.count for s in snap.shapes)
        return snap if pending == 2 + 1 + 1 + 1 + 1 + 1 + 1 and all(s.reason != "None" for s in snap.shapes) else None

    snap = wait_for(settled, 30, message="the scheduler evaluated every pending job")
    mem = shape_of(snap, jobs["mem"])
    assert (mem.partition, mem.cores, mem.memory_mb, mem.features, mem.time_limit_s, mem.demand) == \
        ("bigmem", 4, 12000, ["bigmem"], 7200, True)
    wide = shape_of(snap, jobs["wide"])
    assert (wide.nodes, wide.cores, wide.memory_mb, wide.partition, wide.demand) == (2, 2, 2000, "bigmem", True)
    gpu = shape_of(snap, jobs["gpu"])
    assert (gpu.partition, gpu.gpus, gpu.time_limit_s, gpu.demand) == ("gpu", 1, 1800, True)
    held = shape_of(snap, jobs["held"])
    assert (held.demand, held.reason, held.reason_class) == (False, "JobHeldUser", "held")
    dep = shape_of(snap, jobs["dep"])
    assert (dep.demand, dep.reason) == (False, "Dependency")
    lic = shape_of(snap, jobs["lic"])
    assert (lic.demand, lic.reason, lic.reason_class) == (False, "Licenses", "limit")
    arr = shape_of(snap, jobs["array"])
    assert (arr.count, arr.demand, arr.reason, arr.reason_class) == (2, False, "JobArrayTaskLimit", "limit")
    demand = sum(s.count for s in snap.shapes if s.demand)
    assert demand == 3 and snap.running_jobs == 2
    # the JSON read of the same cluster sees the same shapes (the fallback path agrees)
    as_json = SlurmBackend(backend.runner, read_format="json").snapshot()
    assert sorted((s.count, s.nodes, s.cores, s.memory_mb, s.gpus, s.partition, s.demand, s.reason)
                  for s in as_json.shapes) == \
        sorted((s.count, s.nodes, s.cores, s.memory_mb, s.gpus, s.partition, s.demand, s.reason) for s in snap.shapes)


def test_snapshot_command_reports_shapes(cluster: SlurmTestCluster, jobs: dict[str, str]) -> None:
    env = {**os.environ, **cluster.client_env}
    proc = subprocess.run([sys.executable, "-m", "epu.cli", "sensor", "snapshot", "--backend", "slurm", "--json"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    keys = {"count", "nodes", "cores", "memory_mb", "gpus", "features", "partition", "time_limit_s", "demand",
            "reason"}
    assert doc["shapes"] and all(keys <= set(s) for s in doc["shapes"])
    assert doc["queued_jobs"] == sum(s["count"] for s in doc["shapes"] if s["demand"]) == 3
    assert {"JobHeldUser", "Dependency", "Licenses", "JobArrayTaskLimit"} <= \
        {s["reason"] for s in doc["shapes"] if not s["demand"]}
    assert {"backend", "queued_cores", "held_jobs", "blocked_jobs", "running_jobs", "finished_jobs", "jobs",
            "nodes", "warnings"} <= set(doc)


def test_gpu_slot_without_device_files_joins_carries_identity_and_runs_a_gpu_job(
        cluster: SlurmTestCluster, backend: SlurmBackend, jobs: dict[str, str]) -> None:
    cluster.start_slurmd("gpu1")  # the worker daemon comes up first (process site / cloud-init)
    try:
        cluster.wait_node_state("gpu1", lambda s: "POWERED_DOWN" not in s, timeout=60)
        out = backend.execute("add", "gpu1", cores=2, address="127.0.0.1", instance_id="launch-9e1d2c")
        assert out.ok and out.changed and "Comment=epu:instance=launch-9e1d2c" in out.output, out
        node = wait_for(lambda: next((n for n in backend.snapshot().nodes if n.name == "gpu1" and n.gpus_used), None),
                        60, message="the GPU job runs on gpu1")
        assert (node.instance_id, node.gpus, node.gpus_used, node.features, node.partitions) == \
            ("launch-9e1d2c", 2, 1, ["a100"], ["gpu"])
        assert cluster.job_state(jobs["gpu"]) == "RUNNING"
        assert backend.execute("add", "gpu1", cores=2, instance_id="launch-9e1d2c").changed is False
        cluster.run("scancel", jobs["gpu"])
        wait_for(lambda: next((n for n in backend.snapshot().nodes if n.name == "gpu1" and not n.jobs), None), 30,
                 message="gpu1 idle")
        removed = backend.execute("remove", "gpu1")
        assert removed.ok, removed
        assert "epu:instance" not in cluster.run("scontrol", "show", "node", "gpu1").stdout  # identity cleared
    finally:
        cluster.stop_slurmd("gpu1")
