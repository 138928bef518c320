"""Every operator command run as the generated ``epu-operator`` user — exactly its permissions —
against the real broker, beside a decision engine running as ``epu-decision`` (declare = false),
all in a vhost holding nothing but the generated definitions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from epu.common.broker import Broker, Publisher, PublishRefused
from epu.common.config import load_config
from epu.common.messages import InstanceEvent, LaunchRequest, SensorSnapshot, TerminateRequest
from epu.common.runtime import run_in_thread
from epu.common.testing import drain, wait_for
from epu.services.decision.app import build_service
from epu.services.provisioner.store import Store

from tests.support.definitions import Loaded, loaded_definitions

pytestmark = pytest.mark.rabbitmq
ROOT = Path(__file__).resolve().parents[2]

CONFIG = """
[broker]
url = "{url}"
[decision]
store_url = "sqlite:///{tmp}/decision.db"
iteration_seconds = 0.3
[provisioner]
store_url = "sqlite:///{tmp}/provisioner.db"
[domains.alpha]
max_nodes = 2
sites = ["s1"]
[sites.s1]
driver = "epu-sim"
"""


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Loaded, Path]]:
    tmp = tmp_path_factory.mktemp("operator")
    with loaded_definitions(["alpha"], admin_access=True) as d:
        engine_cfg = tmp / "engine.toml"
        engine_cfg.write_text(CONFIG.format(url=d.url("epu-decision"), tmp=tmp)
                              .replace("[broker]\n", "[broker]\ndeclare = false\n"))
        operator_cfg = tmp / "operator.toml"
        operator_cfg.write_text(CONFIG.format(url=d.url("epu-operator"), tmp=tmp))
        store = Store(f"sqlite:///{tmp}/provisioner.db")
        store.record_launch(LaunchRequest(launch_id="i-1", domain="alpha", site="s1", node_name="w1"), 100.0)
        store.close()
        engine = build_service(load_config(engine_cfg, environ={}))
        thread = run_in_thread(engine)
        assert engine.wait_ready(15), "the engine runs as epu-decision with the definitions alone"
        # the sensor (as its own user) publishes a snapshot, so status has something to show
        sensor = Publisher(Broker(d.url("epu-sensor-alpha"), d.topology, declare=False), "sensor-alpha")
        stop_sensor = threading.Event()

        def snapshots() -> None:
            while not stop_sensor.wait(0.5):
                sensor.publish(SensorSnapshot(domain="alpha", backend="simulated", taken_at=time.time()))

        feeder = threading.Thread(target=snapshots, daemon=True)
        feeder.start()
        try:
            yield d, operator_cfg
        finally:
            stop_sensor.set()
            feeder.join(5)
            sensor.close()
            engine.stop()
            thread.join(15)


def epu(cfg: Path, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EPU_")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "epu", *argv, "-c", str(cfg)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cfg.parent)


def ok(res: subprocess.CompletedProcess[str]) -> str:
    assert res.returncode == 0, f"exit {res.returncode}\n{res.stdout}\n{res.stderr}"
    assert "ACCESS_REFUSED" not in res.stderr and "Traceback" not in res.stderr, res.stderr
    return res.stdout


def test_status(world: tuple[Loaded, Path]) -> None:
    _d, cfg = world
    doc = json.loads(ok(epu(cfg, "status", "alpha", "--json", "--seconds", "3")))
    assert doc, "status shows the domain"


def test_status_and_instances_list_show_the_whole_state_at_once(world: tuple[Loaded, Path]) -> None:
    """Instances that changed before ``epu status`` started are shown at once (from the engine's
    retained status, read with the operator's permissions and left in place for the next reader);
    ``epu instances list`` shows the engine's view of each beside the provisioner's store."""
    d, cfg = world
    ids = ["s-1", "s-2", "s-3"]
    store = Store(f"sqlite:///{cfg.parent}/provisioner.db")
    for iid in ids:
        store.record_launch(LaunchRequest(launch_id=iid, domain="alpha", site="s1", node_name=f"w-{iid}"), 100.0)
    store.close()
    provisioner = Publisher(Broker(d.url("epu-provisioner"), d.topology, declare=False), "provisioner")
    try:
        for iid in ids:
            provisioner.publish(InstanceEvent(instance_id=iid, domain="alpha", site="s1", state="started", seq=2,
                                              node_name=f"w-{iid}", at=100.0))
    finally:
        provisioner.close()

    def shown() -> set[str]:
        doc = json.loads(ok(epu(cfg, "status", "alpha", "--json", "--seconds", "0")))
        return {i["instance_id"] for i in doc[0]["instances"]} if doc else set()

    wait_for(lambda: set(ids) <= shown(), 30, interval=0.5, message="epu status showing all three instances")
    assert set(ids) <= shown(), "read again: the status is left in place for the next reader"
    listed = {r["instance_id"]: r for r in json.loads(ok(epu(cfg, "instances", "list", "--json")))}
    assert [(listed[i]["engine_state"], listed[i]["in_batch"]) for i in ids] == [("started", False)] * 3
    table = ok(epu(cfg, "instances", "list"))
    assert table.splitlines()[0].split()[:6] == ["INSTANCE", "DOMAIN", "SITE", "TYPE", "STATE", "BATCH"]
    assert all(line.split()[5] == "no" for line in table.splitlines() if line.startswith("s-"))


def test_policy_set_pause_resume_and_show(world: tuple[Loaded, Path]) -> None:
    _d, cfg = world
    assert "applied as version" in ok(epu(cfg, "policy", "set", "alpha", "max_nodes=3", "--timeout", "30"))
    assert "PAUSED" in ok(epu(cfg, "policy", "pause", "alpha", "--timeout", "30"))
    assert "applied" in ok(epu(cfg, "policy", "resume", "alpha", "--timeout", "30"))
    assert "applied" in ok(epu(cfg, "policy", "release-breaker", "alpha", "--timeout", "30"))
    shown = json.loads(ok(epu(cfg, "policy", "show", "alpha", "--json")))
    assert shown["max_nodes"] == 3 and shown["paused"] is False


def test_tap_and_record(world: tuple[Loaded, Path]) -> None:
    _d, cfg = world
    out = ok(epu(cfg, "tap", "sensor.snapshot.*", "--json", "--count", "2", "--seconds", "30"))
    assert [json.loads(line)["routing_key"] for line in out.splitlines()] == ["sensor.snapshot.alpha"] * 2
    rec = cfg.parent / "rec"
    ok(epu(cfg, "record", "--out", str(rec), "--seconds", "3"))
    assert (rec / "timeline.csv").exists() and (rec / "summary.json").exists()


def test_instances_list_and_terminate_but_never_launch(world: tuple[Loaded, Path]) -> None:
    d, cfg = world
    assert "i-1" in ok(epu(cfg, "instances", "list"))
    # unforced: a retire request to the engine (which drains first), never straight to the provisioners
    # i-1 is in the provisioner's store but the engine never heard of it: it refuses, and the
    # command says so and fails (before: "drain and terminate requested", exit 0)
    res = epu(cfg, "instances", "terminate", "i-1", "--reason", "drain")
    assert res.returncode == 1 and "the decision engine refused: retire: " in res.stderr, res
    assert "Traceback" not in res.stderr
    assert drain(Broker(d.admin_url, d.topology), "epu.provisioner") == []
    # forced: the operator may send a TerminateRequest to the provisioners (none runs here to answer)
    res = epu(cfg, "instances", "terminate", "i-1", "--force", "--reason", "operator test", "--timeout", "2")
    assert res.returncode == 1 and "no answer from a provisioner within 2s" in res.stderr, res
    got = drain(Broker(d.admin_url, d.topology), "epu.provisioner")
    assert [(type(m), m.instance_id) for _e, m in got] == [(TerminateRequest, "i-1")]
    operator = Publisher(Broker(d.url("epu-operator"), d.topology), "operator")
    try:
        with pytest.raises(PublishRefused, match="ACCESS_REFUSED"):
            operator.publish(LaunchRequest(launch_id="evil", domain="alpha", site="s1", node_name="x"))
    finally:
        operator.close()
    assert drain(Broker(d.admin_url, d.topology), "epu.provisioner") == [], "no launch reached the provisioners"


def test_from_a_host_without_the_stores_everything_comes_over_the_broker(world: tuple[Loaded, Path]) -> None:
    """An operator's workstation: the broker account and nothing else. ``policy show`` and
    ``instances list`` read the engine's retained status, say so, and create no store."""
    d, cfg = world
    remote = cfg.parent / "remote"
    remote.mkdir()
    remote_cfg = remote / "operator.toml"
    remote_cfg.write_text(CONFIG.format(url=d.url("epu-operator"), tmp=remote / "absent"))
    # the engine has the three instances of the test above (or gets them from this one)
    provisioner = Publisher(Broker(d.url("epu-provisioner"), d.topology, declare=False), "provisioner")
    try:
        provisioner.publish(InstanceEvent(instance_id="r-1", domain="alpha", site="s1", state="started", seq=2,
                                          node_name="w-r-1", at=100.0))
    finally:
        provisioner.close()

    def listed() -> dict[str, dict]:
        res = epu(remote_cfg, "instances", "list", "--json")
        assert "no store at" in res.stderr, res.stderr
        return {r["instance_id"]: r for r in json.loads(ok(res))}

    got = wait_for(lambda: (rows := listed()).get("r-1") and rows, 30, interval=0.5,
                   message="instances list showing the engine's view")
    assert got["r-1"]["engine_state"] == "started" and got["r-1"]["in_batch"] is False
    local = json.loads(ok(epu(cfg, "policy", "show", "alpha", "--json")))  # from the engine's store
    shown = json.loads(ok(epu(remote_cfg, "policy", "show", "alpha", "--json")))
    assert shown["source"].startswith("engine status")
    assert (shown["version"], shown["max_nodes"], shown["policy"]) == (local["version"], local["max_nodes"],
                                                                      local["policy"])
    assert not (remote / "absent").exists() and list(remote.iterdir()) == [remote_cfg], "no store created"
