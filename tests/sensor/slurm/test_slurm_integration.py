"""The Slurm backend against real slurmctld/slurmd daemons (started in a temp dir).

One cluster per module: a static node ``node1`` (2 CPUs) and a CLOUD pool ``el1``/``el2``
(2 CPUs each, held drained until EPU adds them). ``el1``'s slurmd is started the way the
provisioner's process site does it, before the sensor's ``add``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from epu.common.testing import wait_for
from epu.services.sensor.runner import CommandRunner
from epu.services.sensor.slurm.backend import SlurmBackend

from tests.support.slurm import SlurmNodeSpec, SlurmTestCluster

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmTestCluster]:
    c = SlurmTestCluster(nodes=[SlurmNodeSpec("node1", cpus=2)],
                         cloud_nodes=[SlurmNodeSpec("el1", cpus=2, state="CLOUD"),
                                      SlurmNodeSpec("el2", cpus=2, state="CLOUD")])
    c.start()
    yield c
    c.stop()


@pytest.fixture
def backend(cluster: SlurmTestCluster) -> Iterator[SlurmBackend]:
    yield SlurmBackend(CommandRunner(timeout=30, env=cluster.client_env))
    cluster.cancel_all()
    wait_for(lambda: not cluster.run("squeue", "-h").stdout.strip(), 30, message="queue empty")


def node(backend: SlurmBackend, name: str):
    return next((n for n in backend.snapshot().nodes if n.name == name), None)


def test_queued_running_held_blocked_and_arrays(cluster: SlurmTestCluster, backend: SlurmBackend) -> None:
    running = cluster.sbatch("-n", "1", "--account=physics")
    cluster.wait_job_state(running, "RUNNING")
    held = cluster.sbatch("--hold")
    blocked = cluster.sbatch(f"--dependency=afterok:{running}")
    array = cluster.sbatch("--array=1-3", "-c", "2")
    wide = cluster.sbatch("-N", "2", "-n", "2")
    wait_for(lambda: cluster.job_state(wide) == "PENDING", 10, message="wide job pending")

    snap = backend.snapshot()
    by_id = {j.job_id: j for j in snap.jobs}
    assert snap.running_jobs == 1
    assert snap.owners == {running: ["physics", "root", "debug"]}  # the text read (the default) too
    assert by_id[held].state == "held"
    assert by_id[blocked].state == "blocked"
    arr = by_id[f"{array}_[1-3]"]
    assert (arr.state, arr.count, arr.cores, arr.nodes) == ("queued", 3, 2, 1)
    assert (by_id[wide].state, by_id[wide].nodes, by_id[wide].cores) == ("queued", 2, 1)
    assert snap.queued_jobs == 4 and snap.held_jobs == 1 and snap.blocked_jobs == 1
    assert snap.queued_cores == 3 * 2 + 2
    n1 = next(n for n in snap.nodes if n.name == "node1")
    assert n1.state == "free" and n1.cores == 2 and n1.cores_used == 1 and n1.jobs == [running]
    # unused pool slots are not workers: not reported
    assert {n.name for n in snap.nodes} == {"node1"}
    assert all(j.wait_seconds >= 0 and j.queue == "debug" for j in snap.jobs)


def test_add_drain_resume_remove_cloud_node(cluster: SlurmTestCluster, backend: SlurmBackend) -> None:
    cluster.start_slurmd("el1")  # the worker daemon comes up first (process site / cloud-init)
    cluster.wait_node_state("el1", lambda s: "POWERED_DOWN" not in s)  # registered, still drained
    out = backend.execute("add", "el1", cores=2, address="127.0.0.1")
    assert out.ok, out
    assert out.changed
    n = wait_for(lambda: (x := node(backend, "el1")) and x.state == "free" and x, 60, message="el1 free")
    assert n.cores == 2 and n.cores_used == 0
    again = backend.execute("add", "el1", cores=2)
    assert again.ok and not again.changed

    job = cluster.sbatch("-w", "el1", "-n", "2")
    cluster.wait_job_state(job, "RUNNING")
    n = node(backend, "el1")
    assert n.state == "busy" and n.jobs == [job] and n.cores_used == 2

    drained = backend.execute("offline", "el1", reason="epu: scale down\nnext line")
    assert drained.ok and drained.changed
    n = node(backend, "el1")
    assert n.state == "offline" and n.jobs == [job]  # draining: the job keeps running
    assert "DRAIN" in n.native_state
    assert cluster.job_state(job) == "RUNNING"
    assert backend.execute("offline", "el1").changed is False

    refused = backend.execute("remove", "el1")
    assert not refused.ok and "runs jobs" in (refused.error or "")
    assert cluster.job_state(job) == "RUNNING"

    resumed = backend.execute("online", "el1")
    assert resumed.ok and resumed.changed
    wait_for(lambda: (x := node(backend, "el1")) and x.state == "busy" and x.jobs == [job], 30,
             message="el1 back in service, still running its job")

    cluster.run("scancel", job)
    wait_for(lambda: (x := node(backend, "el1")) and x.state == "free" and x.cores_used == 0, 30,
             message="el1 idle after scancel")
    removed = backend.execute("remove", "el1", reason="epu: terminate")
    assert removed.ok and removed.changed, removed
    wait_for(lambda: node(backend, "el1") is None, 60, message="el1 back in the pool (powered down)")
    tokens = cluster.node_states()["el1"]
    assert "POWERED_DOWN" in tokens and "DRAIN" in tokens
    assert backend.execute("remove", "el1").ok  # idempotent
    assert backend.execute("remove", "nosuchnode").ok  # already gone


def test_dynamic_add_mode_creates_runs_and_deletes_a_node(cluster: SlurmTestCluster, backend: SlurmBackend) -> None:
    """``add_mode = "dynamic"`` against the real daemons: ``add`` creates a node Slurm's
    configuration does not know (``scontrol create ... State=FUTURE``), the worker's
    ``slurmd -Z`` registers into it (on the global SlurmdPort: one such node per host), it runs
    a job, and ``remove`` deletes it."""
    dynamic = SlurmBackend(CommandRunner(timeout=30, env=cluster.client_env), add_mode="dynamic")
    out = dynamic.execute("add", "dyn1", cores=2, address="127.0.0.1")
    assert out.ok and out.changed and "create NodeName=dyn1 CPUs=2 State=FUTURE" in out.output, out
    assert node(dynamic, "dyn1") is None  # a FUTURE node is no worker until its slurmd registers
    cluster.start_slurmd("dyn1", dynamic=True)
    try:
        n = wait_for(lambda: (x := node(dynamic, "dyn1")) and x.state == "free" and x, 60, message="dyn1 free")
        assert n.cores == 2 and "DYNAMIC_NORM" in n.native_state
        again = dynamic.execute("add", "dyn1", cores=2)
        assert again.ok and not again.changed

        job = cluster.sbatch("-w", "dyn1", "-n", "2")
        cluster.wait_job_state(job, "RUNNING")
        assert node(dynamic, "dyn1").jobs == [job]
        refused = dynamic.execute("remove", "dyn1")
        assert not refused.ok and "runs jobs" in (refused.error or "")
        cluster.run("scancel", job)
        wait_for(lambda: (x := node(dynamic, "dyn1")) and x.state == "free" and x.cores_used == 0, 30,
                 message="dyn1 idle after scancel")

        removed = dynamic.execute("remove", "dyn1", reason="epu: terminate")
        assert removed.ok and removed.changed and "delete NodeName=dyn1" in removed.output, removed
        assert node(dynamic, "dyn1") is None
        assert cluster.run("scontrol", "show", "node", "dyn1", check=False).returncode != 0
        assert dynamic.execute("remove", "dyn1").ok  # already gone
    finally:
        cluster.stop_slurmd("dyn1")


def test_drained_pool_slot_is_never_scheduled_by_slurm(cluster: SlurmTestCluster, backend: SlurmBackend) -> None:
    wide = cluster.sbatch("-N", "2", "-n", "2")
    wait_for(lambda: any(j.job_id == wide for j in backend.snapshot().jobs), 10, message="job seen")
    snap = backend.snapshot()
    assert [j.state for j in snap.jobs if j.job_id == wide] == ["queued"]
    assert "POWERING_UP" not in cluster.node_states()["el2"]


def test_commands_on_unknown_nodes_and_errors(backend: SlurmBackend) -> None:
    out = backend.execute("offline", "ghost01")
    assert not out.ok and "not known" in (out.error or "")
    out = backend.execute("add", "ghost01", cores=2)
    assert not out.ok and "CLOUD pool" in (out.error or "")


def test_unavailable_when_controller_unreachable(cluster: SlurmTestCluster, tmp_path) -> None:
    conf = tmp_path / "slurm.conf"
    text = cluster.conf_path.read_text().replace(f"SlurmctldPort={cluster.ctld_port}", "SlurmctldPort=1")
    conf.write_text(text)
    b = SlurmBackend(CommandRunner(timeout=20, env={"SLURM_CONF": str(conf)}))
    from epu.services.sensor.backend import BackendUnavailable

    with pytest.raises(BackendUnavailable):
        b.snapshot()


def test_snapshot_command_on_the_real_head_node(cluster: SlurmTestCluster, backend: SlurmBackend) -> None:
    job = cluster.sbatch("-n", "1")
    cluster.wait_job_state(job, "RUNNING")
    held = cluster.sbatch("--hold")
    env = {**os.environ, **cluster.client_env}
    proc = subprocess.run([sys.executable, "-m", "epu.cli", "sensor", "snapshot", "--backend", "slurm", "--json"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["queued_jobs"] == 0 and doc["queued_cores"] == 0 and doc["held_jobs"] == 1
    assert {"name": "node1", "state": "free", "cores": 2, "cores_used": 1, "jobs": [job]}.items() <= \
        {k: v for n in doc["nodes"] if n["name"] == "node1" for k, v in n.items()}.items()
    assert any(j["job_id"] == held and j["state"] == "held" for j in doc["jobs"])
    table = subprocess.run([sys.executable, "-m", "epu.cli", "sensor", "snapshot", "--backend", "slurm"],
                           capture_output=True, text=True, env=env, timeout=60)
    assert table.returncode == 0 and "node1" in table.stdout and "held" in table.stdout


def test_a_preempted_nodes_jobs_are_requeued_and_the_node_removed(cluster: SlurmTestCluster,
                                                                   backend: SlurmBackend) -> None:
    """The cloud took the machine (slurmd killed): Slurm still counts the job there; the requeue
    the engine asks for with a preempted node's remove puts it back in the queue."""
    cluster.start_slurmd("el2")
    cluster.wait_node_state("el2", lambda s: "POWERED_DOWN" not in s)
    assert backend.execute("add", "el2", cores=2, address="127.0.0.1").ok
    wait_for(lambda: (x := node(backend, "el2")) and x.state == "free", 60, message="el2 free")
    job = cluster.sbatch("-w", "el2", "-n", "1")
    cluster.wait_job_state(job, "RUNNING")
    cluster.stop_slurmd("el2", kill=True)
    assert cluster.job_state(job) == "RUNNING"  # Slurm has not noticed (SlurmdTimeout)

    requeued = backend.requeue_jobs("el2", "preempted by the cloud")
    assert requeued.ok and requeued.changed and f"scontrol requeue {job}" in requeued.output, requeued
    removed = backend.execute("remove", "el2", reason="preempted by the cloud", force=True)
    assert removed.ok, removed
    wait_for(lambda: cluster.job_state(job) == "PENDING", 60, message=f"job {job} back in the queue")
    wait_for(lambda: node(backend, "el2") is None, 60, message="el2 back in the pool")
    assert backend.requeue_jobs("el2").ok  # nothing left there: nothing to do


