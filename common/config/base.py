"""Config building blocks shared by every section."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Section(BaseModel):
    """A config table. Unknown keys are errors: a typo must not silently fall back to a default."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class BrokerConfig(Section):
    url: str = "memory://"
    """kombu URL: ``memory://`` for one process, ``amqp://user:pass@host:5672/vhost`` otherwise."""
    prefix: str = ""
    """Prefix for every exchange and queue name (tests isolate runs with it)."""
    quorum: bool = True
    """Use quorum queues (RabbitMQ ≥ 3.8). Ignored by ``memory://``."""
    heartbeat: int = Field(30, ge=0)
    declare: bool = True
    """Declare exchanges/queues at start; false when deploy/rabbitmq definitions are loaded and
    the service's user has no configure permission."""


class LoggingConfig(Section):
    level: str = Field("info", pattern=r"^(?i:debug|info|warning|error|critical)$")
    json_format: bool = Field(False, alias="json")


class ServiceCommon(Section):
    """Keys every service section has."""

    metrics_port: int | None = Field(None, ge=0, le=65535)
    """Port of /metrics and /healthz (0 = any free port; unset = disabled)."""
    metrics_host: str = "127.0.0.1"
