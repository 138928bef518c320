"""`epu instances list|terminate`."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import pytest
from epu.common.broker import Broker, Publisher
from epu.common.codec import decode
from epu.common.messages import InstanceEvent, LaunchRequest, PolicyChange, PolicyOutcome, TerminateRequest
from epu.common.testing import drain, get_raw
from epu.services.provisioner.store import Store
from kombu import Queue

from epu.cli import main


def write_config(tmp_path, store_url: str, broker: Broker | None = None) -> str:
    text = f'[provisioner]\nstore_url = "{store_url}"\n'
    if broker is not None:
        text += f'[broker]\nurl = "{broker.url}"\nprefix = "{broker.topology.prefix}"\n'
    path = tmp_path / "epu.toml"
    path.write_text(text)
    return str(path)


def seed(url: str) -> None:
    store = Store(url)
    for i, domain, kind in ((1, "alpha", "r5-4xlarge"), (2, "beta", "")):
        store.record_launch(LaunchRequest(launch_id=f"i{i}", domain=domain, site="sim", node_name=f"w{i}",
                                          instance_type=kind), 100.0)
    store.advance("i1", "started", 101.0, cloud_id="c-1", ip="10.0.0.1", reason="node running")
    store.close()


def test_list_table_and_json(tmp_path, sqlite_url, capsys) -> None:
    seed(sqlite_url)
    cfg = write_config(tmp_path, sqlite_url)
    assert main(["instances", "list", "-c", cfg]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:5] == ["INSTANCE", "DOMAIN", "SITE", "TYPE", "STATE"]
    assert "10.0.0.1" in out[1] and "started" in out[1] and out[1].split()[3] == "r5-4xlarge"
    assert out[2].split()[3] == "-"  # the site's single type
    assert main(["instances", "list", "-c", cfg, "--domain", "beta", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(d["instance_id"], d["state"], d["instance_type"]) for d in doc] == [("i2", "requested", "")]


def test_list_merges_the_engines_view_joined_and_in_batch(sqlite_url) -> None:
    """The provisioner never stores joined (the engine tracks it): the list shows the furthest state
    of the two and whether the node is in the batch system; a terminal store state wins."""
    from epu.common.messages import InstanceStatus
    from epu.services.provisioner.cli import merged

    seed(sqlite_url)
    store = Store(sqlite_url)
    i1, i2 = store.list()
    store.close()
    view = {"i1": InstanceStatus(instance_id="i1", site="sim", state="joined", seq=2, in_batch=True,
                                 node_state="busy", since=1.0)}
    doc = merged(i1, view)
    assert (doc["state"], doc["engine_state"], doc["in_batch"], doc["node_state"]) == ("joined", "joined", True, "busy")
    assert merged(i2, view)["in_batch"] is False and merged(i2, view)["state"] == "requested"
    assert merged(i1, None)["in_batch"] is None, "engine status unreadable: unknown, not false"


def answer_one(broker: Broker, queue: str, answer: Callable[[Any], Any]) -> tuple[threading.Thread, list[Any]]:
    """Play the service behind ``queue``: take the first request off it and publish what
    ``answer(request)`` returns (None: no answer). The requests taken are in the list."""
    taken: list[Any] = []

    def serve() -> None:
        envelope, msg = decode(get_raw(broker, queue, timeout=30).body)
        taken.append(msg)
        reply = answer(msg)
        if reply is not None:
            pub = Publisher(broker, "test-service")
            try:
                pub.publish(reply)
            finally:
                pub.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return t, taken


@pytest.mark.rabbitmq
def test_forced_terminate_goes_to_the_provisioners_and_waits_for_their_answer(tmp_path, sqlite_url, broker: Broker,
                                                                               capsys) -> None:
    seed(sqlite_url)
    cfg = write_config(tmp_path, sqlite_url, broker)
    topo = broker.topology
    watch = Queue(topo.n("test.cli.forced-record"), exchange=topo.commands_exchange, routing_key="decision.control",
                  durable=False, auto_delete=False)
    with broker.connection() as conn:
        topo.declare(conn.channel(), [topo.provisioner_spec()])
        watch(conn.channel()).declare()
    t, taken = answer_one(broker, broker.topology.n("epu.provisioner"), lambda m: InstanceEvent(
        instance_id=m.instance_id, domain=m.domain, site="sim", state="terminating", previous="started", seq=3,
        reason=f"{m.reason} (forced)", at=102.0))
    # issue 34: then the engine is told, for `epu policy history`
    t2, recorded = answer_one(broker, watch.name, lambda m: PolicyOutcome(change_id=m.change_id, domain=m.domain,
                                                                         applied=True, version=1))
    # --timeout: how long the command waits for the answer, which comes as soon as it is given
    # (generous: a loaded machine once took over the default 10 s to answer)
    assert main(["instances", "terminate", "i1", "-c", cfg, "--reason", "stuck", "--force", "--timeout", "60"]) == 0
    t.join(10)
    t2.join(10)
    out = capsys.readouterr()
    assert "instance=i1 domain=alpha is terminating (stuck (forced))" in out.out
    assert "not recorded" not in out.err
    [msg] = taken
    assert isinstance(msg, TerminateRequest) and msg.instance_id == "i1" and msg.domain == "alpha"
    assert msg.reason == "stuck" and msg.force
    [record] = recorded
    assert isinstance(record, PolicyChange) and record.forced_terminate == ["i1"] and record.domain == "alpha"
    assert "stuck" in record.operator and record.retire is None


@pytest.mark.rabbitmq
def test_a_made_up_id_sends_nothing_and_fails(tmp_path, sqlite_url, broker: Broker, capsys) -> None:
    """Before: ``--force`` on an id nobody knows went to the provisioners, which recorded (and
    announced) an instance that never existed; without the store the command printed a
    SQLAlchemy traceback or "give --domain"."""
    seed(sqlite_url)
    cfg = write_config(tmp_path, sqlite_url, broker)
    with broker.connection() as conn:
        broker.topology.declare(conn.channel(), [broker.topology.provisioner_spec()])
    for extra in ([], ["--force"], ["--domain", "alpha", "--force"]):
        assert main(["instances", "terminate", "made-up-id", "-c", cfg, "--timeout", "2", *extra]) == 1
        err = capsys.readouterr().err
        assert "no instance made-up-id" in err and "nothing sent" in err, err
    assert drain(broker, broker.topology.n("epu.provisioner")) == []


@pytest.mark.rabbitmq
def test_forced_terminate_without_an_answer_fails(tmp_path, sqlite_url, broker: Broker, capsys) -> None:
    seed(sqlite_url)
    cfg = write_config(tmp_path, sqlite_url, broker)
    with broker.connection() as conn:
        broker.topology.declare(conn.channel(), [broker.topology.provisioner_spec()])
    assert main(["instances", "terminate", "i1", "-c", cfg, "--force", "--timeout", "1"]) == 1
    assert "no answer from a provisioner within 1s" in capsys.readouterr().err


@pytest.mark.rabbitmq
def test_unforced_terminate_asks_the_engine_to_drain_first(tmp_path, sqlite_url, broker: Broker, capsys) -> None:
    """Without --force nothing goes to the provisioners (they would destroy at once): the engine
    gets a retire request and drains, removes, then terminates (issue 11). The command prints the
    engine's answer: a refusal is exit 1 with the engine's reason (before: "requested", exit 0)."""
    seed(sqlite_url)
    cfg = write_config(tmp_path, sqlite_url, broker)
    topo = broker.topology
    watch = Queue(topo.n("test.cli.control-watch"), exchange=topo.commands_exchange, routing_key="decision.control",
                  durable=False, auto_delete=False)
    with broker.connection() as conn:
        topo.declare(conn.channel(), [topo.provisioner_spec()])
        watch(conn.channel()).declare()
    t, taken = answer_one(broker, watch.name, lambda m: PolicyOutcome(change_id=m.change_id, domain=m.domain,
                                                                      applied=True, version=2))
    assert main(["instances", "terminate", "i1", "-c", cfg, "--reason", "stuck", "--timeout", "60"]) == 0
    t.join(10)
    assert "drain and terminate accepted by the decision engine" in capsys.readouterr().out
    assert drain(broker, topo.n("epu.provisioner")) == []
    [msg] = taken
    assert isinstance(msg, PolicyChange) and msg.retire == ["i1"] and msg.domain == "alpha"
    assert "stuck" in msg.operator
    t, taken = answer_one(broker, watch.name, lambda m: PolicyOutcome(
        change_id=m.change_id, domain=m.domain, applied=False, reason="retire: no instance i1 in domain alpha"))
    assert main(["instances", "terminate", "i1", "-c", cfg, "--timeout", "60"]) == 1
    t.join(10)
    assert "refused: retire: no instance i1 in domain alpha" in capsys.readouterr().err


def test_an_id_as_epu_status_shows_it_is_accepted() -> None:
    """``epu status`` shows the first 12 characters of an id and the node name: either names the
    instance when it names one only."""
    from epu.services.provisioner.cli import Known, resolve

    known = {i: Known(i, "alpha", "started", f"wn-{i[-2:]}") for i in ("3f2a9c1e0b7d4e21aa", "3f2a9c1e0b7d9999",
                                                                       "77aa")}
    known["dead"] = Known("dead", "alpha", "terminated", "wn-aa")
    assert resolve("3f2a9c1e0b7d4e", known).instance_id == "3f2a9c1e0b7d4e21aa"
    assert resolve("wn-99", known).instance_id == "3f2a9c1e0b7d9999", "the node name the board shows"
    assert resolve("wn-aa", known) == ["3f2a9c1e0b7d4e21aa", "77aa"], "ambiguous (the ended one is not counted)"
    assert resolve("77aa", known).instance_id == "77aa"
    assert resolve("3f2a9c1e0b7d", known) == ["3f2a9c1e0b7d4e21aa", "3f2a9c1e0b7d9999"]
    assert resolve("nope", known) == []


def test_help_reads_like_a_man_page(capsys) -> None:
    for argv in (["instances", "list", "--help"], ["instances", "terminate", "--help"]):
        try:
            main(argv)
        except SystemExit as exc:
            assert exc.code == 0
        text = capsys.readouterr().out
        assert "examples:" in text and "exit status" in text
