"""``epu dead list|show|requeue`` against the real RabbitMQ: real dead letters — rejected by the
service runtime and moved to ``epu.dead`` by the broker, their reasons in the runtime's death notes
— listed with type, domain, reason and age, shown whole by a key prefix, one requeued after a fix —
handled then, and gone from the dead-letter queue — and one that died because its sender was not
allowed refused even where the deployment would hear that sender."""

from __future__ import annotations

import json
import threading

import pytest
from epu.common.broker import Broker, Publisher
from epu.common.messages import Envelope, NodeCommandResult, PolicyChange
from epu.common.runtime import Reject, Service, run_in_thread
from epu.common.testing import queue_depth, wait_for

from epu.cli import main

pytestmark = pytest.mark.rabbitmq


def _config(tmp_path, broker: Broker):
    cfg = tmp_path / "operator.toml"
    cfg.write_text(f'[broker]\nurl = "{broker.url}"\nprefix = "{broker.topology.prefix}"\n')
    return str(cfg)


def test_list_show_and_requeue_after_a_fix(tmp_path, broker: Broker, capsys) -> None:
    fixed = threading.Event()
    handled: list[str] = []

    def handler(msg: PolicyChange, _env: Envelope) -> None:
        if msg.domain == "gamma" and not fixed.is_set():
            raise Reject("unknown domain 'gamma'")
        handled.append(msg.change_id)

    svc = Service("decision", broker)
    svc.consume(broker.topology.decision_control_spec(), handler, types={"policy.change"})
    thread = run_in_thread(svc)
    assert svc.wait_ready(15)
    pub = Publisher(broker, "test")
    dead_q = broker.topology.n("epu.dead")
    try:
        pub.publish_raw(b"\xc1 not msgpack", exchange=broker.topology.commands_exchange.name,
                        routing_key="decision.control", content_type="application/x-msgpack", message_id="junk-1")
        svc.publish(PolicyChange(change_id="g1", domain="gamma", max_nodes=3))
        wait_for(lambda: queue_depth(broker, dead_q) == 2, 15, message="two dead letters")
        cfg = _config(tmp_path, broker)

        assert main(["dead", "list", "--json", "-c", cfg]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["total"] == 2
        by_reason = {d["type"]: d for d in doc["letters"]}
        refused = by_reason["policy.change"]
        assert refused["reason"] == "rejected by decision: unknown domain 'gamma'"  # the engine's death note
        assert refused["queue"] == broker.topology.n("epu.decision.control")  # the broker's record
        assert refused["routing_key"] == "decision.control" and refused["sender"] == "guest"
        assert refused["age_seconds"] is not None and 0 <= refused["age_seconds"] < 60
        junk = next(d for d in doc["letters"] if d["key"] == "junk-1")
        assert "not msgpack" in junk["reason"] or "decode" in junk["reason"]
        assert queue_depth(broker, dead_q) == 2  # reading took nothing away

        assert main(["dead", "list", "-c", cfg]) == 0
        text = capsys.readouterr().out
        assert "policy.change" in text and "unknown domain 'gamma'" in text

        assert main(["dead", "show", refused["key"][:8], "-c", cfg]) == 0  # a unique prefix is enough
        shown = json.loads(capsys.readouterr().out)
        assert list(shown)[:3] == ["type", "domain", "force"]
        assert (shown["type"], shown["domain"], shown["force"]) == ("policy.change", "gamma", None)
        assert shown["body"]["body"]["change_id"] == "g1" and shown["requeue"] == "allowed"
        assert shown["x-death"]["reason"] == "rejected" and not any(k.startswith("x-epu-") for k in shown["headers"])
        assert main(["dead", "show", "", "-c", cfg]) == 1
        capsys.readouterr()

        assert main(["dead", "requeue", "no-such-key", "-c", cfg]) == 1
        assert "no dead letter 'no-such-key'" in capsys.readouterr().err
        assert queue_depth(broker, dead_q) == 2

        fixed.set()  # the fix: the domain is known now
        assert main(["dead", "requeue", refused["key"], "-c", cfg]) == 0
        assert "requeued" in capsys.readouterr().out
        wait_for(lambda: handled == ["g1"], 15, message="the requeued change handled")
        assert queue_depth(broker, dead_q) == 1
        assert main(["dead", "list", "--json", "-c", cfg]) == 0
        assert [d["key"] for d in json.loads(capsys.readouterr().out)["letters"]] == ["junk-1"]
    finally:
        svc.stop()
        thread.join(15)
        pub.close()


def test_a_letter_that_died_of_its_sender_is_never_requeued(tmp_path, broker: Broker, capsys) -> None:
    """A development broker (one user for all, ``require_sender_user`` false): a result of alpha's
    command published on beta's key dies of the key rule. Sent on by a requeue it would travel on
    alpha's key — its body's — and be believed: refused, and kept."""
    svc = Service("decision", broker)
    svc.consume(broker.topology.decision_input_spec(), lambda _m, _e: None, types={"node.result"})
    thread = run_in_thread(svc)
    assert svc.wait_ready(15)
    pub = Publisher(broker, "test")
    dead_q = broker.topology.n("epu.dead")
    forged = NodeCommandResult(command_id="c1", domain="alpha", action="remove", node="n1", ok=True)
    try:
        pub.publish_raw(Envelope.wrap(forged, "beta").model_dump(mode="python"),
                        exchange=broker.topology.events_exchange.name, routing_key="node.result.beta",
                        type_="node.result", message_id="forged-result-1")
        wait_for(lambda: queue_depth(broker, dead_q) == 1, 15, message="the dead letter")
    finally:
        svc.stop()
        thread.join(15)
        pub.close()
    cfg = _config(tmp_path, broker)
    assert main(["dead", "list", "--json", "-c", cfg]) == 0
    (letter,) = json.loads(capsys.readouterr().out)["letters"]
    assert letter["reason"].startswith("sender not allowed") and letter["requeue"].startswith("refused")
    assert main(["dead", "requeue", "forged", "-c", cfg]) == 1
    err = capsys.readouterr().err
    assert "not requeued (kept)" in err and "died because sender not allowed" in err, err
    assert queue_depth(broker, dead_q) == 1
    assert queue_depth(broker, broker.topology.n("epu.decision.input")) == 0


def test_an_ambiguous_key_prefix_is_an_error(tmp_path, broker: Broker, capsys) -> None:
    svc = Service("decision", broker)
    svc.consume(broker.topology.decision_control_spec(), lambda _m, _e: None, types={"policy.change"})
    thread = run_in_thread(svc)
    assert svc.wait_ready(15)
    pub = Publisher(broker, "test")
    try:
        for mid in ("abc-1", "abc-2"):
            pub.publish_raw(b"\xc1 junk", exchange=broker.topology.commands_exchange.name,
                            routing_key="decision.control", content_type="application/x-msgpack", message_id=mid)
        wait_for(lambda: queue_depth(broker, broker.topology.n("epu.dead")) == 2, 15, message="two dead letters")
    finally:
        svc.stop()
        thread.join(15)
        pub.close()
    cfg = _config(tmp_path, broker)
    for action in ("show", "requeue"):
        assert main(["dead", action, "abc", "-c", cfg]) == 1
        err = capsys.readouterr().err
        assert "'abc' is ambiguous: 2 dead letters start with it (abc-1, abc-2)" in err, err
    assert main(["dead", "show", "abc-2", "-c", cfg]) == 0
    assert json.loads(capsys.readouterr().out)["key"] == "abc-2"
    assert queue_depth(broker, broker.topology.n("epu.dead")) == 2
