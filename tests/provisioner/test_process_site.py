"""The process site starts and stops real worker processes, through the provisioner."""

from __future__ import annotations

import sys
from pathlib import Path

from epu.common.clock import RealClock
from epu.common.messages import LaunchRequest, TerminateRequest
from epu.common.testing import wait_for
from epu.services.provisioner.process_site import ProcessNodeDriver, _start_ticks

WORKER = (
    "import pathlib, signal, sys, time\n"
    "out = pathlib.Path(sys.argv[2]) / (sys.argv[1] + '.alive')\n"
    "out.write_text(sys.argv[1])\n"
    "signal.signal(signal.SIGTERM, lambda *a: (out.unlink(), sys.exit(0)))\n"
    "while True: time.sleep(0.05)\n"
)


def driver(tmp_path: Path, **kw: object) -> ProcessNodeDriver:
    return ProcessNodeDriver(argv=[sys.executable, "-c", WORKER, "{node_name}", str(tmp_path)],
                             path=str(tmp_path / "procs.db"), stop_timeout=5, **kw)


def alive(pid: int) -> bool:
    return _start_ticks(pid) is not None


def test_process_site_runs_real_workers(tmp_path, make_provisioner) -> None:
    site = driver(tmp_path)
    prov, events = make_provisioner({"local": site}, site_kw={"driver": "epu-process", "image": "local",
                                                              "size": "local"}, clock_=RealClock())
    for i in (1, 2):
        prov.handle_launch(LaunchRequest(launch_id=f"p{i}", domain="alpha", site="local", node_name=f"pw{i}"))
    prov.handle_launch(LaunchRequest(launch_id="p1", domain="alpha", site="local", node_name="pw1"))
    assert prov.wait_idle(10)
    wait_for(lambda: (tmp_path / "pw1.alive").exists() and (tmp_path / "pw2.alive").exists(),
             message="both workers running")
    nodes = site.list_nodes()
    assert len(nodes) == 2 and all(alive(n.extra["pid"]) for n in nodes)
    prov.poll("local")
    assert events.states("p1") == ["requested", "started"]
    assert events.for_("p1")[-1].ip == "127.0.0.1"

    # a restarted provisioner (new driver object on the same state) still sees and stops them
    again = driver(tmp_path)
    assert {n.id for n in again.list_nodes()} == {n.id for n in nodes}
    prov.handle_terminate(TerminateRequest(request_id="t", instance_id="p1", domain="alpha"))
    assert prov.wait_idle(10)
    pid1 = next(n.extra["pid"] for n in nodes if n.name == "pw1")
    wait_for(lambda: not alive(pid1), message="worker pw1 stopped")
    assert not (tmp_path / "pw1.alive").exists()  # it got SIGTERM and cleaned up
    prov.poll("local")
    assert prov.store.get("p1").state == "terminated"
    assert prov.store.get("p2").state == "started"
    # and the other one, so the test leaves no process behind
    prov.handle_terminate(TerminateRequest(request_id="t2", instance_id="p2", domain="alpha"))
    assert prov.wait_idle(10)
    pid2 = next(n.extra["pid"] for n in nodes if n.name == "pw2")
    wait_for(lambda: not alive(pid2), message="worker pw2 stopped")
    assert not (tmp_path / "pw2.alive").exists()


def test_worker_that_dies_is_failed_and_argv_never_uses_a_shell(tmp_path, make_provisioner) -> None:
    site = ProcessNodeDriver(argv=[sys.executable, "-c", "import sys; sys.exit(3)", "{node_name}"],
                             path=str(tmp_path / "p.db"))
    prov, events = make_provisioner({"local": site}, site_kw={"driver": "epu-process"}, clock_=RealClock())
    # a node name with shell metacharacters stays one argv element
    prov.handle_launch(LaunchRequest(launch_id="d1", domain="alpha", site="local", node_name="a-b"))
    assert prov.wait_idle(10)
    wait_for(lambda: site.list_nodes()[0].state.value == "error", message="worker exit noticed")
    prov.poll("local")
    assert events.states("d1")[-1] == "failed"


STUBBORN = (  # ignores SIGTERM, as a worker still draining would; says when it does
    "import pathlib, signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "pathlib.Path(sys.argv[1]).write_text('ready')\n"
    "while True: time.sleep(0.05)\n"
)


def test_worker_exiting_during_a_stop_is_terminated_not_failed(tmp_path) -> None:
    """A poll that lands while ``destroy_node`` waits for the worker to exit must not take the
    exit for a crash: the stop is recorded before the signal, so a second driver on the same
    state (another poll, or a provisioner restarted mid-stop) reports STOPPING, then TERMINATED."""
    import os
    import signal
    import threading

    ready = tmp_path / "ready"
    site = ProcessNodeDriver(argv=[sys.executable, "-c", STUBBORN, str(ready)], path=str(tmp_path / "p.db"),
                             stop_timeout=30)
    node = site.create_node(name="slow")
    wait_for(ready.exists, message="worker ignoring SIGTERM")
    stopper = threading.Thread(target=site.destroy_node, args=(node,))
    stopper.start()
    try:
        observer = ProcessNodeDriver(argv=["unused"], path=str(tmp_path / "p.db"))
        wait_for(lambda: observer.list_nodes()[0].state.value == "stopping", message="stop recorded")
        os.killpg(node.extra["pid"], signal.SIGKILL)  # the worker goes, destroy_node still waiting
        wait_for(lambda: not alive(node.extra["pid"]), message="worker gone")
        assert observer.list_nodes()[0].state.value == "terminated"
    finally:
        stopper.join(35)
    assert observer.list_nodes()[0].state.value == "terminated"
