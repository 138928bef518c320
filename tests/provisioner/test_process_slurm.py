"""The process site with real Slurm: each instance is a dynamic ``slurmd`` that registers as
the instance's node, and terminating the instance stops it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from common.clock import RealClock
from common.messages import LaunchRequest, TerminateRequest
from common.testing import wait_for
from services.provisioner.process_site import ProcessNodeDriver
from tests.support.slurm import SlurmNodeSpec, SlurmTestCluster, find_exe

pytestmark = [pytest.mark.slurm]


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmTestCluster]:
    c = SlurmTestCluster(nodes=[SlurmNodeSpec("head1", cpus=1)])
    c.start()
    yield c
    c.stop()


def test_instances_are_slurmd_workers(cluster: SlurmTestCluster, tmp_path, make_provisioner) -> None:
    argv = [find_exe("slurmd"), "-D", "-N", "{node_name}", "-f", str(cluster.conf_path), "-Z", "--conf",
            "CPUs=1 RealMemory=500 NodeHostname=localhost NodeAddr=127.0.0.1"]
    site = ProcessNodeDriver(argv=argv, env=cluster.client_env, path=str(tmp_path / "procs.db"), stop_timeout=15)
    prov, events = make_provisioner({"slurm": site}, site_kw={"driver": "epu-process"}, clock_=RealClock())
    prov.handle_launch(LaunchRequest(launch_id="s1", domain="alpha", site="slurm", node_name="elastic1"))
    assert prov.wait_idle(15)
    wait_for(lambda: "elastic1" in cluster.node_states(), timeout=30, message="slurmd registered elastic1")
    states = cluster.wait_node_state("elastic1", lambda s: "IDLE" in s, timeout=30)
    assert "IDLE" in states
    prov.poll("slurm")
    assert prov.store.get("s1").state == "started"

    prov.handle_terminate(TerminateRequest(request_id="t", instance_id="s1", domain="alpha"))
    assert prov.wait_idle(30)
    wait_for(lambda: site.list_nodes()[0].state.value == "terminated", timeout=20, message="slurmd stopped")
    prov.poll("slurm")
    assert events.states("s1")[-2:] == ["terminating", "terminated"]
