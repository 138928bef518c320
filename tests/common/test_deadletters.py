"""The pure rules of dead letters (common.deadletters, epu.cli_dead's ``describe`` and ``resolve``):
what a death note is and whose word it is, and when a requeue would lend authority (issue 33)."""

from __future__ import annotations

from datetime import UTC, datetime

import msgpack
import pytest
from epu.common.codec import encode
from epu.common.deadletters import (
    DeathNote,
    LetterFacts,
    NoteError,
    body_sha256,
    note_is_trusted,
    queue_reader,
    requeue_refusal,
    resent_headers,
    topic_matches,
)
from epu.common.messages import Envelope, NodeCommandResult, PolicyChange, TerminateRequest
from epu.common.senders import SenderPolicy
from epu.common.topology import Topology

from epu.cli_dead import DeadError, describe, resolve

T = Topology()
STRICT = SenderPolicy("p-", require_sender_user=True)
LAX = SenderPolicy()
FORCED = TerminateRequest(request_id="r1", instance_id="i-alpha-1", domain="alpha", reason="scale down", force=True)


def note(queue: str = "epu.provisioner", reason: str = "handler failed after 3 attempts: boom", **over) -> DeathNote:
    doc = {"queue": queue, "reason": reason, "body_sha256": "ab" * 32, "message_id": "m1",
           "type": "instance.terminate", "sender": "p-epu-decision", "exchange": "epu.commands",
           "routing_key": "provisioner.terminate", "attempts": 3, "dead_at": 10.0, "kept": True}
    return DeathNote(**{**doc, **over})


def test_topic_matching() -> None:
    assert topic_matches("instance.state.#", "instance.state.alpha.started")
    assert topic_matches("instance.state.#", "instance.state")
    assert topic_matches("node.result.*", "node.result.beta")
    assert not topic_matches("node.result.*", "node.result.beta.x")
    assert not topic_matches("node.result.*", "node.result")
    assert topic_matches("#", "anything.at.all")
    assert topic_matches("provisioner.terminate", "provisioner.terminate")
    assert not topic_matches("provisioner.terminate", "provisioner.launch")


def test_a_note_round_trips_and_a_bad_one_names_its_key() -> None:
    n = note()
    assert DeathNote.decode(n.encode()) == n
    doc = msgpack.unpackb(n.encode())
    with pytest.raises(NoteError, match="'attempts'"):
        DeathNote.decode(msgpack.packb({**doc, "attempts": "three"}))
    with pytest.raises(NoteError, match="'kept'"):
        DeathNote.decode(msgpack.packb({**doc, "kept": 1}))
    with pytest.raises(NoteError, match="'v'"):
        DeathNote.decode(msgpack.packb({**doc, "v": 99}))
    with pytest.raises(NoteError, match="not msgpack"):
        DeathNote.decode(b"\xc1")
    with pytest.raises(NoteError, match="bytes"):
        DeathNote.decode(b"\x00" * 20_000)


def test_a_note_is_believed_only_from_the_reader_of_its_queue() -> None:
    assert queue_reader(T, "epu.sensor.beta") == "epu-sensor-beta"
    assert queue_reader(T, "epu.decision.snapshot.alpha") == "epu-decision"
    assert queue_reader(T, "epu.provisioner") == "epu-provisioner"
    assert queue_reader(T, "epu.status.alpha") is None and queue_reader(T, "epu.nothing") is None
    n = note()
    assert note_is_trusted(n, "epu.provisioner", "p-epu-provisioner", STRICT, T)
    assert not note_is_trusted(n, "epu.sensor.beta", "p-epu-provisioner", STRICT, T), "its key is not its queue"
    assert not note_is_trusted(n, "epu.provisioner", "p-epu-sensor-beta", STRICT, T), "not the queue's reader"
    assert not note_is_trusted(n, "epu.provisioner", "guest", STRICT, T)
    assert note_is_trusted(n, "epu.provisioner", "guest", LAX, T), "a development broker: one user for all"
    assert not note_is_trusted(n, "epu.provisioner", "epu-sensor-beta", LAX, T), "an EPU user must be the reader"


def facts(msg, user: str | None, queue: str | None, reason: str | None = None) -> LetterFacts:
    return LetterFacts(type=msg.TYPE if msg is not None else "(unknown)", message=msg, user=user, death_queue=queue,
                       note=note(queue or "", reason) if reason else None)


