"""Fixtures for the context broker: a self-signed certificate, live HTTPS brokers, node fields."""

from __future__ import annotations

import base64
import os
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from services.ctxbroker.client import AdminClient, NodeClient
from services.ctxbroker.server import BrokerServer, ServerSettings
from services.ctxbroker.tls import self_signed

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


@pytest.fixture
def node_client(context: dict[str, str], tls_files: tuple[str, str]) -> Iterator[NodeClient]:
    c = NodeClient(context["uri"], context["key"], context["secret"], ca_file=tls_files[0])
    yield c
    c.close()
