"""libcloud's real OpenStack driver, as a site builds it, against a local endpoint that records
what the driver sends.

OpenStack cannot run on this machine, so the one fake here is the Nova endpoint: it answers
``POST /servers`` and ``GET /servers/ID`` with the fields libcloud parses and records every
request body. Everything on our side of the HTTP connection is the real code path: config →
``make_driver`` → ``LibcloudSite.create_kwargs`` → ``OpenStack_2_NodeDriver.create_node``.
Was: the site's ``security_groups`` were dropped for OpenStack and networks could not be given.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from epu.common.config.provisioner import SiteConfig
from epu.services.provisioner.cloud import LaunchSpec, LibcloudSite
from epu.services.provisioner.drivers import SiteConfigError, make_driver

SERVER = {"id": "srv-1", "name": "w1", "status": "BUILD", "metadata": {}, "addresses": {}, "tenant_id": "t",
          "user_id": "u", "hostId": "h", "image": {"id": "img"}, "flavor": {"id": "m1"}, "key_name": None,
          "links": [{"rel": "self", "href": "http://127.0.0.1/v2.1/t/servers/srv-1"}], "progress": 0,
          "created": "2026-01-01T00:00:00Z", "updated": "2026-01-01T00:00:00Z", "accessIPv4": "",
          "accessIPv6": "", "config_drive": "", "OS-EXT-STS:task_state": None}


@pytest.fixture
def nova() -> Iterator[tuple[int, list[tuple[str, str, Any]]]]:
    seen: list[tuple[str, str, Any]] = []

    class Nova(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _reply(self, code: int, doc: dict[str, Any]) -> None:
            body = json.dumps(doc).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            doc = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            seen.append(("POST", self.path, doc))
            self._reply(202, {"server": {"id": "srv-1", "links": []}})

        def do_GET(self) -> None:  # noqa: N802
            seen.append(("GET", self.path, None))
            self._reply(200, {"server": SERVER})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Nova)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], seen
    server.shutdown()
    server.server_close()
    thread.join(5)


def openstack_site(port: int, **kw: Any) -> SiteConfig:
    base = f"http://127.0.0.1:{port}"
    return SiteConfig(driver="openstack", image="img", size="m1", **kw, driver_args={
        "ex_force_auth_url": base, "ex_force_auth_version": "3.x_password", "ex_tenant_name": "t",
        "ex_force_auth_token": "token", "ex_force_base_url": f"{base}/v2.1/t"})


def test_security_groups_networks_and_extras_reach_nova(nova) -> None:
    port, seen = nova
    cfg = openstack_site(port, security_groups=["workers", "ssh"],
                         create_args={"networks": ["net-1", "net-2"], "ex_availability_zone": "az1",
                                      "ex_config_drive": True})
    site = LibcloudSite("os", cfg, make_driver("os", cfg, environ={"EPU_SITE_OS_KEY": "u",
                                                                  "EPU_SITE_OS_SECRET": "p"}))
    site.bind("dep", "store-1")
    node = site.launch(LaunchSpec("l1", "w1", "alpha", userdata="#cloud-config"))
    assert node.cloud_id == "srv-1" and node.state == "pending"
    [(method, path, body)] = [s for s in seen if s[0] == "POST"]
    server = body["server"]
    assert path == "/v2.1/t/servers"
    assert server["security_groups"] == [{"name": "workers"}, {"name": "ssh"}]
    assert server["networks"] == [{"uuid": "net-1"}, {"uuid": "net-2"}]
    assert server["availability_zone"] == "az1" and server["config_drive"] == "True"  # libcloud sends it so
    assert server["metadata"]["epu-deployment"] == "dep" and server["metadata"]["epu-store"] == "store-1"
    assert server["metadata"]["epu-launch-id"] == "l1" and server["user_data"]


def test_unknown_openstack_extras_are_refused_by_name(nova) -> None:
    port, _ = nova
    cfg = openstack_site(port, create_args={"network": ["net-1"]})
    driver = make_driver("os", cfg, environ={"EPU_SITE_OS_KEY": "u", "EPU_SITE_OS_SECRET": "p"})
    with pytest.raises(SiteConfigError) as exc:
        LibcloudSite("os", cfg, driver)
    assert "create_args key 'network'" in str(exc.value) and "networks" in str(exc.value)
