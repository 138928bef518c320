"""Two engine processes on one RabbitMQ and one store: kill the active one, the standby takes
over with no duplicate launch (single-active-consumer queues + the shared durable store)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from epu.common.broker import Publisher
from epu.common.testing import wait_for
from epu.common.topology import DECISION_CONTROL_QUEUE, DECISION_INPUT_QUEUE, PROVISIONER_QUEUE

from tests.conftest import rabbitmqctl
from tests.decision.busutil import read_queue
from tests.decision.helpers import jobs, snapshot

ROOT = Path(__file__).resolve().parents[2]

CONFIG = """
[broker]
url = "{url}"
prefix = "{prefix}"

[logging]
level = "info"

[decision]
store_url = "sqlite:///{db}"
iteration_seconds = 0.2
resend_seconds = 1.0
active_window_seconds = 3.0

[domains.d]
max_nodes = 20
sites = ["s1"]

[sites.s1]
driver = "epu-sim"
quota = 50
"""


def sac_states(broker, rabbit_url: str) -> dict[str, list[bool]]:
    """Per decision queue, the 'active' flag of each consumer, from rabbitmqctl."""
    vhost = rabbit_url.rsplit("/", 1)[1]
    out = rabbitmqctl("list_consumers", "-p", vhost, "queue_name", "active", "--no-table-headers").stdout
    states: dict[str, list[bool]] = {}
    for line in out.splitlines():
        parts = line.split()
        for q in (DECISION_INPUT_QUEUE, DECISION_CONTROL_QUEUE):
            if parts and parts[0] == broker.topology.n(q):
                states.setdefault(q, []).append(parts[-1] == "true")
    return {q: sorted(v) for q, v in states.items()}


def start_engine(cfg: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "epu.services.decision", "-c", str(cfg)], cwd=ROOT,
                            stdout=log.open("w"), stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_kill_active_engine_standby_takes_over_without_duplicate_launch(broker, rabbit_url, prefix, tmp_path):
    cfg = tmp_path / "epu.toml"
    cfg.write_text(CONFIG.format(url=rabbit_url, prefix=prefix, db=tmp_path / "decision.db"))
    a = start_engine(cfg, tmp_path / "a.log")
    b = None
    demand = {"jobs": 3}
    stop = threading.Event()
    pub = Publisher(broker, source="sensor-test")

    def sensor() -> None:  # a sensor publishing a snapshot every 0.3 s
        while not stop.is_set():
            pub.publish(snapshot(queued=jobs(demand["jobs"]), at=time.time()))
            stop.wait(0.3)

    launched: list = []

    def launches(n: int) -> bool:
        launched.extend(read_queue(broker, PROVISIONER_QUEUE))
        return len({m.launch_id for m in launched}) >= n

    try:
        wait_for(lambda: "serving" in (tmp_path / "a.log").read_text(), 30, 0.1, "engine A consuming")
        b = start_engine(cfg, tmp_path / "b.log")
        wait_for(lambda: "serving" in (tmp_path / "b.log").read_text(), 30, 0.1, "engine B consuming")
        # RabbitMQ's view: two consumers on each single-active-consumer queue, one of them active
        states = sac_states(broker, rabbit_url)
        assert states == {DECISION_INPUT_QUEUE: [False, True], DECISION_CONTROL_QUEUE: [False, True]}
        feeder = threading.Thread(target=sensor, daemon=True)
        feeder.start()
        wait_for(lambda: launches(3), 15, 0.1, "3 launches from the active engine")
        # the provisioner never answers, so the active engine re-sends (same ids) every second
        wait_for(lambda: launches(3) and len(launched) > 3, 15, 0.1, "a re-send")
        assert len({m.launch_id for m in launched}) == 3

        a.send_signal(signal.SIGKILL)
        a.wait(10)
        killed_at = time.monotonic()
        demand["jobs"] = 5  # the standby must add exactly 2, knowing the 3 from the store
        wait_for(lambda: launches(5), 15, 0.1, "standby B launching the difference")
        takeover = time.monotonic() - killed_at
        assert sac_states(broker, rabbit_url)[DECISION_INPUT_QUEUE] == [True]
        # B keeps re-sending the three launches A made: same ids, no new instance
        wait_for(lambda: launches(5) and sum(m.launch_id in {x.launch_id for x in launched[:3]}
                                              for m in launched[3:]) >= 3, 15, 0.1, "B re-sends A's launches")
        ids = {m.launch_id for m in launched}
        assert len(ids) == 5, f"duplicate launch: {len(ids)} distinct ids for a demand of 5"
        print(f"takeover: standby launched the new demand {takeover:.2f}s after SIGKILL of the active engine")
        assert takeover < 5.0, f"takeover took {takeover:.1f}s"
    finally:
        stop.set()
        for p in (a, b):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
        pub.close()
