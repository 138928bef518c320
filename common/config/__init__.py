"""One TOML file for the whole deployment, validated at load.

A section per service (``[broker]``, ``[logging]``, ``[sensor]``, ``[decision]``,
``[provisioner]``, ``[ctxbroker]``) and per domain/site (``[domains.NAME]``,
``[sites.NAME]``). Environment variables override the file: ``EPU_<SECTION>__<KEY>``
(double underscore between levels), e.g. ``EPU_BROKER__URL`` or
``EPU_DOMAINS__ALPHA__MAX_NODES=20``; values are read as TOML literals when they parse
(numbers, booleans, arrays) and as strings otherwise.

Errors name the file, the dotted key and what was expected, so ``epu config check`` points
straight at the line to fix.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, field_validator

from common.config.base import BrokerConfig, LoggingConfig, Section
from common.config.ctxbroker import CtxBrokerConfig
from common.config.decision import DecisionConfig, DomainConfig
from common.config.provisioner import ProvisionerConfig, SiteConfig
from common.config.sensor import SensorConfig
from common.messages import NAME_PATTERN

__all__ = [
    "BrokerConfig", "ConfigError", "CtxBrokerConfig", "DecisionConfig", "DomainConfig", "EpuConfig",
    "LoggingConfig", "ProvisionerConfig", "SensorConfig", "SiteConfig", "load_config", "parse_config",
]

ENV_PREFIX = "EPU_"


class ConfigError(ValueError):
    """A config problem, already phrased for an operator: ``FILE: KEY: what was expected``."""


class EpuConfig(Section):
    broker: BrokerConfig = Field(default_factory=BrokerConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    sensor: SensorConfig = Field(default_factory=SensorConfig)
    decision: DecisionConfig = Field(default_factory=DecisionConfig)
    provisioner: ProvisionerConfig = Field(default_factory=ProvisionerConfig)
    ctxbroker: CtxBrokerConfig = Field(default_factory=CtxBrokerConfig)
    domains: dict[str, DomainConfig] = Field(default_factory=dict)
    sites: dict[str, SiteConfig] = Field(default_factory=dict)

    @field_validator("domains", "sites")
    @classmethod
    def _names(cls, value: dict[str, Any]) -> dict[str, Any]:
        import re

        for name in value:
            if not re.match(NAME_PATTERN, name):
                raise ValueError(f"name {name!r} must match {NAME_PATTERN} (lowercase, digits, '-', '_')")
        return value

    def broker_obj(self) -> Any:
        from common.broker import Broker
        from common.topology import Topology

        b = self.broker
        return Broker(b.url, Topology(prefix=b.prefix, quorum=b.quorum), heartbeat=b.heartbeat, declare=b.declare)


def _literal(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_env(data: dict[str, Any], environ: dict[str, str] | os._Environ[str]) -> dict[str, Any]:
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            continue
        path = [p.lower() for p in name[len(ENV_PREFIX):].split("__")]
        node = data
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"environment {name}: {'.'.join(path[:-1])} is not a table")
            node = child
        node[path[-1]] = _literal(raw)
    return data


def _describe(err: dict[str, Any]) -> str:
    key = ".".join(str(p) for p in err["loc"])
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown key (check the spelling; see deploy/examples/epu.toml)"
    got = err.get("input")
    shown = "" if err["type"] in ("extra_forbidden", "missing") or isinstance(got, dict) else f" (got {got!r})"
    return f"{key}: {msg}{shown}"


def parse_config(data: dict[str, Any], source: str = "<config>",
                 environ: dict[str, str] | os._Environ[str] | None = None) -> EpuConfig:
    data = apply_env(dict(data), os.environ if environ is None else environ)
    try:
        return EpuConfig.model_validate(data)
    except ValidationError as exc:
        lines = [f"{source}: {_describe(e)}" for e in exc.errors()]
        raise ConfigError("\n".join(lines)) from None


def load_config(path: str | Path | None, environ: dict[str, str] | os._Environ[str] | None = None) -> EpuConfig:
    """Load and validate ``path`` (or defaults plus environment when ``None``)."""
    if path is None:
        return parse_config({}, "<defaults>", environ)
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read: {exc.strerror}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML: {exc}") from None
    return parse_config(data, str(p), environ)
