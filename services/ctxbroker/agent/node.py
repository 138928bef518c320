"""What this node tells the broker: configured values, else what the machine says."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from epu.common.nodecred import parse_node_key
from epu.services.ctxbroker.agent.config import AgentConfig
from epu.services.ctxbroker.core import NodeFields


def primary_ip() -> str:
    """The source address of the default route (no packet is sent: UDP connect only picks a route)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))
            return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"


def node_fields(cfg: AgentConfig) -> NodeFields:
    """Validated with the broker's own rules, so a bad local value fails here, not as a 422 loop.

    With a node credential (key ``node/HOSTNAME/INSTANCE_ID``) the host name and instance id
    default to the ones it names; a configured host name that differs is an error here, since
    the broker would refuse every join."""
    ident = parse_node_key(cfg.key)
    fqdn = cfg.fqdn or socket.getfqdn()
    hostname = (cfg.hostname or (ident.hostname if ident else None) or fqdn.split(".", 1)[0]
                or socket.gethostname().split(".", 1)[0])
    instance_id = cfg.instance_id or (ident.instance_id if ident and ident.instance_id else None)
    if ident is not None:
        if hostname.lower() != ident.hostname:
            raise ValueError(f"hostname {hostname!r} differs from the credential's {ident.hostname!r} "
                             "(the credential joins only as that host)")
        if (instance_id or "") != ident.instance_id:
            raise ValueError(f"instance_id {instance_id!r} differs from the credential's {ident.instance_id!r}")
        if not cfg.fqdn and fqdn.split(".", 1)[0].lower() != ident.hostname:
            fqdn = ident.hostname  # the machine's own name is not the one it joins as
    key = cfg.ssh_host_key
    if key is None:
        key = Path(cfg.ssh_host_key_file).read_text().strip()
    doc: dict[str, Any] = {"hostname": hostname, "fqdn": fqdn if "." in fqdn or fqdn else hostname,
                           "ip": cfg.ip or primary_ip(), "ssh_host_key": key, "data": cfg.data,
                           "instance_id": instance_id}
    return NodeFields.model_validate(doc)
