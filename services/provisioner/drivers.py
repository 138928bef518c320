"""Build a libcloud driver for a configured site.

Any libcloud compute provider is reachable by its name (``ec2``, ``openstack``, ``gce``,
``azure_arm``...) plus ``driver_args``; three names are ours: ``epu-sim`` (the simulated
cloud), ``epu-process`` (local worker processes) and ``ec2`` (libcloud's EC2 driver with
the XML-namespace fix in ``services.provisioner.ec2``).

Credentials never sit in the main config: they come from ``credentials_file`` (a TOML or
JSON table with ``key``, ``secret`` and any other driver argument) and from the
environment (``EPU_SITE_<NAME>_KEY``, ``EPU_SITE_<NAME>_SECRET``; the name upper-cased,
``-`` as ``_``), which wins. Nothing here logs the arguments.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from libcloud.compute.base import NodeDriver

from common.clock import Clock
from common.config.provisioner import SiteConfig


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


def make_driver(site: str, cfg: SiteConfig, *, clock: Clock | None = None,
                environ: Mapping[str, str] | None = None) -> NodeDriver:
    args: dict[str, Any] = dict(cfg.driver_args)
    args.update(read_credentials(site, cfg, environ))
    name = cfg.driver
    if name == "epu-sim":
        from services.provisioner.sim import SimulatedNodeDriver

        return SimulatedNodeDriver(**args, clock=clock)
    if name == "epu-process":
        from services.provisioner.process_site import ProcessNodeDriver

        return ProcessNodeDriver(**args)
    if name in ("ec2", "epu-ec2"):
        from services.provisioner.ec2 import EpuEC2NodeDriver

        cls: Any = EpuEC2NodeDriver
    else:
        from libcloud.compute.providers import get_driver

        try:
            cls = get_driver(name)
        except AttributeError:
            raise SiteConfigError(f"site {site}: unknown libcloud provider {name!r}") from None
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
