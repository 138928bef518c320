"""Several provisioners and two engines on one PostgreSQL, as separate processes on the real
RabbitMQ: a 300-instance scale-up during which a provisioner and the active engine are each
``kill -9``-ed and restarted several times (issue 12). It must end with no orphan (every cloud
node ever made is in the provisioner store, none live), no duplicate (one cloud node per launch,
one launch per batch node name), the domain's 300 never exceeded at any instant (computed from
the cloud's own create/terminate times, not sampled), and back to zero.

The cloud is the simulated one, shared by the provisioners through its SQLite file; the batch
system is the simulated one inside the real sensor service (it adds and removes nodes on the
engine's commands), so the whole loop is the services' own."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from epu.common.broker import Broker
from epu.common.testing import wait_for
from epu.services.provisioner.cloud import TAG_LAUNCH
from epu.services.provisioner.store import Store as ProvisionerStore

from tests.conftest import fresh_pg_database
from tests.support.health import health
from tests.support.tcpproxy import TcpProxy

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]
ROOT = Path(__file__).resolve().parents[2]
INSTANCES = 300

SENSOR_SCRIPT = r"""
import sys
from epu.common.config import load_config
from epu.common.logs import setup_logging
from epu.services.sensor.app import build_service
from epu.services.sensor.simulated import SimulatedBatch
config = load_config(sys.argv[1])
setup_logging("warning")
batch = SimulatedBatch()
batch.submit(cores=1, duration=float(sys.argv[3]), count=int(sys.argv[2]))
service = build_service(config, backend=batch)
service.install_signal_handlers()
service.run()
"""

CONFIG = """
[broker]
url = "{url}"
prefix = "{prefix}"
heartbeat = 4
[logging]
level = "warning"
[sensor]
domain = "storm"
backend = "simulated"
poll_seconds = 0.5
[decision]
store_url = "{decision_store}"
iteration_seconds = 0.5
resend_seconds = 5
active_window_seconds = 10
metrics_port = {port}
[provisioner]
store_url = "{provisioner_store}"
deployment = "storm"
poll_seconds = 1.0
reconcile_seconds = 3.0
orphan_grace_seconds = 5.0
max_destroys_per_reconcile = 400
metrics_port = {port}
[domains.storm]
policy = "queue-demand"
max_nodes = {n}
sites = ["sim"]
cores_per_node = 1
params = {{ idle_seconds = 2.0, stall_seconds = 120.0 }}
[sites.sim]
driver = "epu-sim"
quota = {n}
cores = 1
image = "sim-base"
size = "sim.1core"
driver_args = {{ path = "{cloud}", quota = {cloud_quota}, api_latency = 0.005, boot_time_min = 0.5, boot_time_max = 2.0 }}
"""


class Fleet:
    """The service processes, each restartable under its name, with its own config (port) and log."""

    def __init__(self, tmp: Path, fields: dict[str, str]) -> None:
        self.tmp, self.fields = tmp, fields
        self.procs: dict[str, subprocess.Popen] = {}
        self.ports: dict[str, int] = {}
        self.kills: Counter[str] = Counter()
        self.argv: dict[str, list[str]] = {}
        self.extra: dict[str, list[str]] = {}
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("EPU_")}
        self.env["PYTHONPATH"] = str(ROOT)

    def start(self, name: str, argv: list[str]) -> None:
        port = self.ports.setdefault(name, TcpProxy._free_port())
        cfg = self.tmp / f"{name}.toml"
        cfg.write_text(CONFIG.format(port=port, **self.fields))
        log = (self.tmp / f"{name}.log").open("a")
        self.procs[name] = subprocess.Popen([sys.executable, *argv, str(cfg), *self.extra.get(name, [])],
                                            env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=self.tmp)
        self.argv[name] = argv

    def kill9_and_restart(self, name: str) -> None:
        self.procs[name].send_signal(signal.SIGKILL)
        self.procs[name].wait(10)
        self.kills[name.rstrip("0123456789")] += 1
        self.start(name, self.argv[name])

    def active_engine(self) -> str | None:
        for name in ("engine1", "engine2"):
            if health(self.ports[name]).get("domains", {}).get("storm") == "active":
                return name
        return None

    def stop(self) -> dict[str, int | None]:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        codes = {}
        for name, p in self.procs.items():
            try:
                codes[name] = p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                codes[name] = None
        return codes


@pytest.fixture
def second_pg_url() -> Iterator[str]:
    """The provisioner's own database: both stores have an ``instances`` table."""
    with fresh_pg_database() as url:
        yield url


