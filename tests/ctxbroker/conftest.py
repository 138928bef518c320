"""Fixtures for the context broker: a self-signed certificate, live HTTPS brokers, node fields."""

from __future__ import annotations

import base64
import os
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from epu.common import nodecred
from epu.services.ctxbroker.client import AdminClient, NodeClient
from epu.services.ctxbroker.server import BrokerServer, ServerSettings
from epu.services.ctxbroker.store import Store
from epu.services.ctxbroker.tls import self_signed

ADMIN_TOKEN = "test-admin-token-0123456789abcdef"
REPO = Path(__file__).resolve().parents[2]
DEFAULT_SCRIPTS = REPO / "deploy" / "ctx-scripts"


def ssh_key(seed: int | None = None) -> str:
    raw = os.urandom(32) if seed is None else seed.to_bytes(32, "big")
    blob = struct.pack(">I", 11) + b"ssh-ed25519" + struct.pack(">I", 32) + raw
    return "ssh-ed25519 " + base64.b64encode(blob).decode()


def node(i: int, **kw: object) -> dict[str, object]:
    doc: dict[str, object] = {"hostname": f"wn-{i}", "fqdn": f"wn-{i}.cluster.test", "ip": f"10.0.{i // 250}.{i % 250 + 1}",
                              "ssh_host_key": ssh_key(i + 1), "data": f"slots={i % 4 + 1}"}
    doc.update(kw)
    return doc


@pytest.fixture(autouse=True)
def _log_everything(caplog: pytest.LogCaptureFixture) -> None:
    """Build every log record (DEBUG), so a bad ``extra`` or a leaked secret cannot hide below the level."""
    import logging

    caplog.set_level(logging.DEBUG, logger="epu")


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    cert, key = self_signed(tmp_path_factory.mktemp("tls"))
    return str(cert), str(key)


@pytest.fixture
def make_broker(tls_files: tuple[str, str]) -> Iterator[Callable[..., BrokerServer]]:
    started: list[BrokerServer] = []

    def make(store_url: str, port: int = 0, refresh_interval: float = 0.5) -> BrokerServer:
        s = BrokerServer(ServerSettings("127.0.0.1", port, tls_files[0], tls_files[1], ADMIN_TOKEN, store_url,
                                        refresh_interval=refresh_interval))
        s.start_in_thread()
        started.append(s)
        return s

    yield make
    for s in started:
        s.stop()
    for s in started:
        s.join()


@pytest.fixture
def broker_server(make_broker: Callable[..., BrokerServer], sqlite_url: str) -> BrokerServer:
    return make_broker(sqlite_url)


@pytest.fixture
def admin(broker_server: BrokerServer, tls_files: tuple[str, str]) -> Iterator[AdminClient]:
    c = AdminClient(broker_server.public_url, ADMIN_TOKEN, ca_file=tls_files[0])
    yield c
    c.close()


@pytest.fixture
def context(admin: AdminClient) -> dict[str, str]:
    return admin.create("test")


def node_credential(context: dict[str, str], hostname: str, instance_id: str | None = None) -> nodecred.NodeCredential:
    """What the provisioner derives for a node it launches (from the context secret)."""
    return nodecred.issue(nodecred.signing_key(context["secret"]), context["id"], hostname, instance_id)


class Nodes:
    """Speaks for any node of a context, each with its own credential (as every node's agent
    would); reads with the context's key and secret. Drop-in for one ``NodeClient``.

    ``join`` is the honest path: for a node with an instance id it first records, in the
    broker's ``store``, the address the provisioner would report for that instance (the one the
    node joins with), as the broker's consumer of instance events does."""

    def __init__(self, context: dict[str, str], ca_file: str, uri: str | None = None,
                 store: Store | None = None) -> None:
        self.context, self.ca_file, self.uri, self.store = context, ca_file, uri or context["uri"], store
        self.reader = NodeClient(self.uri, context["key"], context["secret"], ca_file=ca_file)

    def as_node(self, hostname: str, instance_id: str | None = None) -> NodeClient:
        cred = node_credential(self.context, hostname, instance_id)
        return NodeClient(self.uri, cred.key, cred.secret, ca_file=self.ca_file)

    def join(self, doc: dict[str, object]) -> dict[str, object]:
        if doc.get("instance_id"):
            assert self.store is not None, "a node with an instance id joins once its address is reported"
            self.store.note_instance(str(doc["instance_id"]), str(doc["ip"]))
        c = self.as_node(str(doc["hostname"]), doc.get("instance_id"))  # type: ignore[arg-type]
        try:
            return c.join(doc)
        finally:
            c.close()

    def leave(self, hostname: str, instance_id: str | None = None) -> dict[str, object]:
        c = self.as_node(hostname, instance_id)
        try:
            return c.leave(hostname)
        finally:
            c.close()

    def updates(self, after: int, wait: float = 0.0) -> dict[str, object]:
        return self.reader.updates(after, wait)

    def close(self) -> None:
        self.reader.close()


@pytest.fixture
def node_client(broker_server: BrokerServer, context: dict[str, str], tls_files: tuple[str, str]) -> Iterator[Nodes]:
    c = Nodes(context, tls_files[0], store=broker_server.store)
    yield c
    c.close()
