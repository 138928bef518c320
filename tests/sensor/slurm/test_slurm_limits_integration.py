"""Jobs over a real QOS limit and a real association limit, on Slurm 22.05 with slurmdbd (issue 13).

The cluster (tests/support/slurm_accounting.py): a private MariaDB and slurmdbd, one node of 2
CPUs, ``AccountingStorageEnforce=associations,limits,qos``, and before slurmctld starts:

* QOS ``lim1`` with ``MaxJobsPerUser=1``; account ``aqos`` where root may use it;
* account ``acpu`` where root's association has ``GrpTRES=cpu=1``.

Two 1-CPU jobs under each: the first runs, the second pends with ``QOSMaxJobsPerUserLimit`` /
``AssocGrpCpuLimit`` (slurmctld checks limits before resources, so the full node does not hide
it). A new node would not start it, so the sensor must report it with ``demand: false`` and not
count it in ``queued_jobs``. A 1-CPU job with no limit, waiting for the full node, is the control:
it is demand. (The node has 2 CPUs: slurmd refuses more than the machine has.)
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

from tests.support.slurm import SlurmNodeSpec
from tests.support.slurm_accounting import AccountingCluster

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]

LIMITS = {"qos": ("QOSMaxJobsPerUserLimit", "limit"), "assoc": ("AssocGrpCpuLimit", "limit")}


@pytest.fixture(scope="module")
def cluster() -> Iterator[AccountingCluster]:
    c = AccountingCluster(
        nodes=[SlurmNodeSpec("node1", cpus=2, memory_mb=1000)],
        enforce="associations,limits,qos",
        accounting=[["add", "qos", "lim1", "MaxJobsPerUser=1"],
                    ["add", "account", "aqos"],
                    ["add", "user", "root", "account=aqos", "qos=normal,lim1"],
                    ["add", "account", "acpu"],
                    ["add", "user", "root", "account=acpu", "GrpTRES=cpu=1"]])
    c.start()
    yield c
    c.stop()


@pytest.fixture(scope="module")
def backend(cluster: AccountingCluster) -> SlurmBackend:
    return cluster.sensor_backend()


@pytest.fixture(scope="module")
def jobs(cluster: AccountingCluster) -> dict[str, str]:
    j = {"qos_run": cluster.sbatch("-A", "aqos", "--qos=lim1", "-n", "1"),
         "assoc_run": cluster.sbatch("-A", "acpu", "-n", "1")}
    cluster.wait_job_state(j["qos_run"], "RUNNING")
    cluster.wait_job_state(j["assoc_run"], "RUNNING")
    j["qos"] = cluster.sbatch("-A", "aqos", "--qos=lim1", "-n", "1")
    j["assoc"] = cluster.sbatch("-A", "acpu", "-n", "1")
    j["free"] = cluster.sbatch("-n", "1")  # no limit: waits for the full node (demand)
    return j


def shape_of(snapshot, job_id: str):
    return next(s for s in snapshot.shapes if job_id in s.sample_job_ids)


def test_jobs_over_qos_and_association_limits_are_not_demand(cluster: AccountingCluster, backend: SlurmBackend,
                                                            jobs: dict[str, str]) -> None:
    def settled():
        snap = backend.snapshot()
        reasons = {s.reason for s in snap.shapes}
        return snap if {"QOSMaxJobsPerUserLimit", "AssocGrpCpuLimit"} <= reasons and "None" not in reasons else None

    snap = wait_for(settled, 30, message="the scheduler evaluated every pending job")
    for key, (reason, reason_class) in LIMITS.items():
        shape = shape_of(snap, jobs[key])
        assert (shape.count, shape.cores, shape.demand, shape.reason, shape.reason_class) == \
            (1, 1, False, reason, reason_class), shape
    free = shape_of(snap, jobs["free"])
    assert (free.cores, free.demand, free.reason_class) in {(1, True, "resources"), (1, True, "priority")}, free
    assert (snap.queued_jobs, snap.queued_cores, snap.blocked_jobs, snap.running_jobs) == (1, 1, 2, 2)
    # the JSON read of the same cluster agrees
    as_json = SlurmBackend(backend.runner, read_format="json").snapshot()
    assert sorted((s.count, s.cores, s.demand, s.reason) for s in as_json.shapes) == \
        sorted((s.count, s.cores, s.demand, s.reason) for s in snap.shapes)


def test_snapshot_command_reports_the_limits(cluster: AccountingCluster, jobs: dict[str, str]) -> None:
    env = {**os.environ, **cluster.client_env}
    proc = subprocess.run([sys.executable, "-m", "epu.cli", "sensor", "snapshot", "--backend", "slurm", "--json"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    blocked = {s["reason"]: s for s in doc["shapes"] if not s["demand"]}
    assert {"QOSMaxJobsPerUserLimit", "AssocGrpCpuLimit"} <= set(blocked), doc["shapes"]
    assert doc["queued_jobs"] == 1 and doc["blocked_jobs"] == 2


def test_a_bad_accounting_command_fails_with_sacctmgrs_words_and_stops_everything() -> None:
    """A typo in the set-up must say what sacctmgr said, and leave no daemon behind."""
    c = AccountingCluster(accounting=[["add", "qos", "lim1", "NoSuchLimit=1"]])
    with pytest.raises(RuntimeError, match=r"sacctmgr add qos lim1 NoSuchLimit=1 failed") as err:
        c.start()
    assert "nosuchlimit" in str(err.value).lower()
    assert not c._procs and not c.workdir.exists()