def test_a_requeue_never_lends_authority() -> None:
    # the engine's terminate, dead-lettered by a provisioner after a handler bug: may go on, as the engine
    assert requeue_refusal(facts(FORCED, "p-epu-decision", "epu.provisioner"), STRICT, T) is None
    # beta's sensor sent it (issue 33): its proven sender may not send terminates
    why = requeue_refusal(facts(FORCED, "p-epu-sensor-beta", "epu.provisioner"), STRICT, T)
    assert why is not None and "p-epu-sensor-beta" in why
    # it died where no terminate is ever delivered (sent on beta's own key to the engine's input)
    why = requeue_refusal(facts(FORCED, "p-epu-decision", "epu.decision.input"), STRICT, T)
    assert why is not None and "epu.decision.input" in why
    # put into the dead-letter queue by someone other than the broker
    why = requeue_refusal(facts(FORCED, "p-epu-decision", None), STRICT, T)
    assert why is not None and "x-death" in why
    # it died because its sender was not allowed: a lax deployment would take it on its body's key
    result = NodeCommandResult(command_id="c1", domain="alpha", action="remove", node="n1", ok=True)
    assert requeue_refusal(facts(result, "guest", "epu.decision.input"), LAX, T) is None
    why = requeue_refusal(facts(result, "guest", "epu.decision.input",
                                "sender not allowed: node.result came by routing key 'node.result.beta'"), LAX, T)
    assert why is not None and why.startswith("it died because sender not allowed")
    # no user_id where the deployment requires one
    assert requeue_refusal(facts(FORCED, None, "epu.provisioner"), STRICT, T) is not None
    # undecodable: nothing to send on
    assert "does not decode" in (requeue_refusal(facts(None, "p-epu-decision", "epu.provisioner"), STRICT, T) or "")
    # an operator's own policy change, rejected until a fix
    change = PolicyChange(change_id="p1", domain="gamma", max_nodes=2)
    assert requeue_refusal(facts(change, "p-epu-operator", "epu.decision.control",
                                 "rejected by decision: unknown domain"), STRICT, T) is None


def test_a_requeue_resends_the_senders_headers_only() -> None:
    headers = {"compression": "application/zlib", "x-epu-reason": "innocent", "x-death": [{}],
               "x-first-death-queue": "q", "x-delivery-count": 2, "trace": "t1"}
    assert resent_headers(headers) == {"compression": "application/zlib", "trace": "t1"}


def test_describe_believes_the_broker_and_the_note_never_the_senders_headers() -> None:
    body = encode(Envelope.wrap(FORCED, "forger"))
    forged = {"x-epu-reason": "handler failed after 3 attempts: database is locked",
              "x-epu-original-queue": "epu.provisioner", "x-epu-original-exchange": "epu.commands",
              "x-epu-original-routing-key": "provisioner.terminate",
              "x-death": [{"queue": "epu.decision.input", "reason": "rejected", "exchange": "epu.commands",
                           "routing-keys": ["provisioner.terminate"], "count": 2,
                           "time": datetime(2026, 1, 1, tzinfo=UTC)}]}
    props = {"user_id": "p-epu-sensor-beta", "message_id": "f00d1234", "type": "instance.terminate"}
    d = describe(body, props, forged, policy=STRICT, topology=T)
    assert (d.type, d.domain, d.force, d.sender, d.queue) == (
        "instance.terminate", "alpha", True, "p-epu-sensor-beta", "epu.decision.input")
    assert d.reason == "rejected by the broker" and "database is locked" not in d.reason
    assert (d.exchange, d.routing_key) == ("epu.commands", "provisioner.terminate")  # from its body
    assert d.refusal is not None and "epu.decision.input" in d.refusal
    n = note("epu.decision.input", "unexpected message type 'instance.terminate' on epu.decision.input",
             body_sha256=body_sha256(body))
    d = describe(body, props, forged, notes={("epu.decision.input", body_sha256(body)): n}, policy=STRICT, topology=T)
    assert d.reason.startswith("unexpected message type") and d.attempts == 3 and d.dead_at == 10.0
    assert list(d.summary(0.0))[:3] == ["type", "domain", "force"]


def test_describe_a_broker_dead_letter_and_a_bare_body() -> None:
    """A message the broker itself dead-lettered (expired) whose body is no valid message, without a
    message id: still a type, a reason, a queue and a key; nothing to requeue."""
    body = msgpack.packb({"type": "instance.launch", "body": {}})
    d = describe(body, {}, {"x-death": [{"reason": "expired", "queue": "epu.provisioner", "exchange": "epu.commands",
                                         "routing-keys": ["provisioner.launch"],
                                         "time": datetime(2026, 1, 1, tzinfo=UTC)}]})
    assert (d.type, d.reason, d.queue, d.exchange, d.routing_key) == (
        "instance.launch", "expired by the broker", "epu.provisioner", "", "")
    assert d.dead_at == datetime(2026, 1, 1, tzinfo=UTC).timestamp() and len(d.key) == 12
    assert d.refusal is not None and "does not decode" in d.refusal


def test_a_key_prefix_names_one_letter_or_is_refused() -> None:
    keys = ("3f2a9c01", "3f2a9c02", "77aa", "77aa", "5b1e0d")
    letters = [describe(encode(Envelope.wrap(FORCED, "x")), {"message_id": k}, {}) for k in keys]
    assert resolve(letters, "3f2a9c01") == 0
    assert resolve(letters, "5b") == 4, "a unique prefix is enough"
    with pytest.raises(DeadError, match="ambiguous: 2 dead letters"):
        resolve(letters, "3f2a")
    assert resolve(letters, "3f2a9c02") == 1
    assert resolve(letters, "77") == 2, "copies of one message share a key: not ambiguous"
    with pytest.raises(DeadError, match="no dead letter 'zz'"):
        resolve(letters, "zz")
    with pytest.raises(DeadError):
        resolve(letters, "")
