"""One TOML file for the whole deployment, validated at load.

A section per service (``[broker]``, ``[logging]``, ``[sensor]``, ``[decision]``,
``[provisioner]``, ``[ctxbroker]``) and per domain/site (``[domains.NAME]``,
``[sites.NAME]``). Environment variables override the file: ``EPU_<SECTION>__<KEY>``
(double underscore between levels), e.g. ``EPU_BROKER__URL`` or
``EPU_DOMAINS__ALPHA__MAX_NODES=20``; values are read as TOML literals when they parse
(numbers, booleans, arrays) and as strings otherwise.

Errors name the file (or the environment variable that set the key), the dotted key and what
was expected, so ``epu config check`` points straight at the line to fix.

Two layers of validation, both run by ``epu config check`` and by ``epu run SERVICE`` at start:
the schema here (types, ranges, unknown keys), and ``checks`` (``check_config``): what needs
more than one key, the file system (certificates, credentials, secrets), or a service's own
knowledge (policy names and parameters, registered by the composition layer so that ``common``
imports no service).
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from epu.common.config.base import BrokerConfig, LoggingConfig, Section
from epu.common.config.ctxbroker import CtxBrokerConfig, WorkersConfig
from epu.common.config.decision import DecisionConfig, DomainConfig
from epu.common.config.provisioner import ProvisionerConfig, SiteConfig
from epu.common.config.sensor import SensorConfig
from epu.common.messages import NAME_PATTERN
from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

__all__ = [
    "BrokerConfig", "ConfigError", "CtxBrokerConfig", "DecisionConfig", "DomainConfig", "EpuConfig",
    "LoggingConfig", "ProvisionerConfig", "SensorConfig", "SiteConfig", "WorkersConfig", "check_config",
    "load_config", "parse_config", "register_check",
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
    workers: dict[str, WorkersConfig] = Field(default_factory=dict)
    """Per domain: what its new workers are told at boot (head node, context)."""

    @field_validator("domains", "sites", "workers")
    @classmethod
    def _names(cls, value: dict[str, Any]) -> dict[str, Any]:
        import re

        for name in value:
            if not re.match(NAME_PATTERN, name):
                raise ValueError(f"name {name!r} must match {NAME_PATTERN} (lowercase, digits, '-', '_')")
        return value

    @model_validator(mode="after")
    def _catalogues(self) -> EpuConfig:
        from epu.common.config.catalogue import domain_type_errors

        found = [e for name, d in self.domains.items() for e in domain_type_errors(name, d, self.sites)]
        if found:
            raise ValidationError.from_exception_data("EpuConfig", [
                InitErrorDetails(type=PydanticCustomError("catalogue", msg), loc=loc, input=value)
                for loc, msg, value in found])
        return self

    def broker_obj(self) -> Any:
        from epu.common.broker import Broker, MessageLimits, TlsSettings
        from epu.common.senders import SenderPolicy
        from epu.common.topology import Topology

        b = self.broker
        url = b.url if isinstance(b.url, str) else tuple(b.url)
        return Broker(url, Topology(prefix=b.prefix, quorum=b.quorum), heartbeat=b.heartbeat, declare=b.declare,
                      tls=TlsSettings(**b.tls.model_dump()), connect_timeout=b.connect_timeout,
                      confirm_timeout=b.confirm_timeout, call_timeout=b.call_timeout,
                      limits=MessageLimits(b.max_message_bytes, b.max_message_bytes),
                      senders=SenderPolicy(b.user_prefix, b.require_sender_user))


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


def env_keys(environ: dict[str, str] | os._Environ[str]) -> dict[tuple[str, ...], str]:
    """Dotted key path → the ``EPU_..__..`` variable that sets it."""
    return {tuple(p.lower() for p in name[len(ENV_PREFIX):].split("__")): name
            for name in environ if name.startswith(ENV_PREFIX) and "__" in name}


def _describe(err: dict[str, Any], source: str, from_env: dict[tuple[str, ...], str]) -> str:
    """One line for one schema error, blaming the environment variable when one set the key."""
    loc = tuple(str(p) for p in err["loc"])
    key = ".".join(loc)
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown key (check the spelling; see deploy/examples/epu.toml)"
    got = err.get("input")
    if err["loc"][:2] == ("broker", "url"):  # a URL may carry a password: never echo it
        from epu.common.broker import redact

        got = [redact(str(u)) for u in got] if isinstance(got, list) else redact(str(got))
    shown = "" if err["type"] in ("extra_forbidden", "missing") or isinstance(got, dict) else f" (got {got!r})"
    for n in range(len(loc), 0, -1):
        var = from_env.get(loc[:n])
        if var is not None:
            return f"environment variable {var}: {key}: {msg}{shown}"
    return f"{source}: {key}: {msg}{shown}"


def parse_config(data: dict[str, Any], source: str = "<config>",
                 environ: dict[str, str] | os._Environ[str] | None = None) -> EpuConfig:
    env = os.environ if environ is None else environ
    data = apply_env(dict(data), env)
    try:
        return EpuConfig.model_validate(data)
    except ValidationError as exc:
        from_env = env_keys(env)
        raise ConfigError("\n".join(_describe(e, source, from_env) for e in exc.errors())) from None


def load_config(path: str | Path | None, environ: dict[str, str] | os._Environ[str] | None = None) -> EpuConfig:
    """Load and validate ``path`` (or defaults plus environment when ``None``) against the schema.
    ``check_config`` adds the checks that need more (see the module docstring)."""
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


from epu.common.config.checks import check_config, register_check  # noqa: E402 (needs EpuConfig above)
