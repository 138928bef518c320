"""What this node tells the broker: configured values, else what the machine says."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from services.ctxbroker.agent.config import AgentConfig
from services.ctxbroker.core import NodeFields


def primary_ip() -> str:
    """The source address of the default route (no packet is sent: UDP connect only picks a route)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))
            return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"


def node_fields(cfg: AgentConfig) -> NodeFields:
    """Validated with the broker's own rules, so a bad local value fails here, not as a 422 loop."""
    fqdn = cfg.fqdn or socket.getfqdn()
    hostname = cfg.hostname or fqdn.split(".", 1)[0] or socket.gethostname().split(".", 1)[0]
    key = cfg.ssh_host_key
    if key is None:
        key = Path(cfg.ssh_host_key_file).read_text().strip()
    doc: dict[str, Any] = {"hostname": hostname, "fqdn": fqdn if "." in fqdn or fqdn else hostname,
                           "ip": cfg.ip or primary_ip(), "ssh_host_key": key, "data": cfg.data,
                           "instance_id": cfg.instance_id}
    return NodeFields.model_validate(doc)
