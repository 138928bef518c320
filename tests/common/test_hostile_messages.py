"""Hostile messages, sent with pika (an independent client) following docs/messages.md, against the
real broker: each of the messages that used to crash-loop every service is dead-lettered with a
reason, byte for byte, and the consumer goes on serving. Everything a message carries is
hostile: properties, headers, encoding, compression, size."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
import zlib
from pathlib import Path

import msgpack
import pika
import pytest
from epu.common.broker import Broker, MessageLimits
from epu.common.deadletters import death_queue
from epu.common.messages import Envelope, PolicyChange
from epu.common.runtime import RuntimeSettings, Service, run_in_thread
from epu.common.testing import wait_for
from epu.common.topology import Topology

from tests.support.dead import DeadLetters
from tests.support.tcpproxy import TcpProxy

pytestmark = pytest.mark.rabbitmq
ROOT = Path(__file__).resolve().parents[2]


def envelope(body: dict, **over: object) -> dict:
    return {"schema_version": "1.0", "type": "policy.change", "id": uuid.uuid4().hex, "timestamp": time.time(),
            "source": "pika-hostile", "correlation_id": None, "body": body, **over}


def good(change_id: str) -> bytes:
    return msgpack.packb(envelope({"change_id": change_id, "domain": "alpha"}))


def nested(depth: int) -> dict:
    top: dict = {}
    cur = top
    for _ in range(depth):
        nxt: dict = {}
        cur["a"] = nxt
        cur = nxt
    return top


def zlib_bomb(inflated: int) -> bytes:
    c = zlib.compressobj(9)
    chunk = b"\0" * (1 << 20)
    out = [c.compress(chunk) for _ in range(inflated >> 20)]
    return b"".join(out) + c.flush()


def hostile_set() -> list[tuple[str, bytes, pika.BasicProperties, str]]:
    """(name, body, properties, expected reason fragment): the six of the issue, and more."""
    props = dict(content_type="application/x-msgpack", delivery_mode=2)
    # a valid envelope whose bytes include 0x80: cp1252 turns it into '€', which latin-1 cannot encode
    cp_body = msgpack.packb(envelope({"change_id": "cp", "domain": "alpha"}, extra=b"\x80\x81\x82"))
    bomb = zlib_bomb(200 << 20)  # ~200 KB that inflates to 200 MB
    return [
        ("cp1252", cp_body, pika.BasicProperties(content_encoding="cp1252", **props), "content_encoding 'cp1252'"),
        ("unknown compression", good("x1"), pika.BasicProperties(headers={"compression": "application/x-nope"},
                                                                  **props), "compression 'application/x-nope'"),
        ("corrupt zlib", b"x\x9c\x01\x02garbage-not-deflate",
         pika.BasicProperties(headers={"compression": "application/x-gzip"}, **props), "is corrupt"),
        ("5000-digit major", msgpack.packb(envelope({"change_id": "big", "domain": "alpha"},
                                                    schema_version="9" * 5000 + ".0")),
         pika.BasicProperties(**props), "schema_version"),
        ("headers 3000 deep", good("deep"), pika.BasicProperties(headers=nested(3000), **props), "headers too large"),
        ("200 MB zlib bomb", bomb, pika.BasicProperties(headers={"compression": "application/x-gzip"}, **props),
         "compression bomb"),
        ("text/plain", good("txt"), pika.BasicProperties(content_type="text/plain"), "content_type 'text/plain'"),
        ("too large", b"\x00" * (300 * 1024), pika.BasicProperties(**props), "exceeds the"),
        ("truncated lzma", b"\xfd7zXZ\x00\x00", pika.BasicProperties(headers={"compression": "lzma"}, **props),
         "compressed body"),
        ("headers not a table of sane size", good("wide"),
         pika.BasicProperties(headers={f"h{i}": "v" * 100 for i in range(1000)}, **props), "headers too large"),
    ]


class Seen:
    def __init__(self) -> None:
        self.ids: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, msg: PolicyChange, env: Envelope) -> None:
        with self.lock:
            self.ids.append(msg.change_id)


def publish_with_pika(url: str, exchange: str, key: str, items: list[tuple[bytes, pika.BasicProperties]]) -> None:
    import sys as _sys

    old = _sys.getrecursionlimit()
    _sys.setrecursionlimit(20000)  # pika's own header encoder recurses too
    try:
        conn = pika.BlockingConnection(pika.URLParameters(url))
        ch = conn.channel()
        ch.confirm_delivery()
        for body, props in items:
            ch.basic_publish(exchange, key, body, props)
        conn.close()
    finally:
        _sys.setrecursionlimit(old)


def test_each_hostile_message_is_dead_lettered_with_a_reason_and_the_consumer_keeps_serving(
        broker: Broker, rabbit_url: str) -> None:
    limited = Broker(broker.url, broker.topology, limits=MessageLimits(max_body_bytes=256 * 1024,
                                                                       max_inflated_bytes=1024 * 1024))
    seen = Seen()
    svc = Service("decision", limited, settings=RuntimeSettings(max_attempts=1))
    svc.consume(limited.topology.decision_control_spec(), seen, types={"policy.change"})
    thread = run_in_thread(svc)
    assert svc.wait_ready(15)
    cases = hostile_set()
    try:
        publish_with_pika(rabbit_url, limited.topology.n("epu.commands"), "decision.control",
                          [(body, props) for _name, body, props, _why in cases]
                          + [(good("after"), pika.BasicProperties(content_type="application/x-msgpack"))])
        wait_for(lambda: "after" in seen.ids, 30, message="the good message after the hostile ones")
        letters = DeadLetters(limited)
        dead = wait_for(lambda: letters.take(len(cases)), 30, message="every hostile message dead-lettered")
    finally:
        svc.stop()
        thread.join(20)
    assert seen.ids == ["after"], "nothing hostile reached the handler"
    assert svc.reconnect_count == 0, "no hostile message cost the connection"
    assert len(dead) == len(cases)
    for (name, body, _props, why), d in zip(cases, dead, strict=True):
        assert why in d.reason, (name, d.reason)
        assert d.body == body, f"{name}: the dead letter is the original bytes"
        assert d.queue == limited.topology.n("epu.decision.control"), "the broker's own record of where it died"


def _vm_hwm_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


SERVICES = {
    # service: (config sections, command routing key, a good command, tap pattern, answer id field)
    "decision": ('[decision]\nstore_url = "sqlite:///{tmp}/d.db"\nmetrics_port = {metrics}\niteration_seconds = 0.5\n'
                 '[domains.alpha]\nmax_nodes = 2\nsites = ["s1"]\n[sites.s1]\ndriver = "epu-sim"\n',
                 "decision.control", ("policy.change", {"change_id": "op-after", "domain": "alpha"}),
                 "policy.outcome.alpha", "change_id"),
    "sensor": ('[sensor]\ndomain = "alpha"\nbackend = "simulated"\npoll_seconds = 1\nmetrics_port = {metrics}\n',
               "sensor.alpha", ("node.command", {"command_id": "op-after", "domain": "alpha", "action": "add",
                                                 "node": "w1"}),
               "node.result.alpha", "command_id"),
    "provisioner": ('[provisioner]\nstore_url = "sqlite:///{tmp}/p.db"\nmetrics_port = {metrics}\npoll_seconds = 0.5\n'
                    '[sites.s1]\ndriver = "epu-sim"\n[sites.s1.driver_args]\npath = "{tmp}/cloud.db"\n',
                    "provisioner.launch", ("instance.launch", {"launch_id": "op-after", "domain": "alpha",
                                                               "site": "s1", "node_name": "w1"}),
                    "instance.state.alpha.*", "instance_id"),
}


@pytest.mark.quorum  # none may reach the broker's delivery limit, which only quorum queues have
@pytest.mark.parametrize("service", sorted(SERVICES))
def test_a_real_service_process_survives_every_hostile_message(service: str, rabbit_url: str, prefix: str,
                                                               tmp_path: Path) -> None:
    """``epu run SERVICE``: the six messages that each killed sensor, decision and provisioner
    on every redelivery, then a good command — answered, the process alive, never reconnected,
    memory bounded."""
    sections, key, (type_, body), answer_key, id_field = SERVICES[service]
    metrics = TcpProxy._free_port()
    cfg = tmp_path / "epu.toml"
    cfg.write_text(f'[broker]\nurl = "{rabbit_url}"\nprefix = "{prefix}"\n'
                   + sections.format(tmp=tmp_path, metrics=metrics))
    env = {k: v for k, v in os.environ.items() if not k.startswith("EPU_")}
    env["PYTHONPATH"] = str(ROOT)
    log = open(tmp_path / "service.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([sys.executable, "-m", "epu", "run", service, "-c", str(cfg)], env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    conn = None
    try:
        def healthy() -> bool:
            try:
                import urllib.request

                with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/healthz", timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False

        wait_for(healthy, 30, message=f"{service} healthy")
        base_rss = _vm_hwm_kib(proc.pid)
        cases = [c for c in hostile_set() if c[0] in ("cp1252", "unknown compression", "corrupt zlib",
                                                       "5000-digit major", "headers 3000 deep", "200 MB zlib bomb")]
        # an operator's pika client taps the answer (docs/messages.md, "Watching and commanding")
        conn = pika.BlockingConnection(pika.URLParameters(rabbit_url))
        ch = conn.channel()
        tap = f"{prefix}epu.tap.{uuid.uuid4().hex[:8]}"
        ch.queue_declare(tap, exclusive=True, auto_delete=True)
        ch.queue_bind(tap, f"{prefix}epu.events", answer_key)
        good_command = msgpack.packb(envelope(body, type=type_))
        publish_with_pika(rabbit_url, f"{prefix}epu.commands", key,
                          [(b, p) for _n, b, p, _w in cases]
                          + [(good_command, pika.BasicProperties(content_type="application/x-msgpack"))])
        answer = None
        for _method, _props, raw in ch.consume(tap, inactivity_timeout=30, auto_ack=True):
            assert raw is not None, f"no {answer_key} within 30 s"
            got = msgpack.unpackb(raw)
            if got["body"].get(id_field) == "op-after":
                answer = got
                break
        assert answer is not None
        assert proc.poll() is None and healthy()
        grown_mib = (_vm_hwm_kib(proc.pid) - base_rss) / 1024
        assert grown_mib < 64, f"peak RSS grew {grown_mib:.0f} MiB on a 200 MB zlib bomb"
        found = DeadLetters(Broker(rabbit_url, Topology(prefix=prefix)))
        dead = wait_for(lambda: found.take(6), 15, message="six dead letters with their notes")
        assert len(dead) == 6 and all(d.reason for d in dead)
        assert all(death_queue(d.headers)[1] == "rejected" for d in dead), "none reached the broker's delivery limit"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        if conn is not None and conn.is_open:
            conn.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        log.close()
    text = (tmp_path / "service.log").read_text()
    assert "broker connection lost" not in text and "reconnected" not in text, "no message cost the connection"
    assert "Traceback" not in text, text[-3000:]
