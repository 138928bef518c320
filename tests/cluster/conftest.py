"""RabbitMQ nodes of the tests' own (never the system's on 5672): a three-node cluster, started
once for this package and torn down when its last test is done (not at the session's end: three idle
Erlang VMs would otherwise share the 2-core machine with the rest of the suite), and a single node with a TLS
listener signed by a throwaway CA. Ports and node names are random, so parallel sessions never
collide. See tests/support/rabbitnodes.py for what makes a private node work beside the system's."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.rabbitnodes import RabbitCluster, RabbitNode, free_port_pair
from tests.support.tlsca import Issued, LocalCA


@pytest.fixture(scope="package")
def rabbit_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitCluster]:
    cluster = RabbitCluster(tmp_path_factory.mktemp("rabbit-cluster"), size=3)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@dataclass
class TlsNode:
    node: RabbitNode
    tls_port: int
    ca: LocalCA
    server: Issued
    client: Issued

    def url(self, host: str = "localhost", vhost: str = "/") -> str:
        return self.node.url(scheme="amqps", host=host, port=self.tls_port, vhost=vhost)


@pytest.fixture(scope="module")
def tls_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsNode]:
    base: Path = tmp_path_factory.mktemp("rabbit-tls")
    ca = LocalCA(base / "pki")
    server = ca.issue("server", dns=["localhost"])  # names localhost only: 127.0.0.1 is a mismatch
    client = ca.issue("client", dns=["epu-client"], client=True)
    tls_port = free_port_pair()
    config = (f"listeners.ssl.default = 127.0.0.1:{tls_port}\n"
              f"ssl_options.cacertfile = {ca.files.cert}\n"
              f"ssl_options.certfile = {server.cert}\n"
              f"ssl_options.keyfile = {server.key}\n"
              "ssl_options.verify = verify_peer\n"
              "ssl_options.fail_if_no_peer_cert = true\n")
    node = RabbitNode(base, 1, secrets.token_hex(16).upper(), extra_config=config)
    try:
        node.start()
        yield TlsNode(node, tls_port, ca, server, client)
    finally:
        node.stop()


@pytest.fixture(scope="module")
def small_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitNode]:
    """A node that refuses messages over 1 MiB (``max_message_size``): the refusal a publisher
    meets when a message is too large, without sending hundreds of megabytes."""
    node = RabbitNode(tmp_path_factory.mktemp("rabbit-small"), 1, secrets.token_hex(16).upper(),
                      extra_config="max_message_size = 1048576\n")
    try:
        node.start()
        yield node
    finally:
        node.stop()
