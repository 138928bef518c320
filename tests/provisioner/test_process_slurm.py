"""The process site with real Slurm: each instance is a ``slurmd`` serving a pre-declared CLOUD
pool node on its own port (how several workers share one host; see docs/sensor.md), and
terminating the instance stops it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from epu.common.clock import RealClock
from epu.common.messages import LaunchRequest, TerminateRequest
from epu.common.testing import wait_for
from epu.services.provisioner.process_site import ProcessNodeDriver

from tests.support.slurm import SlurmNodeSpec, SlurmTestCluster, find_exe, free_port

pytestmark = [pytest.mark.slurm]


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmTestCluster]:
    c = SlurmTestCluster(nodes=[SlurmNodeSpec("head1", cpus=1)],
                         cloud_nodes=[SlurmNodeSpec("elastic1", cpus=1, port=free_port(), state="CLOUD")])
    c.start()
    yield c
    c.stop()


def test_instances_are_slurmd_workers(cluster: SlurmTestCluster, tmp_path, make_provisioner) -> None:
    (cluster.workdir / "spool" / "slurmd.elastic1").mkdir(parents=True, exist_ok=True)
    argv = [find_exe("slurmd"), "-D", "-N", "{node_name}", "-f", str(cluster.conf_path)]
    site = ProcessNodeDriver(argv=argv, env=cluster.client_env, path=str(tmp_path / "procs.db"), stop_timeout=15)
    prov, events = make_provisioner({"slurm": site}, site_kw={"driver": "epu-process"}, clock_=RealClock())
    try:
        _launch_use_and_terminate(cluster, site, prov, events)
    finally:  # never leave a slurmd behind, even when an assertion failed
        for n in site.list_nodes():
            if n.state.value != "terminated":
                site.destroy_node(n)


def _launch_use_and_terminate(cluster: SlurmTestCluster, site: ProcessNodeDriver, prov, events) -> None:
    prov.handle_launch(LaunchRequest(launch_id="s1", domain="alpha", site="slurm", node_name="elastic1"))
    assert prov.wait_idle(15)
    # what the sensor's "add" does for a pool node: power it up, then it serves jobs
    cluster.run("scontrol", "update", "NodeName=elastic1", "State=POWER_UP")
    cluster.run("scontrol", "update", "NodeName=elastic1", "State=RESUME", check=False)
    states = cluster.wait_node_state("elastic1", lambda s: "IDLE" in s and "POWERED_DOWN" not in s
                                     and "NOT_RESPONDING" not in s and "POWERING_UP" not in s
                                     and "DRAIN" not in s,
                                     timeout=60)
    assert "IDLE" in states and not {"POWERING_UP", "POWERED_DOWN", "NOT_RESPONDING"} & set(states), states
    # the worker really serves: a job step runs on it
    out = cluster.run("srun", "-w", "elastic1", "-N1", "-t", "1", "echo", "ran-on-elastic1", timeout=60)
    assert "ran-on-elastic1" in out.stdout
    prov.poll("slurm")
    assert prov.store.get("s1").state == "started"

    prov.handle_terminate(TerminateRequest(request_id="t", instance_id="s1", domain="alpha"))
    assert prov.wait_idle(30)
    wait_for(lambda: site.list_nodes()[0].state.value == "terminated", timeout=20, message="slurmd stopped")
    prov.poll("slurm")
    assert events.states("s1")[-2:] == ["terminating", "terminated"]
