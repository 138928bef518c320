"""The message contract without a broker: round-trips and rejection of malformed messages."""

from __future__ import annotations

import msgpack
import pytest
from epu.common.codec import decode, decode_envelope, encode
from epu.common.messages import (
    REGISTRY,
    DecodeError,
    Envelope,
    LaunchRequest,
    NodeCommand,
    PolicyChange,
    open_envelope,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.common.strategies import model_strategy

ALL_TYPES = sorted(REGISTRY)


def test_every_design_message_type_is_registered() -> None:
    expected = {"sensor.snapshot", "node.command", "node.result", "instance.launch", "instance.terminate",
                "instance.state", "decision.record", "policy.change", "policy.outcome", "context.member"}
    assert expected <= set(REGISTRY)


@pytest.mark.parametrize("type_name", ALL_TYPES)
@settings(max_examples=20, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
          deadline=None)
@given(data=st.data())
def test_round_trip(type_name: str, data: st.DataObject) -> None:
    cls = REGISTRY[type_name]
    message = data.draw(model_strategy(cls))
    envelope = Envelope.wrap(message, source="test", correlation_id="c-1")
    raw = encode(envelope)
    env2, msg2 = decode(raw)
    assert msg2 == message
    assert env2 == envelope
    assert env2.type == type_name and env2.schema_version.startswith("1.")
    # routing keys are always routable (no empty words)
    assert all(message.routing_key().split("."))


def _raw(**overrides: object) -> bytes:
    env = Envelope.wrap(PolicyChange(change_id="c1", domain="alpha", min_nodes=1), source="t")
    doc = env.model_dump()
    doc.update(overrides)
    return msgpack.packb(doc, use_bin_type=True)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"\xc1\x00garbage", "not msgpack"),
        (msgpack.packb([1, 2, 3]), "expected a map"),
        (_raw(schema_version="2.0"), "unsupported schema major version 2.0"),
        (_raw(type="no.such.type"), "unknown message type"),
        (_raw(body={"change_id": "c1"}), "domain: Field required"),
        (_raw(body={"change_id": "c1", "domain": "alpha", "min_nodes": "3"}), "min_nodes"),
        (_raw(body={"change_id": "c1", "domain": "Bad Domain!"}), "domain"),
        (_raw(id=5), "id"),
        (_raw(schema_version="one"), "schema_version"),
    ],
    ids=["garbage", "not-a-map", "unknown-major", "wrong-type", "missing-field", "string-for-int",
         "bad-domain", "bad-envelope-field", "bad-version-format"],
)
def test_malformed_messages_are_rejected_with_a_reason(raw: bytes, reason: str) -> None:
    with pytest.raises(DecodeError, match=reason):
        decode(raw)


def test_newer_minor_version_with_unknown_fields_is_accepted() -> None:
    raw = _raw(schema_version="1.7", body={"change_id": "c1", "domain": "alpha", "brand_new_field": [1]})
    _env, msg = decode(raw)
    assert isinstance(msg, PolicyChange) and msg.domain == "alpha"


def test_hostile_host_names_are_refused_in_node_commands() -> None:
    for bad in ["node; rm -rf /", "-oProxyCommand=x", "a" * 64, "node name", "$(reboot)", "", "n..x"]:
        with pytest.raises(ValueError):
            NodeCommand(command_id="c", domain="alpha", action="add", node=bad)
    NodeCommand(command_id="c", domain="alpha", action="add", node="worker-01.example.org")


def test_launch_request_fields_are_strict() -> None:
    with pytest.raises(ValueError):
        LaunchRequest(launch_id="l1", domain="alpha", site="sim", node_name="w1", cores=0)
    env = decode_envelope(encode(Envelope.wrap(
        LaunchRequest(launch_id="l1", domain="alpha", site="sim", node_name="w1"), source="t")))
    assert open_envelope(env).cores == 1
