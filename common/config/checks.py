"""Checks a schema cannot make: across keys, on the file system, or with a service's knowledge.

One list, run by ``epu config check`` (every check, or those of ``--service``) and by
``epu run SERVICE`` before anything starts (that service's checks), so a config the check calls
OK is one the services accept. Each check says which services it concerns: a batch head node
running only the sensor does not hold the context broker's certificate.

A service's own knowledge (the decision engine's policy names and parameters) is registered
from above (``register_check``, called by the composition layer ``epu.checks``), because
``common`` imports no service.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from epu.common.config import EpuConfig

#: A check: config → (dotted key, what is wrong and what to do) for each problem.
Check = Callable[["EpuConfig"], Iterable[tuple[str, str]]]

SERVICES = frozenset({"sensor", "decision", "provisioner", "ctxbroker"})
_REGISTRY: list[tuple[frozenset[str], Check]] = []


def register_check(services: Iterable[str], check: Check) -> Check:
    """Run ``check`` whenever one of ``services`` is checked (idempotent per function)."""
    wanted = frozenset(services)
    unknown = wanted - SERVICES
    if unknown:
        raise ValueError(f"unknown service(s) {sorted(unknown)}")
    if all(fn is not check for _, fn in _REGISTRY):
        _REGISTRY.append((wanted, check))
    return check


def check_config(config: EpuConfig, services: Iterable[str] | None = None) -> list[str]:
    """Every problem of ``config`` for ``services`` (all when None), as ``key: message`` lines."""
    wanted = SERVICES if services is None else frozenset(services)
    out: list[str] = []
    for concerns, check in _REGISTRY:
        if concerns & wanted:
            out += [f"{key}: {msg}" for key, msg in check(config)]
    return out


# --------------------------------------------------------------------------- the common checks
def _readable(path: str, what: str) -> str | None:
    p = Path(path)
    if not p.exists():
        return f"{what} {path} does not exist"
    if not p.is_file():
        return f"{what} {path} is not a file"
    if not os.access(p, os.R_OK):
        return f"{what} {path} is not readable by this user (uid {os.getuid()})"
    return None


def domain_sites(config: EpuConfig) -> Iterable[tuple[str, str]]:
    defined = list(config.sites)
    for name, d in config.domains.items():
        for site in d.sites:
            if site not in config.sites:
                yield (f"domains.{name}.sites",
                       f"names site {site!r}, which has no [sites.{site}] (defined: {', '.join(defined) or 'none'})")


def workers_domains(config: EpuConfig) -> Iterable[tuple[str, str]]:
    for name in config.workers:
        if name not in config.domains:
            yield f"workers.{name}", f"there is no [domains.{name}] for these workers"


def provisioner_files(config: EpuConfig) -> Iterable[tuple[str, str]]:
    for name, s in config.sites.items():
        if s.credentials_file:
            problem = _readable(os.path.expanduser(s.credentials_file), "credentials file")
            if problem:
                yield f"sites.{name}.credentials_file", problem
    for name, w in config.workers.items():
        for key in ("context_secret_file", "context_ca_file"):
            path = getattr(w, key)
            if path:
                problem = _readable(path, "file")
                if problem:
                    hint = " (write it with `epu ctx create NAME --secret-file FILE`)" if "secret" in key else ""
                    yield f"workers.{name}.{key}", problem + hint


def ctxbroker_files(config: EpuConfig) -> Iterable[tuple[str, str]]:
    c = config.ctxbroker
    if bool(c.cert_file) != bool(c.key_file):
        yield "ctxbroker.cert_file", "cert_file and key_file go together (or neither: a self-signed certificate)"
    for key in ("cert_file", "key_file"):
        path = getattr(c, key)
        if path:
            problem = _readable(path, "certificate" if key == "cert_file" else "private key")
            if problem:
                yield f"ctxbroker.{key}", problem
    if c.admin_token_file:
        p = Path(c.admin_token_file)
        if p.exists():
            problem = _readable(str(p), "admin token file")
            if problem:
                yield "ctxbroker.admin_token_file", problem
        elif not _writable_dir(p.parent):
            yield ("ctxbroker.admin_token_file",
                   f"{p} does not exist and {p.parent} is not writable to create it (create the token there, "
                   "or point admin_token_file at the service's state directory)")


def written_paths(config: EpuConfig, service: str) -> list[tuple[str, str]]:
    """(key, path) of every file or directory ``service`` writes with this config; relative
    paths are relative to its working directory (``/var/lib/epu-SERVICE`` under the shipped
    systemd units, whose ``ProtectSystem=strict`` lets it write nowhere else). The systemd test
    checks the example config against the units with this list."""
    from epu.common.config.sensor import command_log_path

    out: list[tuple[str, str]] = []

    def sqlite(key: str, url: str) -> None:
        if url.startswith("sqlite") and "///" in url and ":memory:" not in url:
            path = url.split("///", 1)[1]
            out.append((key, path))
            out.append((key, f"{path}-wal"))  # WAL mode: journal files beside the database

    if service == "sensor":
        path = command_log_path(config.sensor)
        if path:
            out.append(("sensor.options.state_path", path))
    elif service in ("decision", "provisioner"):
        sqlite(f"{service}.store_url", getattr(config, service).store_url)
        if service == "provisioner":
            for name, s in config.sites.items():
                if s.driver in ("epu-sim", "epu-process") and s.driver_args.get("path"):
                    out.append((f"sites.{name}.driver_args.path", str(s.driver_args["path"])))
    elif service == "ctxbroker":
        c = config.ctxbroker
        sqlite("ctxbroker.store_url", c.store_url)
        token = c.admin_token_file or "epu-ctxbroker.admin-token"
        if not Path(token).exists():
            out.append(("ctxbroker.admin_token_file", token))  # created at first start
        if not c.cert_file:
            out.append(("ctxbroker.cert_file", str(Path(token).parent / "epu-ctxbroker-tls")))  # self-signed
    return out


def writable_paths(service: str) -> Check:
    def check(config: EpuConfig) -> Iterable[tuple[str, str]]:
        for key, path in written_paths(config, service):
            p = Path(path)
            if p.exists():
                if not os.access(p, os.W_OK):
                    yield key, f"{path} is not writable by this user (uid {os.getuid()})"
            elif not _writable_dir(p.parent):
                yield key, f"cannot create {path}: {_first_existing(p.parent)} is not writable by this user"

    check.__name__ = f"writable_paths_{service}"
    return check


def _first_existing(p: Path) -> Path:
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _writable_dir(p: Path) -> bool:
    p = _first_existing(p)
    return p.is_dir() and os.access(p, os.W_OK | os.X_OK)


register_check({"decision"}, domain_sites)
register_check({"provisioner"}, workers_domains)
register_check({"provisioner"}, provisioner_files)
register_check({"ctxbroker"}, ctxbroker_files)
for _service in sorted(SERVICES):
    register_check({_service}, writable_paths(_service))
