"""Agent configuration: where the context is, how to reach it, where scripts and state live.

The context's URI, key and secret come from cloud-init userdata (what the provisioner
writes) or from a file an administrator drops on the node. Userdata can be:

* ``#cloud-config`` YAML with an ``epu_context:`` mapping,
* a JSON object, either with an ``epu_context`` key or the mapping itself,
* anything else (a shell script, a MIME part, the ``/etc/epu/context.env`` that
  deploy/cloud-init/epu-worker.yaml writes) holding ``EPU_CTX_URI=...``, ``EPU_CTX_KEY=...``,
  ``EPU_CTX_SECRET=...`` lines (optionally ``EPU_CTX_CA_PEM_B64``, ``EPU_CTX_INSTANCE_ID``,
  ``EPU_CTX_DATA``), or the same with ``EPU_CONTEXT_`` (and ``EPU_INSTANCE_ID``).

A config file (JSON or TOML) holds the same keys plus local settings; keys given on the
command line win, then the file, then userdata.
"""

from __future__ import annotations

import base64
import json
import re
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_USERDATA = "/var/lib/cloud/instance/user-data.txt"
_LINE_KEYS = {"EPU_CTX_URI": "uri", "EPU_CTX_KEY": "key", "EPU_CTX_SECRET": "secret",
              "EPU_CTX_CA_PEM_B64": "ca_pem_b64", "EPU_CTX_INSTANCE_ID": "instance_id",
              "EPU_CTX_DATA": "data",
              # the names deploy/cloud-init/epu-worker.yaml writes to /etc/epu/context.env
              "EPU_CONTEXT_URI": "uri", "EPU_CONTEXT_KEY": "key", "EPU_CONTEXT_SECRET": "secret",
              "EPU_CONTEXT_CA_PEM_B64": "ca_pem_b64", "EPU_INSTANCE_ID": "instance_id"}


class AgentConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    uri: str = Field(pattern=r"^https://")
    key: str = Field(min_length=1)
    secret: str = Field(min_length=1, repr=False)
    ca_file: str | None = None
    """PEM file of the CA (or the self-signed broker certificate) to verify the broker with."""
    ca_pem_b64: str | None = Field(None, repr=False)
    """The same, inline (base64 of the PEM), as userdata carries it; written to state_dir/ca.pem."""
    insecure: bool = False
    scripts_dir: str = "/etc/epu/ctx-scripts"
    state_dir: str = "/var/lib/epu-ctx"
    root: str = "/"
    """Prefix the default scripts write under (etc/hosts, etc/ssh/ssh_known_hosts, ...)."""
    change_log: str | None = None
    """File the agent appends one line per applied join/leave to (default ROOT/var/log/epu-ctx.log;
    "" for none)."""
    long_poll: bool = True
    wait: float = Field(30.0, gt=0, le=60)
    """Long-poll wait per request, seconds."""
    poll_interval: float = Field(120.0, gt=0)
    """Period of plain polling when ``long_poll`` is false (the paper's 120 s)."""
    script_timeout: float = Field(120.0, gt=0)
    backoff_initial: float = Field(0.5, gt=0)
    backoff_max: float = Field(30.0, gt=0)
    hostname: str | None = None
    fqdn: str | None = None
    ip: str | None = None
    ssh_host_key: str | None = None
    ssh_host_key_file: str = "/etc/ssh/ssh_host_ed25519_key.pub"
    data: str = ""
    instance_id: str | None = None

    def change_log_path(self) -> str:
        if self.change_log is not None:
            return self.change_log
        return str(Path(self.root) / "var" / "log" / "epu-ctx.log")

    def ca_path(self) -> str | None:
        if self.ca_file:
            return self.ca_file
        if self.ca_pem_b64:
            p = Path(self.state_dir) / "ca.pem"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(base64.b64decode(self.ca_pem_b64))
            return str(p)
        return None


def parse_userdata(text: str) -> dict[str, Any]:
    """The context settings found in a userdata document (empty if none)."""
    stripped = text.lstrip()
    if stripped.startswith("#cloud-config"):
        import yaml

        try:
            doc = yaml.safe_load(stripped)
        except yaml.YAMLError:
            doc = None
        if isinstance(doc, dict) and isinstance(doc.get("epu_context"), dict):
            return dict(doc["epu_context"])
    if stripped.startswith("{"):
        try:
            doc = json.loads(stripped)
        except ValueError:
            doc = None
        if isinstance(doc, dict):
            inner = doc.get("epu_context", doc)
            if isinstance(inner, dict):
                return dict(inner)
    found: dict[str, Any] = {}
    for m in re.finditer(r"^\s*(?:export\s+)?(EPU_[A-Z0-9_]+)=(.*)$", text, re.MULTILINE):
        name, value = m.group(1), m.group(2).strip().strip("'\"")
        if name in _LINE_KEYS:
            found[_LINE_KEYS[name]] = value
    return found


def load_file(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    text = p.read_text()
    if p.suffix == ".toml":
        return tomllib.loads(text)
    if p.suffix == ".json" or text.lstrip().startswith("{"):
        return json.loads(text)
    return parse_userdata(text)


def load_agent_config(config_file: str | None = None, userdata_file: str | None = None,
                      overrides: dict[str, Any] | None = None, env_file: str | None = None) -> AgentConfig:
    data: dict[str, Any] = {}
    ud = Path(userdata_file or DEFAULT_USERDATA)
    if userdata_file or (ud.exists() and not env_file):
        data.update(parse_userdata(ud.read_text()))
    if env_file:
        data.update(parse_userdata(Path(env_file).read_text()))
    if config_file:
        data.update(load_file(config_file))
    data.update({k: v for k, v in (overrides or {}).items() if v is not None})
    return AgentConfig.model_validate(data)
