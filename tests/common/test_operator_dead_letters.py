"""``epu dead`` as the generated ``epu-operator`` user (exactly its permissions, definitions
loaded into a fresh vhost of the real broker): it lists the dead letters and requeues a policy
change it may send; it cannot requeue a launch (it may never send one), and the dead letter
is kept."""

from __future__ import annotations

import json

import pytest
from epu.common.broker import Broker, Publisher
from epu.common.messages import LaunchRequest, PolicyChange
from epu.common.testing import queue_depth

from epu.cli import main
from tests.support.definitions import loaded_definitions

pytestmark = pytest.mark.rabbitmq


def _dead_letter(admin: Broker, msg, queue: str, routing_key: str, exchange: str) -> None:
    """What the runtime makes of a refused message (its headers), published as the admin."""
    from epu.common.codec import encode
    from epu.common.messages import Envelope

    pub = Publisher(admin, "test")
    try:
        pub.publish_raw(encode(Envelope.wrap(msg, "test")),
                        exchange=admin.topology.n("epu.dlx"), routing_key=queue, message_id=f"m-{routing_key}",
                        type_=msg.TYPE, content_type="application/x-msgpack",
                        headers={"x-epu-reason": "rejected by decision: unknown domain", "x-epu-original-queue": queue,
                                 "x-epu-original-exchange": exchange, "x-epu-original-routing-key": routing_key,
                                 "x-epu-dead-at": 1.0})
    finally:
        pub.close()


def test_operator_lists_and_requeues_what_it_may_send(tmp_path, capsys) -> None:
    with loaded_definitions(["alpha"], admin_access=True) as d:
        admin = Broker(d.admin_url, d.topology, declare=False)
        _dead_letter(admin, PolicyChange(change_id="p1", domain="alpha", max_nodes=2), "epu.decision.control",
                     "decision.control", "epu.commands")
        _dead_letter(admin, LaunchRequest(launch_id="l1", domain="alpha", site="s1", node_name="w1"),
                     "epu.provisioner", "provisioner.launch", "epu.commands")
        cfg = tmp_path / "operator.toml"
        cfg.write_text(f'[broker]\nurl = "{d.url("epu-operator")}"\ndeclare = false\n')
        assert main(["dead", "list", "--json", "-c", str(cfg)]) == 0
        letters = json.loads(capsys.readouterr().out)["letters"]
        assert {(x["type"], x["reason"]) for x in letters} == {
            ("policy.change", "rejected by decision: unknown domain"),
            ("instance.launch", "rejected by decision: unknown domain")}
        assert main(["dead", "requeue", "m-decision.control", "-c", str(cfg)]) == 0
        capsys.readouterr()
        assert queue_depth(admin, "epu.decision.control") == 1  # back where it was going (a SAC queue: no peek)
        assert main(["dead", "requeue", "m-provisioner.launch", "-c", str(cfg)]) == 1
        assert "not requeued (kept)" in capsys.readouterr().err
        assert queue_depth(admin, "epu.dead") == 1
