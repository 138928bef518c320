"""Render the cluster blocks the default context scripts maintain (standard library only).

Each file keeps everything outside our block untouched; the block is delimited by
``# BEGIN EPU CONTEXT`` / ``# END EPU CONTEXT`` lines and rewritten whole from the current
membership (``EPU_CTX_MEMBERS``, a JSON object hostname → node), so it is always exactly
the cluster as of the last applied entry, whatever happened before.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import tempfile
from pathlib import Path

BEGIN = "# BEGIN EPU CONTEXT"
END = "# END EPU CONTEXT"


def load_members(path: str) -> list[dict]:
    doc = json.loads(Path(path).read_text() or "{}")
    return [doc[h] for h in sorted(doc)]


def slots(node: dict) -> int:
    data = node.get("data") or ""
    try:
        doc = json.loads(data)
        if isinstance(doc, dict) and int(doc.get("slots", 0)) > 0:
            return int(doc["slots"])
    except (ValueError, TypeError):
        pass
    m = re.search(r"(?:^|[\s,;])slots=(\d+)", data)
    return int(m.group(1)) if m and int(m.group(1)) > 0 else 1


LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


def own_fqdn(node: dict) -> str | None:
    """The member's fqdn if it is a name of that host (its first label is the host name), else
    None. The broker refuses any other; this keeps a hostile or stale entry from naming
    another host here even so."""
    fqdn = str(node.get("fqdn") or "").lower().rstrip(".")
    if not fqdn or fqdn == node["hostname"] or fqdn.split(".", 1)[0] != node["hostname"]:
        return None
    return fqdn


def _loopback(ip: str) -> bool:
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return False


def own_ips(members: list[dict]) -> dict[str, str | None]:
    """hostname → the address to write for it: None for an address two members claim (which
    host it is cannot be told, so it names neither). Loopback names each host's own self, so
    the members of a single-machine test bed share it."""
    claims: dict[str, int] = {}
    for n in members:
        if n.get("ip"):
            claims[n["ip"]] = claims.get(n["ip"], 0) + 1
    out: dict[str, str | None] = {}
    for n in members:
        ip = n.get("ip") or None
        shared = ip is not None and _loopback(ip)
        out[n["hostname"]] = ip if ip is not None and (claims[ip] == 1 or shared) else None
    return out


def own_members(members: list[dict]) -> list[dict]:
    """The members whose host name is a valid label (anything else is skipped whole)."""
    return [n for n in members if isinstance(n.get("hostname"), str) and LABEL.match(n["hostname"])]


def hosts_lines(members: list[dict]) -> list[str]:
    """``IP FQDN HOSTNAME`` per member with an address of its own; only its own names."""
    members = own_members(members)
    ips = own_ips(members)
    out = []
    for n in members:
        ip, fqdn = ips[n["hostname"]], own_fqdn(n)
        if ip is not None:
            out.append(f"{ip}\t{fqdn} {n['hostname']}" if fqdn else f"{ip}\t{n['hostname']}")
    return out


def known_hosts_lines(members: list[dict]) -> list[str]:
    """``HOSTNAME,FQDN,IP KEY`` per member: its key trusted only for its own names and address
    (never for a loopback address: that is every host's own, whose key is not this member's)."""
    members = own_members(members)
    ips = own_ips(members)
    out = []
    for n in members:
        ip = ips[n["hostname"]]
        names = [n["hostname"]] + [x for x in (own_fqdn(n), ip if ip and not _loopback(ip) else None) if x]
        out.append(f"{','.join(names)} {n['ssh_host_key']}")
    return out


def hostfile_lines(members: list[dict]) -> list[str]:
    return [f"{n['hostname']} slots={slots(n)}" for n in members]


def replace_block(text: str, lines: list[str]) -> str:
    """``text`` with our block replaced by ``lines`` (appended if there is no block yet)."""
    block = "\n".join([BEGIN, *lines, END]) + "\n"
    pattern = re.compile(rf"^{re.escape(BEGIN)}\n.*?^{re.escape(END)}\n?", re.MULTILINE | re.DOTALL)
    if pattern.search(text):
        return pattern.sub(lambda _m: block, text, count=1)
    if text and not text.endswith("\n"):
        text += "\n"
    return text + block


def write_block(path: Path, lines: list[str], mode: int = 0o644) -> None:
    """Atomically rewrite our block of ``path`` (other content preserved)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    old = path.read_text() if path.exists() else ""
    new = replace_block(old, lines)
    if new == old:
        return
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(new)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def target(env_name: str, default_rel: str) -> Path:
    """Where to write: ``$env_name`` if set, else ``$EPU_CTX_ROOT/default_rel``."""
    if os.environ.get(env_name):
        return Path(os.environ[env_name])
    return Path(os.environ.get("EPU_CTX_ROOT", "/")) / default_rel


BLOCKS = {
    "known_hosts": ("EPU_KNOWN_HOSTS_FILE", "etc/ssh/ssh_known_hosts", known_hosts_lines),
    "hosts": ("EPU_HOSTS_FILE", "etc/hosts", hosts_lines),
    "hostfile": ("EPU_MPI_HOSTFILE", "etc/epu/mpi_hostfile", hostfile_lines),
}


def main(*kinds: str) -> int:
    """Render each block of ``kinds`` from one read of the membership (a block whose file
    variable is "-" is left alone)."""
    members = load_members(os.environ["EPU_CTX_MEMBERS"])
    for kind in kinds:
        if kind not in BLOCKS:
            raise SystemExit(f"unknown block {kind!r}")
        env_name, default_rel, lines = BLOCKS[kind]
        if os.environ.get(env_name) == "-":
            continue
        write_block(target(env_name, default_rel), lines(members))
    return 0
