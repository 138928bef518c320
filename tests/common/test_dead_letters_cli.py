"""``epu dead list|show|requeue`` against the real RabbitMQ: real dead letters made by the service
runtime (a malformed message, a refused one), listed with type, reason and age, shown whole,
and one requeued after a fix — handled then, and gone from the dead-letter queue."""

from __future__ import annotations

import json
import threading
from datetime import UTC

import msgpack
import pytest
from epu.common.broker import Broker, Publisher
from epu.common.messages import Envelope, PolicyChange
from epu.common.runtime import Reject, Service, run_in_thread
from epu.common.testing import queue_depth, wait_for

from epu.cli import main
from epu.cli_dead import describe

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
        assert refused["reason"] == "rejected by decision: unknown domain 'gamma'"
        assert refused["queue"].endswith("epu.decision.control") and refused["routing_key"] == "decision.control"
        assert refused["age_seconds"] is not None and 0 <= refused["age_seconds"] < 60
        junk = next(d for d in doc["letters"] if d["key"] == "junk-1")
        assert "not msgpack" in junk["reason"] or "decode" in junk["reason"]
        assert queue_depth(broker, dead_q) == 2  # reading took nothing away

        assert main(["dead", "list", "-c", cfg]) == 0
        text = capsys.readouterr().out
        assert "policy.change" in text and "unknown domain 'gamma'" in text

        assert main(["dead", "show", refused["key"], "-c", cfg]) == 0
        shown = json.loads(capsys.readouterr().out)
        assert shown["body"]["body"]["change_id"] == "g1" and shown["headers"]["x-epu-reason"]

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


def test_describe_a_broker_dead_letter_and_a_bare_body() -> None:
    """A message the broker itself dead-lettered (x-death, no x-epu-* headers) and one without a
    message id: still a type, a reason, an origin and a key."""
    from datetime import datetime

    body = msgpack.packb({"type": "instance.launch", "body": {}})
    d = describe(body, {}, {"x-death": [{"reason": "expired", "queue": "epu.provisioner", "exchange": "epu.commands",
                                         "routing-keys": ["provisioner.launch"],
                                         "time": datetime(2026, 1, 1, tzinfo=UTC)}]})
    assert (d.type, d.reason, d.queue, d.exchange, d.routing_key) == (
        "instance.launch", "expired by the broker", "epu.provisioner", "epu.commands", "provisioner.launch")
    assert d.dead_at == datetime(2026, 1, 1, tzinfo=UTC).timestamp() and len(d.key) == 12
