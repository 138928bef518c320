"""Pure parts of the CLI: key=value parsing and the status board fold."""

from __future__ import annotations

import pytest
from epu.common.messages import ActionRecord, DecisionRecord, InstanceEvent, ViewSummary
from epu.services.decision.cli import UsageError, parse_assignments
from epu.services.decision.status import Board, render

from tests.decision.helpers import jobs, node, snapshot


def test_parse_assignments():
    got = parse_assignments(["policy=threshold", "jobs_per_vm=2", "max_nodes=7", "sites=a, b",
                             "paused=false", "upper=0.8", "placement=cheapest", "params.note=hello"])
    assert got == {"policy": "threshold", "max_nodes": 7, "sites": ["a", "b"], "paused": False,
                   "placement": "cheapest", "params": {"jobs_per_vm": 2, "upper": 0.8, "note": "hello"}}
    with pytest.raises(UsageError):
        parse_assignments(["max_nodes"])


def test_board_folds_events():
    b = Board("d")
    assert b.apply(snapshot(queued=jobs(3, cores=2), nodes=[node("a"), node("b", "busy")]))
    ev = dict(domain="d", site="s1", at=1.0)
    assert b.apply(InstanceEvent(instance_id="i1", state="pending", seq=1, **ev))
    assert b.apply(InstanceEvent(instance_id="i2", state="started", seq=2, **ev))
    assert not b.apply(InstanceEvent(instance_id="i2", state="pending", seq=1, **ev))  # stale
    assert b.apply(InstanceEvent(instance_id="i1", state="terminated", seq=5, **ev))
    assert not b.apply(snapshot("other"))
    rec = DecisionRecord(domain="d", iteration=4, policy="queue-demand", saw=ViewSummary(), at=2.0,
                         actions=[ActionRecord(kind="launch", site="s1")], notes=["why"])
    assert b.apply(rec)
    (st,) = b.as_json()
    assert st["queue"] == {"jobs": 3, "cores": 6} and st["nodes_by_state"] == {"free": 1, "busy": 1}
    assert st["instances_by_site"] == {"s1": {"started": 1}}
    assert st["last_decision"]["iteration"] == 4 and st["last_decision"]["notes"] == ["why"]
    from rich.console import Console

    console = Console(record=True, width=120)
    console.print(render(b))
    text = console.export_text()
    assert "domain d" in text and "3 jobs, 6 cores" in text and "launch×1" in text


@pytest.mark.rabbitmq
@pytest.mark.quorum  # reads beyond a quorum queue's delivery limit leave the status in place
def test_status_reads_the_retained_status_at_once_and_leaves_it(tmp_path, broker, capsys):
    """The engine's status in the latest-value queue shows at once (``--seconds 0``), for any number
    of readers; only the newest of two is shown; an operator config naming no domain works."""
    import json

    from epu.common.broker import Publisher
    from epu.common.messages import EngineStatus, InstanceStatus

    from epu.cli import main

    topo = broker.topology
    with broker.connection() as conn:
        topo.declare(conn.channel(), [topo.status_spec("alpha")])
    cfg = tmp_path / "operator.toml"
    cfg.write_text(f'[broker]\nurl = "{broker.url}"\nprefix = "{topo.prefix}"\n')
    pub = Publisher(broker, "decision")
    try:
        for at, n in ((1.0, 1), (2.0, 3)):
            pub.publish(EngineStatus(domain="alpha", at=at, policy="fixed", instances=[
                InstanceStatus(instance_id=f"i{k}", site="s1", state="joined", in_batch=True, since=at)
                for k in range(n)]))
    finally:
        pub.close()
    for _reader in range(3):
        assert main(["status", "alpha", "--json", "--seconds", "0", "-c", str(cfg)]) == 0
        (doc,) = json.loads(capsys.readouterr().out)
        assert doc["instances_by_state"] == {"joined": 3} and doc["engine"]["policy"] == "fixed"
    # more reads than a quorum queue's usual delivery limit (20): the status stays (no limit on it)
    from epu.common.retained import read_retained

    name = topo.n(topo.status_spec("alpha").name)
    for _read in range(25):
        assert name in read_retained(broker, [name]).messages
    assert main(["status", "beta", "--json", "--seconds", "0", "-c", str(cfg)]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == [] and "no status queue" in captured.err


def test_status_refuses_a_domain_the_config_does_not_name(tmp_path, capsys):
    from epu.cli import main

    cfg = tmp_path / "epu.toml"
    cfg.write_text('[broker]\nurl = "memory://"\n[domains.alpha]\nmax_nodes = 1\n')
    assert main(["status", "alhpa", "--seconds", "0", "-c", str(cfg)]) == 2
    assert "unknown domain 'alhpa' (configured: alpha)" in capsys.readouterr().err
