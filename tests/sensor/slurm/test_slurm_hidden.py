"""Issue 33: the Slurm backend reads with ``--all``, against real slurmctld/slurmd daemons.

Slurm leaves out the partitions configured ``Hidden=YES`` from what any user but root sees, unless
the command asks for ``--all``: their jobs, and a node that is in no other partition. The sensor
on a real head node runs as ``SlurmUser`` or an operator, not necessarily root; here its
commands run as ``nobody`` (``setpriv``), the backend's own argument lists unchanged. Without
``--all`` a suspended job in a hidden partition was invisible to the removal check (``squeue -w``)
— the job the check exists for — and a node only in a hidden partition was "not found", so its
``remove`` answered "already removed" while it held that job.

``PrivateData=jobs`` is not a flag's matter: it hides other users' jobs from everyone but root,
``SlurmUser`` and operators, which the sensor's user must be (``scontrol update`` needs it)."""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterator, Sequence

import pytest
from epu.services.sensor.runner import CommandResult, CommandRunner
from epu.services.sensor.slurm.backend import SlurmBackend

from tests.support.slurm import SlurmNodeSpec, SlurmPartitionSpec, SlurmTestCluster, find_exe

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(240)]


class AsUser(CommandRunner):
    """The real runner, each command run as ``user`` (what a sensor not running as root sees)."""

    def __init__(self, user: str, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        entry = pwd.getpwnam(user)
        self.prefix = [find_exe("setpriv"), f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--clear-groups",
                       "--"]
        self.seen: list[tuple[str, ...]] = []

    def run(self, argv: Sequence[str], timeout: float | None = None) -> CommandResult:
        self.seen.append(tuple(argv))
        res = super().run([*self.prefix, *argv], timeout)
        return CommandResult(tuple(argv), res.returncode, res.stdout, res.stderr, res.timed_out)


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmTestCluster]:
    c = SlurmTestCluster(nodes=[SlurmNodeSpec("node1"), SlurmNodeSpec("node2")],
                         partitions=[SlurmPartitionSpec("debug", ["node1"], default=True),
                                     SlurmPartitionSpec("hidden", ["node1", "node2"], extra="Hidden=YES")])
    c.start()
    os.chmod(c.workdir / "munge", 0o755)  # the cluster's private munged: reachable by other users
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def suspended(cluster: SlurmTestCluster) -> Iterator[str]:
    """A job of the hidden partition on node2, suspended: it holds no CPU, yet dies with the VM."""
    job = cluster.sbatch("-p", "hidden", "-w", "node2", "-n", "1")
    cluster.wait_job_state(job, "RUNNING")
    cluster.run("scontrol", "suspend", job)
    cluster.wait_job_state(job, "SUSPENDED")
    yield job
    cluster.cancel_all()


@pytest.fixture
def backend(cluster: SlurmTestCluster) -> SlurmBackend:
    runner = AsUser("nobody", timeout=30, env={**cluster.client_env, "SLURM_BITSTR_LEN": "0"})
    return SlurmBackend(runner, settle_seconds=0)


def test_the_removal_check_sees_a_suspended_job_of_a_hidden_partition(backend: SlurmBackend, suspended: str) -> None:
    assert backend.jobs_on_node("node2") == [suspended]
    assert backend.node_fields("node2") is not None, "a node only in a hidden partition read as unknown"
    removed = backend.execute("remove", "node2", reason="idle")
    assert not removed.ok and "already removed" not in removed.output, removed
    assert suspended in removed.error or "still runs jobs" in removed.error, removed


@pytest.mark.parametrize("read_format", ["text", "json"])
def test_a_snapshot_shows_the_hidden_partitions_nodes_and_jobs(cluster: SlurmTestCluster, backend: SlurmBackend,
                                                               suspended: str, read_format: str) -> None:
    backend.read_format = read_format
    obs = backend.snapshot()
    assert "node2" in {n.name for n in obs.nodes}
    assert suspended in {j for n in obs.nodes for j in n.jobs}, [(n.name, n.jobs) for n in obs.nodes]
    for argv in backend.runner.seen:  # type: ignore[attr-defined]
        if os.path.basename(argv[0]) in ("squeue", "sinfo") or argv[1:3] == ("show", "nodes"):
            assert "--all" in argv, argv