class Cloud:
    """Reads the simulated cloud's table directly: what was ever created, and when it ended."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def rows(self) -> list[tuple[float, float | None, str, str]]:
        if not self.path.exists():
            return []
        with sqlite3.connect(self.path, timeout=30) as db:
            try:
                return [(c, t, name, json.loads(tags).get(TAG_LAUNCH, ""))
                        for c, t, name, tags in db.execute("SELECT created_at, terminated_at, name, tags FROM nodes")]
            except sqlite3.OperationalError:  # the table is not made yet
                return []

    def created(self) -> int:
        return len(self.rows())

    def live(self) -> int:
        return sum(1 for _c, t, _n, _l in self.rows() if t is None)

    def peak(self) -> int:
        """Most nodes alive at one instant, from the cloud's own timestamps."""
        edges = sorted([(c, 1) for c, _t, _n, _l in self.rows()] +
                       [(t, -1) for _c, t, _n, _l in self.rows() if t is not None], key=lambda e: (e[0], e[1]))
        peak = cur = 0
        for _at, step in edges:
            cur += step
            peak = max(peak, cur)
        return peak


def test_kill9_storm_300_instances_no_orphan_no_duplicate_within_quota_back_to_zero(
        broker: Broker, pg_url: str, second_pg_url: str, tmp_path: Path) -> None:
    cloud = Cloud(tmp_path / "cloud.db")
    fleet = Fleet(tmp_path, {"url": broker.url, "prefix": broker.topology.prefix, "decision_store": pg_url,
                             "provisioner_store": second_pg_url, "n": str(INSTANCES), "cloud": str(cloud.path),
                             "cloud_quota": str(INSTANCES * 2)})
    fleet.extra = {"sensor": [str(INSTANCES), "25"]}
    codes: dict[str, int | None] = {}
    try:
        for name in ("prov1", "prov2", "prov3"):
            fleet.start(name, ["-m", "epu", "run", "provisioner", "-c"])
        for name in ("engine1", "engine2"):
            fleet.start(name, ["-m", "epu", "run", "decision", "-c"])
        for name in ("engine1", "engine2", "prov1", "prov2", "prov3"):
            wait_for(lambda n=name: health(fleet.ports[n]).get("status") == "serving", 60,
                     message=f"{name} serving")
        fleet.start("sensor", ["-c", SENSOR_SCRIPT])

        # kill -9 a provisioner and the active engine at several points of the scale-up
        for step, at in enumerate((30, 100, 170, 240)):
            wait_for(lambda a=at: cloud.created() >= a, 120, interval=0.1, message=f"{at} instances created")
            fleet.kill9_and_restart(f"prov{step % 3 + 1}")
            active = wait_for(fleet.active_engine, 60, interval=0.1, message="an active engine")
            fleet.kill9_and_restart(active)
        wait_for(lambda: cloud.created() >= INSTANCES, 180, interval=0.2, message=f"{INSTANCES} instances created")
        active = wait_for(fleet.active_engine, 60, interval=0.1, message="an active engine")
        fleet.kill9_and_restart(active)  # once more, on the way down
        wait_for(lambda: cloud.created() > 0 and cloud.live() == 0, 300, interval=0.5,
                 message="every instance terminated (back to zero)")
        store = ProvisionerStore(second_pg_url)
        try:
            wait_for(lambda: all(r.state in ("terminated", "failed") for r in store.list()), 60, interval=0.5,
                     message="every store record terminal")
            records = {r.instance_id: r for r in store.list()}
        finally:
            store.close()
        for name, p in fleet.procs.items():
            assert p.poll() is None, f"{name} died: {(tmp_path / f'{name}.log').read_text()[-3000:]}"
    finally:
        codes = fleet.stop()

    rows = cloud.rows()
    per_launch = Counter(launch for _c, _t, _n, launch in rows)
    per_name = Counter(name for _c, _t, name, _l in rows)
    figures = {"cloud_nodes": len(rows), "launches_in_store": len(records), "peak_live": cloud.peak(),
               "kills": dict(fleet.kills), "duplicate_launches": sum(c - 1 for c in per_launch.values() if c > 1),
               "orphans": len(set(per_launch) - set(records))}
    print("kill storm:", json.dumps(figures))
    assert fleet.kills == {"prov": 4, "engine": 5}
    assert len(rows) >= INSTANCES
    assert figures["duplicate_launches"] == 0, [k for k, c in per_launch.items() if c > 1][:5]
    assert max(per_name.values()) == 1, "two cloud nodes for one batch node name"
    assert figures["orphans"] == 0, sorted(set(per_launch) - set(records))[:5]
    assert all(t is not None for _c, t, _n, _l in rows), "back to zero in the cloud"
    assert figures["peak_live"] <= INSTANCES, f"the domain's {INSTANCES} exceeded: {figures['peak_live']} at once"
    assert set(codes.values()) == {0}, codes
    for name in fleet.procs:
        text = (tmp_path / f"{name}.log").read_text()
        assert "Traceback" not in text, f"{name}: {text[-3000:]}"
