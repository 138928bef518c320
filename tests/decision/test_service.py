"""The engine as a service on the real RabbitMQ: policy changes by message, the launch flow."""

from __future__ import annotations

import json
import threading
import uuid

import pytest
from epu.common.broker import Publisher
from epu.common.config import load_config
from epu.common.messages import PolicyChange
from epu.common.runtime import run_in_thread
from epu.common.testing import wait_for
from epu.common.topology import PROVISIONER_QUEUE
from epu.services.decision.app import build_service

from tests.decision.busutil import Tap, read_queue
from tests.decision.helpers import jobs, snapshot
from tests.support.dead import DeadLetters

CONFIG = """
[broker]
url = "{url}"
prefix = "{prefix}"
[decision]
store_url = "{store}"
iteration_seconds = 0.1
[domains.d]
max_nodes = 10
sites = ["s1"]
[sites.s1]
driver = "epu-sim"
quota = 20
"""


@pytest.fixture
def config_file(tmp_path, sqlite_url, rabbit_url, prefix):
    path = tmp_path / "epu.toml"
    path.write_text(CONFIG.format(url=rabbit_url, prefix=prefix, store=sqlite_url))
    return path


@pytest.fixture
def running(broker, config_file):
    cfg = load_config(config_file, environ={})
    service = build_service(cfg)
    thread = run_in_thread(service)
    assert service.wait_ready(10)
    tap = Tap(broker, "policy.outcome.#", "decision.record.#")
    pub = Publisher(broker, source="test")
    yield service, thread, tap, pub
    service.stop()
    thread.join(10)
    tap.close()
    pub.close()


def test_policy_change_by_message_applied_and_bad_one_rejected(running, broker):
    service, thread, tap, pub = running
    launched: list = []

    def launches(n):
        launched.extend(read_queue(broker, PROVISIONER_QUEUE))
        return len(launched) >= n and launched

    pub.publish(snapshot(queued=jobs(2), at=service.clock.now()))
    wait_for(lambda: launches(2), 10, message="2 launches from queue demand")
    assert {m.TYPE for m in launched} == {"instance.launch"}

    # a good change: applied, acknowledged with the new version, used at the next iteration
    pub.publish(PolicyChange(change_id="good1", domain="d", policy="fixed", params={"nodes": 4}, operator="t"))
    (ok,) = wait_for(lambda: [o for o in tap.of("policy.outcome") if o.change_id == "good1"], 10,
                     message="outcome of good1")
    assert ok.applied and ok.version == 2 and ok.config["policy"] == "fixed"
    pub.publish(snapshot(queued=[], at=service.clock.now()))
    wait_for(lambda: launches(4), 10, message="fixed policy tops up to 4")
    assert len({m.launch_id for m in launched}) == 4

    # a bad change: rejected with the reason, nothing changes, the engine keeps running
    pub.publish(PolicyChange(change_id="bad1", domain="d", params={"nodes": -1}))
    (bad,) = wait_for(lambda: [o for o in tap.of("policy.outcome") if o.change_id == "bad1"], 10,
                      message="outcome of bad1")
    assert not bad.applied and "fixed.nodes" in bad.reason and "greater than or equal to 0" in bad.reason
    assert service.engine.store.current_config("d")[0] == 2
    assert thread.is_alive()
    pub.publish(PolicyChange(change_id="good2", domain="d", paused=True))
    (paused,) = wait_for(lambda: [o for o in tap.of("policy.outcome") if o.change_id == "good2"], 10,
                         message="outcome of good2")
    assert paused.applied and paused.version == 3
    records = tap.of("decision.record")
    assert records and all(r.domain == "d" for r in records)
    assert {a.kind for r in records for a in r.actions} == {"launch"}


def test_undecodable_control_message_is_dead_lettered_engine_keeps_running(running, broker):
    service, thread, tap, pub = running
    topo = broker.topology
    pub.publish_raw(b"\xc1garbage", exchange=topo.commands_exchange.name, routing_key="decision.control",
                    content_type="application/x-msgpack")
    change_id = uuid.uuid4().hex
    pub.publish(PolicyChange(change_id=change_id, domain="d", max_nodes=5))
    (out,) = wait_for(lambda: [o for o in tap.of("policy.outcome") if o.change_id == change_id], 10,
                      message="outcome after garbage")
    assert out.applied and thread.is_alive()
    found = DeadLetters(broker)
    (dead,) = wait_for(lambda: found.take(1), 10, message="the dead letter")
    assert dead.body == b"\xc1garbage" and "not msgpack" in dead.reason


def cli(*argv: str) -> int:
    import argparse

    from epu.services.decision.cli import register

    parser = argparse.ArgumentParser(prog="epu")
    register(parser.add_subparsers())
    args = parser.parse_args(list(argv))
    return args.func(args)


def test_cli_policy_set_show_pause_resume(running, config_file, capsys):
    c = str(config_file)
    assert cli("policy", "set", "d", "policy=threshold", "jobs_per_vm=2", "max_nodes=7", "-c", c) == 0
    assert "applied as version 2 (threshold, nodes 0..7, mode act, budget none)" in capsys.readouterr().out
    assert cli("policy", "set", "d", "jobs_per_vm=0", "-c", c) == 1
    assert "rejected: threshold.jobs_per_vm: Input should be greater than or equal to 1" in capsys.readouterr().err
    assert cli("policy", "pause", "d", "-c", c) == 0
    assert "PAUSED" in capsys.readouterr().out
    assert cli("policy", "resume", "d", "-c", c, "--json") == 0
    assert json.loads(capsys.readouterr().out)["version"] == 4
    assert cli("policy", "show", "d", "--json", "-c", c) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["version"] == 4 and shown["policy"] == "threshold" and shown["max_nodes"] == 7
    assert shown["effective_params"]["jobs_per_vm"] == 2 and shown["effective_params"]["waiting_jobs_time_s"] == 40
    assert cli("policy", "show", "d", "-c", c) == 0
    out = capsys.readouterr().out
    assert "waiting_jobs_time_s" in out and "mode       act" in out and "budget     none (no spend cap)" in out


def test_cli_status_json_from_the_event_stream(running, config_file, capsys):
    service, thread, tap, pub = running
    from epu.common.messages import InstanceEvent

    done = threading.Event()

    def feed() -> None:  # demand grows every round, so decision records keep coming
        n = 1
        while not done.is_set():
            n += 1
            pub.publish(InstanceEvent(instance_id="i1", domain="d", site="s1", state="pending", seq=1,
                                      at=service.clock.now()))
            pub.publish(snapshot(queued=jobs(n), at=service.clock.now()))
            done.wait(0.3)

    t = threading.Thread(target=feed, daemon=True)
    t.start()
    try:
        assert cli("status", "d", "--json", "--seconds", "2", "-c", str(config_file)) == 0
    finally:
        done.set()
    (st,) = json.loads(capsys.readouterr().out)
    assert st["queue"]["jobs"] >= 2 and st["instances_by_site"]["s1"]["pending"] == 1
    assert [a["kind"] for a in st["last_decision"]["actions"]] == ["launch"]
    assert "pending instances" in st["last_decision"]["notes"][0]


def test_malloc_trim_is_glibcs_and_callable_after_an_iteration():
    """The decision service hands freed memory back after each iteration (VmRSS near what is
    live, issue 15 item 4): on glibc that is ``malloc_trim``, which answers 0 or 1."""
    from epu.services.decision.app import _malloc_trim

    assert _malloc_trim()(0) in (0, 1)
