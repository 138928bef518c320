"""``epu dead`` against the generated definitions loaded into a fresh vhost of the real broker, each
service and the operator as its own least-privilege user (issue 33, the dead-letter confused deputy).

* Beta's sensor cannot publish into the dead-letter exchange (403). Its forged, forced terminate of
  alpha's instance — forged ``x-epu-original-*`` headers, a forged ``x-death``, an innocent reason —
  sent on its own key dies for real at the engine's input; ``epu dead`` shows it for what it is
  (a forced terminate of alpha, sent by beta's sensor, with the engine's reason) and refuses to
  requeue it; nothing reaches the provisioners.
* The operator requeues its own policy change after a fix; it cannot requeue the engine's terminate
  as the engine (the broker refuses the ``user_id``: a requeue keeps the sender) and the letter is
  kept; a broker user with the ``impersonator`` tag can, and the provisioners get it from
  ``epu-decision``, as first sent.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from epu.common.broker import Broker, Publisher, PublishRefused
from epu.common.codec import encode
from epu.common.messages import Envelope, PolicyChange, TerminateRequest
from epu.common.runtime import Reject, Service, run_in_thread
from epu.common.senders import SenderPolicy
from epu.common.testing import drain, queue_depth, wait_for

from epu.cli import main
from tests.conftest import RABBIT_HOST, rabbitmqctl
from tests.support.definitions import Loaded, loaded_definitions

pytestmark = pytest.mark.rabbitmq


def service_broker(d: Loaded, role: str) -> Broker:
    """As a production service: its own user, no declaring, senders bound strictly."""
    return Broker(d.url(role), d.topology, declare=False, senders=SenderPolicy(d.prefix, require_sender_user=True))


def cli_config(tmp_path: Path, d: Loaded, url: str) -> str:
    cfg = tmp_path / f"cli-{uuid.uuid4().hex[:6]}.toml"
    cfg.write_text(f'[broker]\nurl = "{url}"\ndeclare = false\nuser_prefix = "{d.prefix}"\nrequire_sender_user = true\n')
    return str(cfg)


def running(svc: Service) -> threading.Thread:
    thread = run_in_thread(svc)
    assert svc.wait_ready(15)
    return thread


@pytest.fixture
def defs() -> Iterator[Loaded]:
    with loaded_definitions(["alpha", "beta"], admin_access=True) as d:
        yield d


def test_a_forged_terminate_is_no_ordinary_letter_and_is_never_requeued(defs: Loaded, tmp_path: Path, capsys) -> None:
    d = defs
    admin = Broker(d.admin_url, d.topology, declare=False)
    engine = Service("decision", service_broker(d, "epu-decision"))
    engine.consume(d.topology.decision_input_spec(), lambda _m, _e: None,
                   types={"node.result", "instance.state", "instance.report"})
    thread = running(engine)
    forged = TerminateRequest(request_id="r-forged", instance_id="i-alpha-1", domain="alpha",
                              reason="scale down", force=True)
    body = encode(Envelope.wrap(forged, "decision"))
    claims = {"x-epu-reason": "handler failed after 3 attempts: OperationalError: database is locked",
              "x-epu-original-queue": "epu.provisioner", "x-epu-original-exchange": "epu.commands",
              "x-epu-original-routing-key": "provisioner.terminate", "x-epu-dead-at": time.time(),
              "x-death": [{"queue": "epu.decision.input", "reason": "rejected", "exchange": "epu.commands",
                           "routing-keys": ["provisioner.terminate"], "count": 1}]}
    beta = Publisher(Broker(d.url("epu-sensor-beta"), d.topology, declare=False), "sensor")
    try:
        with pytest.raises(PublishRefused, match="ACCESS_REFUSED"):  # straight into the dead-letter exchange
            beta.publish_raw(body, exchange="epu.dlx", routing_key="epu.provisioner", headers=claims,
                             type_="instance.terminate", content_type="application/x-msgpack", message_id="f0rged-1")
        beta.publish_raw(body, exchange="epu.events", routing_key="node.result.beta", headers=claims,
                         type_="instance.terminate", content_type="application/x-msgpack", message_id="f0rged-1")
        wait_for(lambda: queue_depth(admin, "epu.dead") == 1, 20, message="the forged terminate dead-lettered")
    finally:
        beta.close()
        engine.stop()
        thread.join(15)

    operator = cli_config(tmp_path, d, d.url("epu-operator"))
    assert main(["dead", "list", "--json", "-c", operator]) == 0
    (letter,) = json.loads(capsys.readouterr().out)["letters"]
    assert (letter["type"], letter["domain"], letter["force"]) == ("instance.terminate", "alpha", True)
    assert letter["sender"] == d.prefix + "epu-sensor-beta" and letter["queue"] == "epu.decision.input"
    assert letter["reason"] == "unexpected message type 'instance.terminate' on epu.decision.input"
    assert letter["requeue"].startswith("refused")
    assert main(["dead", "list", "-c", operator]) == 0
    assert "instance.terminate alpha FORCE" in capsys.readouterr().out

    assert main(["dead", "show", "f0r", "-c", operator]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert list(shown.items())[:3] == [("type", "instance.terminate"), ("domain", "alpha"), ("force", True)]
    assert "x-epu-original-routing-key" in shown["sender_claims"] and "not believed" in shown["sender_claims"]

    assert main(["dead", "requeue", "f0r", "-c", operator]) == 1
    err = capsys.readouterr().err
    assert "not requeued (kept)" in err and "epu.decision.input" in err, err
    # nor as a broker administrator who may send as anyone: the check is the letter's, not the requeuer's
    impersonator, url = _impersonator(d)
    try:
        assert main(["dead", "requeue", "f0r", "-c", cli_config(tmp_path, d, url)]) == 1
        assert "not requeued (kept)" in capsys.readouterr().err
    finally:
        rabbitmqctl("delete_user", impersonator, check=False)
    assert queue_depth(admin, "epu.dead") == 1
    assert queue_depth(admin, "epu.provisioner") == 0, "no provisioner was asked to terminate anything"


def _impersonator(d: Loaded) -> tuple[str, str]:
    """A broker administrator for requeues: may publish with another user's ``user_id``."""
    name = f"{d.prefix}requeuer"
    password = secrets.token_urlsafe(12)
    rabbitmqctl("add_user", name, password)
    rabbitmqctl("set_user_tags", name, "impersonator")
    rabbitmqctl("set_permissions", "-p", d.vhost, name, "^$", "^epu\\.commands$", "^epu\\.dead(\\.notes)?$")
    return name, f"amqp://{name}:{password}@{RABBIT_HOST}/{d.vhost}"


