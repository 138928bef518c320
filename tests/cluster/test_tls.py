"""AMQP over TLS against a RabbitMQ node of our own with a TLS listener and a local CA: the
broker's certificate is verified by default (chain and name), what to trust and which client
certificate to present are configurable, and a failure says why."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from epu.common.broker import Broker, BrokerUnavailable, Publisher, TlsSettings
from epu.common.config import ConfigError, parse_config
from epu.common.messages import Envelope, PolicyChange
from epu.common.runtime import Service, run_in_thread
from epu.common.testing import wait_for
from epu.common.topology import Topology

from tests.cluster.conftest import TlsNode
from tests.support.tlsca import LocalCA


def roundtrip(broker: Broker) -> list[str]:
    """A service consuming and a publisher sending, both over ``broker``."""
    got: list[str] = []
    lock = threading.Lock()

    def handler(msg: PolicyChange, env: Envelope) -> None:
        with lock:
            got.append(msg.change_id)

    svc = Service("decision", broker)
    svc.consume(broker.topology.decision_control_spec(), handler)
    thread = run_in_thread(svc)
    pub = Publisher(broker, "test")
    try:
        assert svc.wait_ready(20), svc.health()
        pub.publish(PolicyChange(change_id="over-tls", domain="alpha"))
        wait_for(lambda: got, 10, message="consumed over TLS")
    finally:
        svc.stop()
        thread.join(15)
        pub.close()
    return got


def tls(node: TlsNode, **over: object) -> TlsSettings:
    base = {"ca_file": str(node.ca.files.cert), "cert_file": str(node.client.cert),
            "key_file": str(node.client.key)}
    return TlsSettings(**{**base, **over})


def connect_error(url: str, settings: TlsSettings) -> str:
    with pytest.raises(BrokerUnavailable) as info:
        Broker(url, tls=settings, connect_timeout=5).connection()
    return str(info.value)


def test_verified_tls_with_a_client_certificate(tls_node: TlsNode) -> None:
    broker = Broker(tls_node.url("localhost"), Topology(prefix="tls1."), tls=tls(tls_node))
    assert roundtrip(broker) == ["over-tls"]


def test_the_name_is_checked_by_default_and_can_be_given(tls_node: TlsNode) -> None:
    # the certificate names localhost; the URL says 127.0.0.1: refused, naming the reason
    err = connect_error(tls_node.url("127.0.0.1"), tls(tls_node))
    assert "CERTIFICATE_VERIFY_FAILED" in err and "mismatch" in err.lower()
    # an operator whose URLs use addresses says which name to expect
    broker = Broker(tls_node.url("127.0.0.1"), Topology(prefix="tls2."), tls=tls(tls_node, server_name="localhost"))
    assert roundtrip(broker) == ["over-tls"]


def test_an_unknown_ca_is_refused(tls_node: TlsNode, tmp_path: Path) -> None:
    assert "CERTIFICATE_VERIFY_FAILED" in connect_error(tls_node.url(), tls(tls_node, ca_file=None))
    other = LocalCA(tmp_path / "other", "another CA")
    assert "CERTIFICATE_VERIFY_FAILED" in connect_error(tls_node.url(), tls(tls_node,
                                                                           ca_file=str(other.files.cert)))


def test_the_broker_requires_our_client_certificate(tls_node: TlsNode) -> None:
    err = connect_error(tls_node.url(), tls(tls_node, cert_file=None, key_file=None))
    # TLS 1.3: the refusal arrives as a "certificate required" alert or, racing it, as an EOF
    assert "certificate required" in err.lower() or "SSLEOFError" in err, err


def test_verification_off_is_explicit(tls_node: TlsNode) -> None:
    broker = Broker(tls_node.url("127.0.0.1"), Topology(prefix="tls3."), tls=tls(tls_node, verify=False,
                                                                                 ca_file=None))
    assert roundtrip(broker) == ["over-tls"]


def test_tls_config_is_validated_and_reaches_the_broker(tls_node: TlsNode, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="broker.tls.*ca_file: no such file"):
        parse_config({"broker": {"url": tls_node.url(), "tls": {"ca_file": str(tmp_path / "nope.pem")}}},
                     environ={})
    with pytest.raises(ConfigError, match="cert_file and key_file go together"):
        parse_config({"broker": {"url": tls_node.url(), "tls": {"cert_file": str(tls_node.client.cert)}}},
                     environ={})
    config = parse_config({"broker": {"url": tls_node.url("127.0.0.1"), "prefix": "tls4.", "tls": {
        "ca_file": str(tls_node.ca.files.cert), "cert_file": str(tls_node.client.cert),
        "key_file": str(tls_node.client.key), "server_name": "localhost"}}}, environ={})
    assert roundtrip(config.broker_obj()) == ["over-tls"]
