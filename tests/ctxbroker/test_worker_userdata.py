"""Production userdata carries the context (issue 14): the provisioner renders, for every launch,
the context URI, this node's own credential (derived from the context secret for its host name
and instance id), the broker's certificate and the head node, from ``[workers.DOMAIN]``.

Before, nothing filled them: only the end-to-end test worked around it by handing every worker
the context's shared key and secret."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from epu.common.config import parse_config
from epu.common.messages import InstanceEvent, LaunchRequest
from epu.services.ctxbroker.agent.config import load_agent_config
from epu.services.ctxbroker.agent.node import node_fields
from epu.services.ctxbroker.app import note_address
from epu.services.ctxbroker.client import AdminClient, BrokerError, NodeClient
from epu.services.ctxbroker.server import BrokerServer
from epu.services.provisioner.app import build_provisioner
from epu.services.provisioner.sim import SimulatedNodeDriver
from epu.services.provisioner.userdata import UserdataError

from tests.ctxbroker.conftest import node, ssh_key


class CapturingDriver(SimulatedNodeDriver):
    """The simulated cloud, keeping each node's userdata (what the metadata service would serve)."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(path=kw.pop("path"), boot_time_min=0, boot_time_max=0)
        self.userdata: dict[str, str] = {}

    def create_node(self, name: str, *args: Any, ex_userdata: str | None = None, **kw: Any) -> Any:
        self.userdata[name] = ex_userdata or ""
        return super().create_node(name, *args, ex_userdata=ex_userdata, **kw)


def _config(tmp_path: Path, workers: dict[str, Any]) -> Any:
    return parse_config({
        "provisioner": {"store_url": f"sqlite:///{tmp_path / 'prov.db'}"},
        "sensor": {"domain": "alpha", "backend": "slurm"},
        "domains": {"alpha": {"sites": ["sim"]}},
        "sites": {"sim": {"driver": "epu-sim", "image": "img", "size": "s"}},
        "workers": {"alpha": workers},
    }, environ={})


def _context_env(userdata: str, tmp_path: Path) -> Path:
    """What cloud-init writes to /etc/epu/context.env from this userdata."""
    doc = yaml.safe_load(userdata)
    [env] = [f for f in doc["write_files"] if f["path"] == "/etc/epu/context.env"]
    assert env["permissions"] == "0600"
    path = tmp_path / "context.env"
    path.write_text(env["content"])
    return path


def test_every_launch_renders_the_context_with_its_own_credential(
        broker_server: BrokerServer, admin: AdminClient, tls_files: tuple[str, str], tmp_path: Path) -> None:
    ctx = admin.create("alpha")
    secret_file = tmp_path / "alpha.secret"
    secret_file.write_text(ctx["secret"] + "\n")
    config = _config(tmp_path, {"head_node": "head.cluster.test", "context_uri": ctx["uri"],
                                "context_secret_file": str(secret_file), "context_ca_file": tls_files[0]})
    driver = CapturingDriver(path=str(tmp_path / "sim.db"))
    events: list[InstanceEvent] = []
    prov = build_provisioner(config, events.append, drivers={"sim": driver})
    try:
        for i in (1, 2):
            prov.handle_launch(LaunchRequest(launch_id=f"L{i}", domain="alpha", site="sim", node_name=f"wn-{i}"))
        assert prov.wait_idle()
    finally:
        prov.shutdown(wait=True)
        prov.store.close()
    assert len(driver.userdata) == 2
    # the broker learns each instance's address from the provisioner's events (as its consumer does)
    for e in events:
        note_address(broker_server.store, e)
    address = {e.instance_id: e.ip for e in events if e.ip}
    assert set(address) == {"L1", "L2"}, events
    joined = []
    for i in (1, 2):
        [userdata] = [u for name, u in driver.userdata.items() if f"wn-{i}" in u]
        assert ctx["secret"] not in userdata  # the context secret never leaves the provisioner
        env_file = _context_env(userdata, tmp_path)
        text = env_file.read_text()
        assert 'EPU_HEAD_NODE="head.cluster.test"' in text and 'EPU_BATCH_SYSTEM="slurm"' in text
        # the node's agent reads it as is: its own credential, the CA to verify the broker with
        cfg = load_agent_config(None, None, {"ssh_host_key": ssh_key(i), "ip": address[f"L{i}"],
                                             "state_dir": str(tmp_path / f"state-{i}")}, env_file=str(env_file))
        assert cfg.key == f"node/wn-{i}/L{i}" and cfg.ca_file is None and cfg.ca_pem_b64
        fields = node_fields(cfg)
        assert (fields.hostname, fields.instance_id) == (f"wn-{i}", f"L{i}")
        client = NodeClient(cfg.uri, cfg.key, cfg.secret, ca_file=cfg.ca_path())
        # its names and address are its own, or it is refused (403, saying why)
        for forged in ({"fqdn": "head"}, {"fqdn": "head.cluster.test"}, {"ip": "10.9.9.9"},
                       {"ip": address[f"L{3 - i}"]}):
            with pytest.raises(BrokerError) as refused:
                client.join({**fields.model_dump(), **forged})
            assert refused.value.status == 403, forged
        joined.append(client.join(fields.model_dump())["changed"])
        # ... and nothing more: not another worker, not the head node
        with pytest.raises(BrokerError) as refused:
            client.join(node(0, hostname="head", fqdn="head.cluster.test"))
        assert refused.value.status == 403
        client.close()
    assert joined == [True, True]
    assert {n["hostname"]: n["instance_id"] for n in admin.nodes(ctx["id"])} == {"wn-1": "L1", "wn-2": "L2"}


def test_a_missing_secret_file_is_named(tmp_path: Path) -> None:
    config = _config(tmp_path, {"context_uri": "https://ctx.example.org:8443/v1/contexts/abc",
                                "context_secret_file": str(tmp_path / "nope.secret")})
    with pytest.raises(UserdataError, match=r"workers\.alpha\.context_secret_file: cannot read .*nope\.secret"):
        build_provisioner(config, lambda e: None, drivers={"sim": CapturingDriver(path=str(tmp_path / "s.db"))})


def test_context_uri_and_secret_file_go_together(tmp_path: Path) -> None:
    from epu.common.config import ConfigError

    with pytest.raises(ConfigError, match="workers.alpha: Value error, context_uri and context_secret_file go together"):
        _config(tmp_path, {"context_uri": "https://ctx.example.org:8443/v1/contexts/abc"})
