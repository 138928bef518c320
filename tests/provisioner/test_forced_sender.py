"""Who may force a terminate, against the real broker (issue 33): the provisioner service runs as
``epu-provisioner`` in a vhost holding the generated least-privilege definitions, with
``require_sender_user``; RabbitMQ validates each publisher's ``user_id`` and the runtime hands it
to the handler (``Service.sender``). The engine's user may send terminates, but never a forced
one: refused, nothing destroyed. The operator's forced terminate destroys at once."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from epu.common.broker import Broker, Publisher
from epu.common.config import parse_config
from epu.common.messages import InstanceEvent, LaunchRequest, TerminateRequest
from epu.common.retire import Proof, RetireReason
from epu.common.runtime import run_in_thread
from epu.common.testing import drain, wait_for
from epu.services.provisioner.app import build_service
from epu.services.provisioner.sim import SimulatedNodeDriver
from kombu import Queue

from tests.support.definitions import Loaded, loaded_definitions

pytestmark = pytest.mark.rabbitmq


@pytest.fixture
def defs() -> Iterator[Loaded]:
    with loaded_definitions(["alpha"], admin_access=True) as d:
        yield d


def as_user(d: Loaded, role: str) -> Publisher:
    return Publisher(Broker(d.url(role), d.topology, declare=False), role)


def forced(i: str) -> TerminateRequest:
    return TerminateRequest(request_id=f"f-{i}", instance_id=i, domain="alpha", reason="now", force=True,
                            retire=RetireReason.OPERATOR, proof=Proof.FORCED)


def test_only_the_operator_may_force_a_terminate(defs: Loaded, tmp_path) -> None:
    config = parse_config({
        "broker": {"url": defs.url("epu-provisioner"), "declare": False, "user_prefix": defs.prefix,
                   "require_sender_user": True},
        "provisioner": {"store_url": f"sqlite:///{tmp_path / 'prov.db'}", "poll_seconds": 0.1,
                        "reconcile_seconds": 60.0},
        "sites": {"sim": {"driver": "epu-sim", "image": "sim-image", "size": "sim.1core"}},
    }, environ={})
    cloud = SimulatedNodeDriver(path=str(tmp_path / "cloud.db"), boot_time_min=0.1, boot_time_max=0.2)
    admin = Broker(defs.admin_url, defs.topology, declare=False)
    events = defs.topology.n("test.forced-events")
    with admin.connection() as conn:
        Queue(events, exchange=defs.topology.events_exchange, routing_key="instance.state.#",
              durable=False)(conn.channel()).declare()
    service = build_service(config, drivers={"sim": cloud})
    thread = run_in_thread(service)
    engine, operator = as_user(defs, "epu-decision"), as_user(defs, "epu-operator")
    seen: list[InstanceEvent] = []

    def has(pred) -> bool:  # noqa: ANN001
        seen.extend(m for _, m in drain(admin, events))
        return any(pred(e) for e in seen)

    try:
        assert service.wait_ready(15)
        for i in ("x1", "x2"):
            engine.publish(LaunchRequest(launch_id=i, domain="alpha", site="sim", node_name=f"w-{i}"))
        wait_for(lambda: has(lambda e: e.instance_id == "x2" and e.state == "started")
                 and has(lambda e: e.instance_id == "x1" and e.state == "started"), 20, message="both started")
        engine.publish(forced("x1"))
        wait_for(lambda: has(lambda e: e.instance_id == "x1" and e.reason.startswith("forced terminate refused")),
                 20, message="the engine's forced terminate refused")
        assert "sent by '" + defs.prefix + "epu-decision'" in next(
            e.reason for e in seen if e.reason.startswith("forced terminate refused"))
        assert cloud.ex_count() == 2 and service.provisioner.store.get("x1").state == "started"
        operator.publish(forced("x2"))
        wait_for(lambda: has(lambda e: e.instance_id == "x2" and e.state == "terminated"), 20,
                 message="the operator's forced terminate carried out")
        assert cloud.ex_count() == 1 and service.provisioner.store.get("x1").state == "started"
        assert [(d.instance_id, d.proof) for d in service.provisioner.store.destroys()] == [("x2", "forced")]
        reg = service.metrics.registry
        assert reg.get_sample_value("epu_provisioner_destroys_total",
                                    {"site": "sim", "proof": "forced", "outcome": "destroyed"}) == 1
    finally:
        engine.close()
        operator.close()
        service.stop()
        thread.join(15)
