"""`epu instances list|terminate`."""

from __future__ import annotations

import json

import pytest
from epu.common.broker import Broker
from epu.common.messages import LaunchRequest, PolicyChange, TerminateRequest
from epu.common.testing import drain
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


@pytest.mark.rabbitmq
def test_forced_terminate_goes_to_the_provisioners(tmp_path, sqlite_url, broker: Broker, capsys) -> None:
    seed(sqlite_url)
    cfg = write_config(tmp_path, sqlite_url, broker)
    with broker.connection() as conn:
        broker.topology.declare(conn.channel(), [broker.topology.provisioner_spec()])
    assert main(["instances", "terminate", "i1", "-c", cfg, "--reason", "stuck", "--force"]) == 0
    assert "forced terminate requested" in capsys.readouterr().out
    [(envelope, msg)] = drain(broker, broker.topology.n("epu.provisioner"))
    assert isinstance(msg, TerminateRequest) and msg.instance_id == "i1" and msg.domain == "alpha"
    assert msg.reason == "stuck" and msg.force
    assert main(["instances", "terminate", "unknown-id", "-c", cfg]) == 2


@pytest.mark.rabbitmq
def test_unforced_terminate_asks_the_engine_to_drain_first(tmp_path, sqlite_url, broker: Broker, capsys) -> None:
    """Without --force nothing goes to the provisioners (they would destroy at once): the engine
    gets a retire request and drains, removes, then terminates (issue 11)."""
    seed(sqlite_url)
    cfg = write_config(tmp_path, sqlite_url, broker)
    topo = broker.topology
    watch = Queue(topo.n("test.cli.control-watch"), exchange=topo.commands_exchange, routing_key="decision.control",
                  durable=False, auto_delete=False)
    with broker.connection() as conn:
        topo.declare(conn.channel(), [topo.provisioner_spec()])
        watch(conn.channel()).declare()
    assert main(["instances", "terminate", "i1", "-c", cfg, "--reason", "stuck"]) == 0
    assert "drain and terminate requested" in capsys.readouterr().out
    assert drain(broker, topo.n("epu.provisioner")) == []
    [(envelope, msg)] = drain(broker, watch.name)
    assert isinstance(msg, PolicyChange) and msg.retire == ["i1"] and msg.domain == "alpha"
    assert "stuck" in msg.operator


def test_help_reads_like_a_man_page(capsys) -> None:
    for argv in (["instances", "list", "--help"], ["instances", "terminate", "--help"]):
        try:
            main(argv)
        except SystemExit as exc:
            assert exc.code == 0
        text = capsys.readouterr().out
        assert "examples:" in text and "exit status" in text