def test_an_interrupted_live_nodes_jobs_are_requeued_before_the_machine_goes(cluster: SlurmTestCluster,
                                                                              backend: SlurmBackend) -> None:
    """An interruption notice (the cloud will take the machine in ~2 minutes): the same remove
    with requeue, while slurmd still runs — the running job goes back to the queue at once and
    the slot back to the pool, before the machine dies."""
    cluster.cancel_all()  # earlier tests' jobs pinned to el2 would take it first
    cluster.start_slurmd("el2")
    try:
        cluster.wait_node_state("el2", lambda s: "POWERED_DOWN" not in s)
        assert backend.execute("add", "el2", cores=2, address="127.0.0.1").ok
        wait_for(lambda: (x := node(backend, "el2")) and x.state == "free", 60, message="el2 free")
        job = cluster.sbatch("-w", "el2", "-n", "1")
        cluster.wait_job_state(job, "RUNNING")
        requeued = backend.requeue_jobs("el2", "interruption notice from the cloud")
        assert requeued.ok and f"scontrol requeue {job}" in requeued.output, requeued
        assert cluster.slurmd_running("el2")  # the machine is still there
        removed = backend.execute("remove", "el2", reason="interruption notice", force=True)
        assert removed.ok, removed
        wait_for(lambda: cluster.job_state(job) == "PENDING", 60, message=f"job {job} back in the queue")
        wait_for(lambda: node(backend, "el2") is None, 60, message="el2 back in the pool")
    finally:
        cluster.stop_slurmd("el2")
