"""Conformance with an independent AMQP client (pika), using only docs/messages.md:
tap every event of a run with a queue bound to ``#`` and send an operator policy change.

Nothing from ``common`` is imported to talk to the broker or to encode/decode: plain pika and
plain msgpack, the way a script in another language would do it. (The run itself is the
embedded demo pointed at RabbitMQ.)"""

from __future__ import annotations

import threading
import time
import uuid

import msgpack
import pika
import pytest

from epu.demo import DemoSettings, run_demo

pytestmark = pytest.mark.rabbitmq


def envelope(type_: str, body: dict) -> bytes:
    """Built by hand from docs/messages.md ("Envelope and versioning")."""
    return msgpack.packb({"schema_version": "1.0", "type": type_, "id": uuid.uuid4().hex,
                          "timestamp": time.time(), "source": "pika-conformance", "correlation_id": None,
                          "body": body})


def test_pika_client_taps_a_run_and_changes_a_policy(rabbit_url: str, prefix: str) -> None:
    params = pika.URLParameters(rabbit_url)
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    events_exchange = f"{prefix}epu.events"
    ch.exchange_declare(events_exchange, "topic", durable=True)  # idempotent; the services declare it too
    tap = f"{prefix}epu.tap.{uuid.uuid4().hex[:8]}"
    ch.queue_declare(tap, exclusive=True, auto_delete=True)
    ch.queue_bind(tap, events_exchange, "#")

    settings = DemoSettings(jobs=8, job_seconds=1.5, cores_per_node=2, max_nodes=2, boot_seconds=0.5,
                            idle_seconds=0.5, quota_a=4, timeout=90, seed=1, with_ctxbroker=False,
                            broker_url=rabbit_url, prefix=prefix)
    result: dict = {}
    run = threading.Thread(target=lambda: result.update(run_demo(settings, live_display=False, out=None)))
    run.start()

    seen: list[tuple[str, dict]] = []
    sent = False
    outcomes: dict[str, dict] = {}
    deadline = time.monotonic() + 120
    for method, props, body in ch.consume(tap, inactivity_timeout=1.0):
        if body is not None:
            assert props.content_type == "application/x-msgpack"
            env = msgpack.unpackb(body)
            assert set(env) >= {"schema_version", "type", "id", "timestamp", "source", "correlation_id", "body"}
            seen.append((method.routing_key, env))
            if env["type"] == "policy.outcome":
                outcomes[env["body"]["change_id"]] = env["body"]
            ch.basic_ack(method.delivery_tag)
        if not sent and any(e["type"] == "decision.record" for _, e in seen):
            # an operator raises max_nodes, and sends one bad change (min > max)
            pub = conn.channel()
            pub.confirm_delivery()
            props_out = pika.BasicProperties(content_type="application/x-msgpack", delivery_mode=2)
            pub.basic_publish(f"{prefix}epu.commands", "decision.control",
                              envelope("policy.change", {"change_id": "op-good", "domain": "demo", "max_nodes": 3}),
                              props_out)
            pub.basic_publish(f"{prefix}epu.commands", "decision.control",
                              envelope("policy.change", {"change_id": "op-bad", "domain": "demo",
                                                         "min_nodes": 9, "max_nodes": 1}), props_out)
            sent = True
        if (not run.is_alive() and {"op-good", "op-bad"} <= set(outcomes)) or time.monotonic() > deadline:
            break
    ch.cancel()
    run.join(60)
    conn.close()

    types = {e["type"] for _, e in seen}
    assert {"sensor.snapshot", "instance.state", "decision.record", "node.result", "policy.outcome"} <= types
    keys = {rk for rk, _ in seen}
    assert "sensor.snapshot.demo" in keys and "decision.record.demo" in keys
    assert any(rk.startswith("instance.state.demo.") for rk in keys)
    assert outcomes["op-good"]["applied"] is True and outcomes["op-good"]["version"] >= 1
    assert outcomes["op-bad"]["applied"] is False and "min_nodes" in outcomes["op-bad"]["reason"]
    assert result["jobs_completed"] == 8 and result["final_instances"] == 0
