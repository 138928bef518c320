"""Build a libcloud driver for a configured site.

Any libcloud compute provider is reachable by its name (``ec2``, ``openstack``, ``gce``,
``azure_arm``...) plus ``driver_args``; three names are ours: ``epu-sim`` (the simulated
cloud), ``epu-process`` (local worker processes) and ``ec2`` (libcloud's EC2 driver with
the XML-namespace fix in ``services.provisioner.ec2``).

Credentials never sit in the main config: they come from ``credentials_file`` (a TOML or
JSON table with ``key``, ``secret`` and any other driver argument) and from the
environment (``EPU_SITE_<NAME>_KEY``, ``EPU_SITE_<NAME>_SECRET``; the name upper-cased,
``-`` as ``_``), which wins. Nothing here logs the arguments' values.

Unknown arguments are errors that name the key, as everywhere else in the config: libcloud's
base driver takes ``**kwargs`` and drops what it does not know, so a misspelt ``regoin`` would
silently launch in the default region. ``driver_arg_names`` says what a driver reads: the named
parameters of its constructors (every class of the provider, including the version classes a
provider like OpenStack dispatches to) and the keys they take out of ``**kwargs``.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from epu.common.clock import Clock
from epu.common.config.provisioner import SiteConfig
from libcloud.compute.base import NodeDriver


class SiteConfigError(ValueError):
    """A site that cannot be built; the message names the site and never a secret."""


def read_credentials(site: str, cfg: SiteConfig, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    env = os.environ if environ is None else environ
    creds: dict[str, Any] = {}
    if cfg.credentials_file:
        p = Path(cfg.credentials_file).expanduser()
        try:
            text = p.read_text()
        except OSError as exc:
            raise SiteConfigError(f"site {site}: cannot read credentials_file {p}: {exc.strerror}") from None
        try:
            creds = json.loads(text) if p.suffix == ".json" else tomllib.loads(text)
        except (ValueError, tomllib.TOMLDecodeError):
            raise SiteConfigError(f"site {site}: credentials_file {p} is not valid "
                                  f"{'JSON' if p.suffix == '.json' else 'TOML'}") from None
    prefix = "EPU_SITE_" + site.upper().replace("-", "_") + "_"
    for field in ("key", "secret"):
        if (value := env.get(prefix + field.upper())) is not None:
            creds[field] = value
    return creds


_KWARG_READ = re.compile(r"""kwargs(?:\.get|\.pop|\[)\(?\s*["']([A-Za-z_]\w*)["']""")
#: Set by EPU itself, never from ``driver_args``.
_OURS = frozenset({"clock"})


def driver_class(site: str, name: str) -> Any:
    """The driver class for a provider name (ours or libcloud's)."""
    if name == "epu-sim":
        from epu.services.provisioner.sim import SimulatedNodeDriver

        return SimulatedNodeDriver
    if name == "epu-process":
        from epu.services.provisioner.process_site import ProcessNodeDriver

        return ProcessNodeDriver
    if name in ("ec2", "epu-ec2"):
        from epu.services.provisioner.ec2 import EpuEC2NodeDriver

        return EpuEC2NodeDriver
    from libcloud.compute.providers import get_driver

    try:
        return get_driver(name)
    except AttributeError:
        raise SiteConfigError(f"site {site}: unknown libcloud provider {name!r}") from None


def driver_family(cls: type) -> set[type]:
    """The class, its descendants (a provider such as OpenStack constructs one of them, by API
    version) and their ancestors."""
    family, todo = set(), [cls]
    while todo:
        c = todo.pop()
        if c not in family:
            family.add(c)
            todo += c.__subclasses__()
    return {a for c in family for a in c.__mro__ if a is not object}


def keyword_names(fn: Any) -> tuple[set[str], bool]:
    """A function's keyword parameter names, and whether it takes ``**kwargs``."""
    fn = getattr(fn, "__func__", fn)
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return set(), False
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)} - {"self", "cls"}
    return names, any(p.kind == p.VAR_KEYWORD for p in params)


def driver_arg_names(cls: type) -> set[str]:
    """Keyword arguments a driver class's constructors read (see the module docstring)."""
    names: set[str] = set()
    for c in driver_family(cls):
        for fn in (c.__dict__.get("__init__"), c.__dict__.get("__new__")):
            if fn is None:
                continue
            names |= keyword_names(fn)[0]
            try:
                names |= set(_KWARG_READ.findall(inspect.getsource(getattr(fn, "__func__", fn))))
            except (OSError, TypeError):
                pass
    return names - _OURS


def check_driver_args(site: str, cfg: SiteConfig, cls: type, creds: Mapping[str, Any]) -> None:
    """Refuse an argument the driver would drop, naming it (never its value)."""
    known = driver_arg_names(cls)
    for where, keys in (("driver_args", cfg.driver_args), ("credentials_file", creds)):
        unknown = sorted(set(keys) - known)
        if unknown:
            raise SiteConfigError(
                f"site {site}: {where} key {unknown[0]!r} is not an argument of the {cfg.driver} driver "
                f"(it takes: {', '.join(sorted(known))})")


def make_driver(site: str, cfg: SiteConfig, *, clock: Clock | None = None,
                environ: Mapping[str, str] | None = None) -> NodeDriver:
    creds = read_credentials(site, cfg, environ)
    args: dict[str, Any] = dict(cfg.driver_args)
    args.update(creds)
    name = cfg.driver
    cls: Any = driver_class(site, name)
    check_driver_args(site, cfg, cls, creds)
    if name in ("epu-sim", "epu-process"):
        try:
            return cls(**args, clock=clock) if name == "epu-sim" else cls(**args)
        except (TypeError, ValueError) as exc:
            raise SiteConfigError(f"site {site}: driver_args: {exc}") from None
    key = args.pop("key", None)
    secret = args.pop("secret", None)
    try:
        return cls(key, secret, **args) if secret is not None else cls(key, **args)
    except Exception as exc:  # a driver's constructor raises anything; say which site, hide secrets
        text = str(exc)
        for value in (secret, key, *[v for k, v in args.items() if _secretish(k)]):
            if isinstance(value, str) and value:
                text = text.replace(value, "***")
        raise SiteConfigError(f"site {site}: cannot build {name} driver: {type(exc).__name__}: {text}") from None


def _secretish(name: str) -> bool:
    return any(w in name.lower() for w in ("secret", "password", "token", "key"))
