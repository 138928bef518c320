"""Two engine processes on one store (SQLite file, then PostgreSQL) and one RabbitMQ: the active
engine's broker connections are cut with ``rabbitmqctl close_connection``. Single-active-consumer
hands the queues to the standby; the old engine reconnects as a standby. Before fencing both
engines' /healthz then said ``active`` and both acted on their cached snapshots. Now: the old
engine drops its snapshots and releases its lease, never reports the domain active while the
other does, and the scale-up has no duplicate launch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from epu.common.broker import Publisher
from epu.common.testing import wait_for
from epu.common.topology import PROVISIONER_QUEUE

from tests.conftest import rabbitmqctl
from tests.decision.busutil import read_queue
from tests.decision.helpers import jobs, snapshot
from tests.support.health import health, metric
from tests.support.tcpproxy import TcpProxy

pytestmark = pytest.mark.rabbitmq
ROOT = Path(__file__).resolve().parents[2]

CONFIG = """
[broker]
url = "{url}"
prefix = "{prefix}"
heartbeat = 4
[logging]
level = "info"
[decision]
store_url = "{store}"
iteration_seconds = 0.2
resend_seconds = 30
active_window_seconds = 30
metrics_port = {port}
[domains.d]
max_nodes = 20
sites = ["s1"]
[sites.s1]
driver = "epu-sim"
quota = 50
"""


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'decision.db'}"
    return request.getfixturevalue("pg_url")


def close_connections_of(pid: int, vhost: str) -> int:
    out = rabbitmqctl("list_connections", "-q", "--no-table-headers", "pid", "vhost", "client_properties").stdout
    mine = [line.split()[0] for line in out.splitlines() if f"(pid {pid})" in line and vhost in line]
    for conn in mine:
        rabbitmqctl("close_connection", conn, "test: cut the active engine off", check=False)
    return len(mine)


def test_cutting_the_active_engine_off_leaves_exactly_one_acting(broker, rabbit_url, rabbit_vhost, prefix,
                                                                  tmp_path, store_url) -> None:
    engines: dict[str, tuple[subprocess.Popen, int]] = {}
    env = {k: v for k, v in os.environ.items() if not k.startswith("EPU_")}
    env["PYTHONPATH"] = str(ROOT)
    for name in ("a", "b"):
        port = TcpProxy._free_port()
        cfg = tmp_path / f"{name}.toml"
        cfg.write_text(CONFIG.format(url=rabbit_url, prefix=prefix, store=store_url, port=port))
        log = (tmp_path / f"{name}.log").open("w")
        engines[name] = (subprocess.Popen([sys.executable, "-m", "epu", "run", "decision", "-c", str(cfg)],
                                          env=env, stdout=log, stderr=subprocess.STDOUT), port)
        wait_for(lambda p=port: health(p).get("status") == "serving", 30, message=f"engine {name} serving")
    demand = {"jobs": 3}
    stop = threading.Event()
    pub = Publisher(broker, source="sensor-test")

    def sensor() -> None:
        while not stop.is_set():
            pub.publish(snapshot(queued=jobs(demand["jobs"]), at=time.time()))
            stop.wait(0.3)

    launched: list = []

    def distinct() -> set[str]:
        launched.extend(read_queue(broker, PROVISIONER_QUEUE))
        return {m.launch_id for m in launched}

    def states() -> dict[str, str]:
        return {n: health(p).get("domains", {}).get("d", "?") for n, (_proc, p) in engines.items()}

    feeder = threading.Thread(target=sensor, daemon=True)
    feeder.start()
    try:
        wait_for(lambda: len(distinct()) == 3, 20, message="3 launches from the active engine")
        active = wait_for(lambda: [n for n, s in states().items() if s == "active"], 10, message="one active")
        assert len(active) == 1
        old = active[0]
        new = "b" if old == "a" else "a"
        assert states()[new] == "standby"

        assert close_connections_of(engines[old][0].pid, rabbit_vhost) >= 2, "consumer and publisher cut"
        demand["jobs"] = 6
        both: list[dict[str, str]] = []
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:  # watch both engines through the takeover
            s = states()
            if list(s.values()).count("active") > 1:
                both.append(s)
            if s[new] == "active" and len(distinct()) >= 6:
                break
            time.sleep(0.05)
        assert not both, f"two engines reported the domain active at once: {both[:3]}"
        assert states()[new] == "active", "the standby took over"
        assert states()[old] in ("standby", "fenced")
        assert health(engines[old][1])["status"] == "serving", "the old engine reconnected (as a standby)"
        # Both engines keep running side by side on fresh snapshots: ten more iterations of each
        # (2 s at 0.2 s), and nothing more may be launched.
        def iterations(name: str) -> float:
            return metric(engines[name][1], "epu_timer_runs_total", {"task": "iteration", "outcome": "ok"})

        seen = {name: iterations(name) for name in engines}
        wait_for(lambda: all(iterations(n) >= seen[n] + 10 for n in engines), 20,
                 message="ten more iterations of both engines")
        ids = distinct()
        assert len(ids) == 6, f"duplicate launches: {len(ids)} distinct ids for a demand of 6"
    finally:
        stop.set()
        feeder.join(5)
        pub.close()
        for proc, _port in engines.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
    for name in engines:
        text = (tmp_path / f"{name}.log").read_text()
        assert "Traceback" not in text, text[-3000:]
