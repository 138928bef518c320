"""Every inbound message is bound to the sender allowed to send it (common.senders), against the
real broker: the decision engine runs as ``epu-decision`` in a vhost holding the generated
least-privilege definitions, and each sensor and the provisioner publish as their own users —
RabbitMQ validates each ``user_id``. A snapshot whose body claims another domain than its key, or
sent by a user that may not send it, is dead-lettered — its death note, from the engine, says why —
and never becomes the domain's newest snapshot."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from epu.common.broker import Broker, Publisher, PublishRefused
from epu.common.config import load_config
from epu.common.deadletters import DeathNote
from epu.common.messages import InstanceEvent, NodeCommandResult, SensorSnapshot
from epu.common.runtime import run_in_thread
from epu.common.senders import SenderPolicy
from epu.common.testing import drain, wait_for
from epu.common.topology import DEFAULT_TOPOLOGY
from epu.services.decision.app import build_service

from tests.conftest import rabbitmqctl
from tests.support.dead import DeadLetters
from tests.support.definitions import Loaded, loaded_definitions

pytestmark = pytest.mark.rabbitmq

CONFIG = """
[broker]
url = "{url}"
declare = false
user_prefix = "{prefix}"
require_sender_user = true
[decision]
store_url = "sqlite:///{tmp}/decision.db"
iteration_seconds = 0.3
[domains.alpha]
max_nodes = 2
sites = ["s1"]
[domains.beta]
max_nodes = 2
sites = ["s1"]
[sites.s1]
driver = "epu-sim"
"""


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Loaded, object]]:
    tmp = tmp_path_factory.mktemp("senders")
    with loaded_definitions(["alpha", "beta"], admin_access=True) as d:
        cfg = tmp / "engine.toml"
        cfg.write_text(CONFIG.format(url=d.url("epu-decision"), tmp=tmp, prefix=d.prefix))
        engine = build_service(load_config(cfg, environ={}))
        thread = run_in_thread(engine)
        assert engine.wait_ready(15)
        try:
            yield d, engine
        finally:
            engine.stop()
            thread.join(15)


def as_user(d: Loaded, role: str) -> Publisher:
    return Publisher(Broker(d.url(role), d.topology, declare=False), role)


def dead_letters(d: Loaded) -> DeadLetters:
    """What the dead-letter queues hold (letters and their death notes), taken out."""
    found = DeadLetters(Broker(d.admin_url, d.topology, declare=False, senders=SenderPolicy(d.prefix, True)))
    found.take(0)
    return found


def wait_dead(d: Loaded, n: int = 1) -> list[DeathNote]:
    """The next ``n`` death notes (trusted: each from its queue's reader). A refused snapshot leaves only
    its note: the latest-value snapshot queue keeps no dead letters."""
    found = dead_letters(d)
    return wait_for(lambda: found.take(0) is not None and len(notes := found.trusted_notes()) >= n and notes, 30,
                    interval=0.2, message=f"{n} death note(s)")


def snap(domain: str, **over: object) -> SensorSnapshot:
    return SensorSnapshot(domain=domain, backend="simulated", taken_at=time.time(), **over)


def raw_snapshot(s: SensorSnapshot) -> dict:
    from epu.common.messages import Envelope

    return Envelope.wrap(s, "forger").model_dump(mode="python")


def test_a_body_claiming_another_domain_than_its_key_is_dead_lettered(world: tuple[Loaded, object]) -> None:
    """Beta's sensor may publish on beta's key only; a body there saying alpha is refused with the
    reason and is not alpha's newest snapshot (the forged snapshot would show alpha's nodes idle)."""
    d, engine = world
    dead_letters(d)  # start from an empty dead-letter queue
    beta = as_user(d, "epu-sensor-beta")
    try:
        beta.publish_raw(raw_snapshot(snap("alpha", running_jobs=99)), d.topology.events_exchange.name,
                         "sensor.snapshot.beta", type_="sensor.snapshot")
        dead = wait_dead(d)
    finally:
        beta.close()
    reason = dead[0].reason
    assert "sender not allowed" in reason and "sensor.snapshot.beta" in reason and "'alpha'" in reason, reason
    assert dead[0].sender == d.prefix + "epu-sensor-beta" and not dead[0].kept
    assert engine.engine.latest_snapshot("alpha") is None  # type: ignore[attr-defined]
    assert engine.engine.latest_snapshot("beta") is None, "nor is it beta's"  # type: ignore[attr-defined]


def test_the_sensor_of_the_domain_is_heard(world: tuple[Loaded, object]) -> None:
    d, engine = world
    alpha = as_user(d, "epu-sensor-alpha")
    try:
        alpha.publish(snap("alpha", running_jobs=3))
    finally:
        alpha.close()
    wait_for(lambda: engine.engine.latest_snapshot("alpha"), 30, message="alpha's own snapshot")  # type: ignore[attr-defined]
    assert engine.engine.latest_snapshot("alpha").running_jobs == 3  # type: ignore[attr-defined]


def test_the_broker_refuses_beta_on_alphas_key(world: tuple[Loaded, object]) -> None:
    """Least privilege, as generated: beta's sensor cannot publish on alpha's key at all."""
    d, _engine = world
    beta = as_user(d, "epu-sensor-beta")
    try:
        with pytest.raises(PublishRefused):
            beta.publish(snap("alpha"))
    finally:
        beta.close()


def test_a_message_sent_as_a_user_not_allowed_to_send_it_is_dead_lettered(world: tuple[Loaded, object]) -> None:
    """With topic permissions wider than generated (an operator's slip), the validated ``user_id``
    still binds the sender: beta's sensor on alpha's key, a sensor sending an instance event, and
    a message of a user that is none of EPU's (require_sender_user) are each dead-lettered."""
    d, engine = world
    dead_letters(d)
    beta_user = d.prefix + "epu-sensor-beta"
    ex = d.topology.events_exchange.name
    rabbitmqctl("set_topic_permissions", "-p", d.vhost, beta_user, ex, ".*", ".*")
    try:
        wait_for(lambda: ".*" in rabbitmqctl("list_user_topic_permissions", beta_user, check=False).stdout, 30)
        beta = as_user(d, "epu-sensor-beta")
        admin = Publisher(Broker(d.admin_url, d.topology, declare=False), "guest")
        try:
            beta.publish(snap("alpha", running_jobs=77))
            beta.publish(InstanceEvent(instance_id="i-x", domain="beta", site="s1", state="terminated", seq=9,
                                       at=time.time()))
            admin.publish(NodeCommandResult(command_id="c-1", domain="alpha", node="n1", action="offline",
                                            ok=True))
            dead = wait_dead(d, 3)
        finally:
            beta.close()
            admin.close()
    finally:
        rabbitmqctl("set_topic_permissions", "-p", d.vhost, beta_user, ex,
                    r"^(sensor\.snapshot|node\.result)\.beta$", ".*")
    reasons = sorted(x.reason for x in dead)
    assert any(f"sensor.snapshot of domain 'alpha' sent by user '{beta_user}'" in r
               and f"{d.prefix}epu-sensor-alpha" in r for r in reasons), reasons
    assert any(f"instance.state of domain 'beta' sent by user '{beta_user}'" in r
               and f"{d.prefix}epu-provisioner" in r for r in reasons), reasons
    assert any("node.result of domain 'alpha' sent with user 'guest'" in r for r in reasons), reasons
    latest = engine.engine.latest_snapshot("alpha")  # type: ignore[attr-defined]
    assert latest is None or latest.running_jobs != 77


def delivery(exchange: str, key: str, user: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(exchange=exchange, routing_key=key, properties={"user_id": user} if user else {})


def test_policy_binds_key_user_and_exchange() -> None:
    """The rules themselves, on every message type the services consume."""
    t = DEFAULT_TOPOLOGY
    ev = t.events_exchange.name
    p = SenderPolicy(user_prefix="x-")
    s = snap("alpha")
    assert p.check(t, delivery(ev, "sensor.snapshot.alpha", "x-epu-sensor-alpha"), s.TYPE, s) is None
    assert p.check(t, delivery(ev, "sensor.snapshot.alpha", "guest"), s.TYPE, s) is None, "not strict: guest is heard"
    assert "routing key" in p.check(t, delivery(ev, "sensor.snapshot.beta"), s.TYPE, s)
    assert "exchange" in p.check(t, delivery("", "epu.decision.snapshot.alpha"), s.TYPE, s)
    assert "x-epu-sensor-alpha" in p.check(t, delivery(ev, "sensor.snapshot.alpha", "x-epu-sensor-beta"), s.TYPE, s)
    strict = SenderPolicy(user_prefix="x-", require_sender_user=True)
    assert "no user_id" in strict.check(t, delivery(ev, "sensor.snapshot.alpha"), s.TYPE, s)
    ev2 = InstanceEvent(instance_id="i", domain="alpha", site="s1", state="started", seq=1, at=1.0)
    assert strict.check(t, delivery(ev, "instance.state.alpha.started", "x-epu-provisioner"), ev2.TYPE, ev2) is None
    assert "instance.state.alpha.started" in strict.check(t, delivery(ev, "instance.state.beta.started",
                                                                       "x-epu-provisioner"), ev2.TYPE, ev2)


def test_publisher_sets_the_connection_user(broker: Broker, tmp_path: Path) -> None:
    """Every AMQP publish carries ``user_id`` (the connection's user), which RabbitMQ validates."""
    from epu.common.messages import TerminateRequest
    from epu.common.topology import PROVISIONER_QUEUE

    q = broker.topology.provisioner_spec()
    with broker.connection() as conn:
        broker.topology.declare(conn.channel(), [q])
    pub = Publisher(broker, "t")
    try:
        pub.publish(TerminateRequest(request_id="r-1", instance_id="i-1", domain="alpha", reason="test"))
    finally:
        pub.close()
    got = wait_for(lambda: drain(broker, broker.topology.n(PROVISIONER_QUEUE), raw=True), 10)
    assert got[0].properties.get("user_id") == "guest"


def test_on_a_shared_user_broker_the_key_still_binds_the_domain(broker: Broker) -> None:
    """Development brokers (one user for all): a snapshot whose body says alpha, sent on beta's key,
    reaches no handler; it is dead-lettered saying which key it came by and what the body claims."""
    from epu.common.messages import Envelope
    from epu.common.runtime import Service

    seen: list[str] = []
    svc = Service("decision", broker)
    svc.consume(broker.topology.decision_snapshot_spec("beta"), lambda m, _e: seen.append(m.domain),
                types={"sensor.snapshot"})
    thread = run_in_thread(svc)
    assert svc.wait_ready(15)
    pub = Publisher(broker, "sensor-beta")
    try:
        pub.publish_raw(Envelope.wrap(snap("alpha"), "sensor-beta").model_dump(mode="python"),
                        broker.topology.events_exchange.name, "sensor.snapshot.beta", type_="sensor.snapshot")
        pub.publish(snap("beta"))
        wait_for(lambda: seen, 20, message="beta's own snapshot handled")
        found = DeadLetters(broker)
        dead = wait_for(lambda: found.take(0) is not None and found.trusted_notes(), 20, message="death note")
    finally:
        pub.close()
        svc.stop()
        thread.join(15)
    assert seen == ["beta"]
    reason = dead[0].reason
    assert "routing key 'sensor.snapshot.beta'" in reason and "domain 'alpha'" in reason, reason
