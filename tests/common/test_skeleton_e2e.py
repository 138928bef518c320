"""The walking skeleton end to end: the four services as separate processes on the real
RabbitMQ, a burst of jobs scales the simulated cloud up and back to zero. And the embedded
demo (one process, memory://) does the same and reports its summary."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from epu.common.broker import Broker
from epu.common.messages import TERMINAL_INSTANCE_STATES, InstanceEvent, SensorSnapshot
from epu.common.runtime import Service, run_in_thread
from epu.common.testing import wait_for

from epu.demo import DemoSettings, run_demo

ROOT = Path(__file__).resolve().parents[2]
EPU = [sys.executable, "-m", "epu.cli"]

# The sensor process: the real sensor service with a simulated batch system that receives a
# burst of 12 one-core jobs of 3 s at start (what a user's qsub would do on a real head node).
SENSOR_SCRIPT = r"""
import sys
from epu.common.config import load_config
from epu.common.logs import setup_logging
from epu.services.sensor.app import build_service
from epu.services.sensor.simulated import SimulatedBatch
config = load_config(sys.argv[1])
setup_logging("warning")
batch = SimulatedBatch()
batch.submit(cores=1, duration=3.0, count=12)
service = build_service(config, backend=batch)
service.install_signal_handlers()
service.run()
"""


def write_config(tmp_path: Path, broker: Broker) -> Path:
    text = f"""
[broker]
url = "{broker.url}"
prefix = "{broker.topology.prefix}"

[logging]
level = "warning"

[sensor]
domain = "alpha"
backend = "simulated"
poll_seconds = 1.0

[decision]
iteration_seconds = 0.5
store_url = "sqlite:///{tmp_path}/decision.db"
resend_seconds = 5

[provisioner]
store_url = "sqlite:///{tmp_path}/provisioner.db"
poll_seconds = 0.5
deployment = "e2e"

[ctxbroker]
store_url = "sqlite:///{tmp_path}/ctx.db"
port = 0
admin_token_file = "{tmp_path}/admin-token"

[domains.alpha]
policy = "queue-demand"
max_nodes = 4
sites = ["sim"]
cores_per_node = 2
params = {{ idle_seconds = 1.0, stall_seconds = 30.0 }}

[sites.sim]
driver = "epu-sim"
quota = 10
cores = 2
image = "sim-base"
size = "sim.2core"
driver_args = {{ api_latency = 0.02, boot_time_min = 0.5, boot_time_max = 1.5 }}
"""
    path = tmp_path / "epu.toml"
    path.write_text(text)
    return path


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen]]:
    procs: list[subprocess.Popen] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()


@pytest.mark.rabbitmq
def test_four_services_as_processes_scale_up_and_back_to_zero(broker: Broker, tmp_path: Path,
                                                              processes: list[subprocess.Popen]) -> None:
    config = write_config(tmp_path, broker)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # watch the bus like an operator: every instance event and snapshot
    states: dict[str, str] = {}
    snapshots: list[SensorSnapshot] = []
    lock = threading.Lock()

    def on_event(msg: object, env_: object) -> None:
        with lock:
            if isinstance(msg, InstanceEvent):
                states[msg.instance_id] = msg.state
            elif isinstance(msg, SensorSnapshot):
                snapshots.append(msg)

    tap = Service("test-tap", broker)
    tap.consume_queue(broker.topology.tap_queue("#"), on_event)
    tap_thread = run_in_thread(tap)
    assert tap.wait_ready(15)
    try:
        for service in ("provisioner", "decision", "ctxbroker"):
            processes.append(subprocess.Popen([*EPU, "run", service, "-c", str(config)], env=env, cwd=tmp_path))
        processes.append(subprocess.Popen([sys.executable, "-c", SENSOR_SCRIPT, str(config)], env=env, cwd=tmp_path))

        def live() -> int:
            with lock:
                return sum(1 for s in states.values() if s not in TERMINAL_INSTANCE_STATES)

        def peak_reached() -> bool:
            with lock:
                return len(states) >= 2 and any(s.running_jobs > 0 for s in snapshots)

        wait_for(peak_reached, 60, message="instances launched and jobs running")

        def back_to_zero() -> bool:
            with lock:
                last = snapshots[-1] if snapshots else None
            return (last is not None and last.available and not last.queued_demand() and not last.nodes
                    and last.running_jobs == 0 and live() == 0)

        wait_for(back_to_zero, 90, interval=0.2, message="queue drained and every instance terminated")
        for p in processes:
            assert p.poll() is None, f"a service died: {p.args}"
    finally:
        tap.stop()
        tap_thread.join(10)
    with lock:
        assert 2 <= len(states) <= 4, f"launched within max_nodes: {len(states)}"
        assert set(states.values()) == {"terminated"}
    # graceful stop of every service: exit status 0
    for p in processes:
        p.send_signal(signal.SIGTERM)
    assert [p.wait(20) for p in processes] == [0, 0, 0, 0]


def test_embedded_demo_scales_up_runs_every_job_and_returns_to_zero() -> None:
    s = DemoSettings(jobs=16, job_seconds=2.0, cores_per_node=2, max_nodes=4, boot_seconds=1.0,
                     idle_seconds=0.5, quota_a=2, timeout=90, seed=7)
    summary = run_demo(s, live_display=False, out=None)
    assert summary["timed_out"] is False
    assert summary["jobs_submitted"] == summary["jobs_completed"] == 16
    assert summary["peak_instances"] == 4, "16 one-core jobs on 2-core nodes: max_nodes reached"
    assert summary["instances_by_site"]["cloud-a"] == 2 and summary["instances_by_site"]["cloud-b"] >= 2, \
        "cloud-a's quota of 2 overflows into cloud-b"
    assert summary["final_instances"] == 0 and summary["final_batch_nodes"] == 0
    assert summary["seconds_to_peak"] < summary["seconds_total"]


def test_demo_cli_json_summary_and_help() -> None:
    out = subprocess.run([*EPU, "demo", "--help"], capture_output=True, text=True, check=True).stdout
    for knob in ("--jobs", "--boot-seconds", "--fail-rate", "--json", "Exit status"):
        assert knob in out
    bad = subprocess.run([*EPU, "demo", "--fail-rate", "1.5"], capture_output=True, text=True)
    assert bad.returncode == 2 and "must be in [0, 1)" in bad.stderr