def test_a_requeue_keeps_the_sender(defs: Loaded, tmp_path: Path, capsys) -> None:
    d = defs
    admin = Broker(d.admin_url, d.topology, declare=False)
    fixed = threading.Event()
    changes: list[str] = []

    def control(msg: PolicyChange, _env: Envelope) -> None:
        if not fixed.is_set():
            raise Reject(f"unknown domain {msg.domain!r}")
        changes.append(msg.change_id)

    def terminate(msg: TerminateRequest, _env: Envelope) -> None:
        raise Reject("site s9 is not configured")

    engine = Service("decision", service_broker(d, "epu-decision"))
    engine.consume(d.topology.decision_control_spec(), control, types={"policy.change"})
    prov = Service("provisioner", service_broker(d, "epu-provisioner"))
    prov.consume(d.topology.provisioner_spec(), terminate, types={"instance.terminate"})
    threads = [running(engine), running(prov)]
    op = Publisher(Broker(d.url("epu-operator"), d.topology, declare=False), "cli")
    dec = Publisher(Broker(d.url("epu-decision"), d.topology, declare=False), "decision")
    try:
        op.publish(PolicyChange(change_id="p-gamma", domain="gamma", max_nodes=2), message_id="op-change-1")
        dec.publish(TerminateRequest(request_id="r-1", instance_id="i-1", domain="alpha", reason="idle"),
                    message_id="dec-terminate-1")
        wait_for(lambda: queue_depth(admin, "epu.dead") == 2, 20, message="two dead letters")
        prov.stop()  # from here on the requeued terminate waits in its queue, to be looked at
        threads.pop().join(15)

        operator = cli_config(tmp_path, d, d.url("epu-operator"))
        fixed.set()
        assert main(["dead", "requeue", "op-change", "-c", operator]) == 0, capsys.readouterr().err
        assert f"as {d.prefix}epu-operator" in capsys.readouterr().out
        wait_for(lambda: changes == ["p-gamma"], 20, message="the operator's own change handled after the fix")

        assert main(["dead", "requeue", "dec-terminate", "-c", operator]) == 1
        err = capsys.readouterr().err
        assert "not requeued (kept)" in err and "a requeue keeps the letter's sender" in err, err
        assert queue_depth(admin, "epu.dead") == 1 and queue_depth(admin, "epu.provisioner") == 0

        impersonator, url = _impersonator(d)
        try:
            assert main(["dead", "requeue", "dec-terminate", "-c", cli_config(tmp_path, d, url)]) == 0
        finally:
            rabbitmqctl("delete_user", impersonator, check=False)
        capsys.readouterr()
        (resent,) = wait_for(lambda: drain(admin, "epu.provisioner", raw=True), 20, message="the requeued terminate")
        assert resent.properties["user_id"] == d.prefix + "epu-decision", "sent on as the engine, never as the requeuer"
        assert not any(k.startswith(("x-death", "x-first-death", "x-epu-")) for k in resent.headers)
        assert queue_depth(admin, "epu.dead") == 0
    finally:
        op.close()
        dec.close()
        for svc in (engine, prov):
            svc.stop()
        for t in threads:
            t.join(15)
