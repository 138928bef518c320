"""Schemathesis fuzzes the live HTTPS broker from its committed OpenAPI spec: never a 5xx.

Half of the generated cases get valid credentials and the id of a real context, so the
fuzzer reaches validation and storage, not only the 401/404 gates. Long-poll waits are
clamped to 0.1 s to keep the run short (the value is still sent and validated).
"""

from __future__ import annotations

import base64
import json
import zlib
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from epu.services.ctxbroker.client import AdminClient
from epu.services.ctxbroker.server import BrokerServer
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from tests.ctxbroker.conftest import ADMIN_TOKEN, node, node_credential

SPEC = json.loads((Path(__file__).resolve().parents[2] / "docs" / "ctxbroker-openapi.json").read_text())
schema = schemathesis.openapi.from_dict(SPEC)
# valid and invalid inputs alike (malformed bodies, wrong types, out-of-range queries)
schema.config.generation.update(modes=[schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE])


@pytest.fixture
def target(broker_server: BrokerServer, admin: AdminClient, tls_files: tuple[str, str]) -> dict[str, Any]:
    ctx = admin.create("fuzz")
    from epu.services.ctxbroker.client import NodeClient

    cred = node_credential(ctx, "wn-1")
    nc = NodeClient(ctx["uri"], cred.key, cred.secret, ca_file=tls_files[0])
    nc.join(node(1))
    nc.close()
    basic = base64.b64encode(f"{cred.key}:{cred.secret}".encode()).decode()
    return {"url": broker_server.public_url, "ctx": ctx, "ca": tls_files[0], "server": broker_server,
            "admin": {"Authorization": f"Bearer {ADMIN_TOKEN}"}, "node": {"Authorization": f"Basic {basic}"}}


@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_errors(case: schemathesis.Case, target: dict[str, Any]) -> None:
    # deterministic per case: half get real credentials and the real context id
    salt = zlib.crc32(repr((case.path_parameters, case.query, case.body)).encode())
    if salt % 2 == 0:
        tags = case.operation.definition.raw.get("tags", [])
        headers = target["admin"] if "admin" in tags else target["node"]
        case.headers = {**(case.headers or {}), **headers}
        if case.path_parameters and "context_id" in case.path_parameters:
            case.path_parameters["context_id"] = target["ctx"]["id"]
    if case.query and isinstance(case.query.get("wait"), int | float) and case.query["wait"] > 0.1:
        case.query["wait"] = 0.1
    if case.method.upper() == "DELETE" and case.path == "/v1/contexts/{context_id}" and salt % 2 == 0:
        return  # deleting the fuzz context would only make later cases 404s
    case.call_and_validate(base_url=target["url"], verify=target["ca"], timeout=10, checks=[not_a_server_error])
    assert target["server"].hub.closing is False
