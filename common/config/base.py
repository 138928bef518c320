"""Config building blocks shared by every section."""

from __future__ import annotations

import os

from epu.common.broker import redact
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class Section(BaseModel):
    """A config table. Unknown keys are errors: a typo must not silently fall back to a default."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class TlsConfig(Section):
    """``[broker.tls]``: how ``amqps://`` connections check the broker (and present a client
    certificate). Verification is on by default: the broker's certificate must chain to
    ``ca_file`` (or the system's CAs) and name the host of the URL (or ``server_name``)."""

    verify: bool = True
    """Check the certificate chain and name. Turn off only in a lab: anyone can then impersonate the broker."""
    ca_file: str | None = None
    """PEM bundle of the CA(s) that signed the broker's certificate (default: the system's CAs)."""
    cert_file: str | None = None
    """Client certificate (PEM), for brokers that require one."""
    key_file: str | None = None
    """Private key of ``cert_file`` (PEM)."""
    server_name: str | None = None
    """Name the broker's certificate must carry, when it is not the URL's host (e.g. URLs by IP)."""

    @model_validator(mode="after")
    def _files(self) -> TlsConfig:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together (a client certificate needs its key)")
        for key in ("ca_file", "cert_file", "key_file"):
            path = getattr(self, key)
            if path is not None and not os.path.isfile(path):
                raise ValueError(f"{key}: no such file: {path}")
        return self


class BrokerConfig(Section):
    url: str | list[str] = "memory://"
    """kombu URL: ``memory://`` for one process, ``amqp://user:pass@host:5672/vhost`` (or
    ``amqps://`` for TLS) otherwise. A list of URLs — the nodes of a RabbitMQ cluster —
    makes every connection fail over to the next node when one is lost."""
    prefix: str = ""
    """Prefix for every exchange and queue name (tests isolate runs with it)."""
    quorum: bool = True
    """Use quorum queues (RabbitMQ ≥ 3.8). Ignored by ``memory://``."""
    heartbeat: int = Field(30, ge=0)
    """AMQP heartbeat in seconds (0: off). Services keep heartbeats flowing while handlers work."""
    declare: bool = True
    """Declare exchanges/queues at start; false when deploy/rabbitmq definitions are loaded and
    the service's user has no configure permission."""
    connect_timeout: float = Field(5.0, gt=0)
    """Seconds to wait for one broker URL to answer before trying the next."""
    confirm_timeout: float = Field(30.0, gt=0)
    """Seconds a publish waits for the broker's confirm before taking the connection for dead."""
    call_timeout: float = Field(30.0, ge=0)
    """Seconds a synchronous broker call (channel.open, queue.declare, basic.consume, basic.cancel)
    may go unanswered on an open connection before the connection is broken and replaced (0: wait
    for ever). A broker out of file handles keeps connections open but never answers."""
    max_message_bytes: int = Field(16 * 1024 * 1024, ge=1024)
    """Largest message a consumer takes, before and after decompression; larger is dead-lettered."""
    user_prefix: str = ""
    """Prefix of the service users' names, as deploy/rabbitmq's definitions were generated with
    (``epu-sensor-alpha`` with none): a message sent as one of them must be sent by the user
    allowed to send it (docs/messages.md, "Who may send what")."""
    require_sender_user: bool = False
    """True with deploy/rabbitmq's least-privilege users: refuse (dead-letter) every message whose
    broker-validated user is not the service user allowed to send it. False accepts messages from
    users that are none of EPU's (``guest`` in development)."""
    tls: TlsConfig = Field(default_factory=TlsConfig)

    @field_validator("url")
    @classmethod
    def _urls(cls, value: str | list[str]) -> str | list[str]:
        urls = [value] if isinstance(value, str) else value
        if not urls:
            raise ValueError("give at least one broker URL")
        for u in urls:
            scheme = u.split("://", 1)[0] if "://" in u else ""
            if scheme not in ("amqp", "amqps", "pyamqp", "memory"):
                raise ValueError(f"{redact(u)!r}: expected amqp://, amqps:// or memory://")
        if len(urls) > 1 and any(u.startswith("memory://") for u in urls):
            raise ValueError("memory:// is one process; it cannot be one of several URLs")
        return value


class LoggingConfig(Section):
    level: str = Field("info", pattern=r"^(?i:debug|info|warning|error|critical)$")
    json_format: bool = Field(False, alias="json")


class ServiceCommon(Section):
    """Keys every service section has."""

    metrics_port: int | None = Field(None, ge=0, le=65535)
    """Port of /metrics and /healthz (0 = any free port; unset = disabled)."""
    metrics_host: str = "127.0.0.1"
    """Address /metrics and /healthz listen on: the default answers this host only; ``0.0.0.0``
    (every interface) or one of the host's IPv4 addresses or names lets a Prometheus on another
    host scrape it (the endpoint has no authentication: let only Prometheus through)."""

    @field_validator("metrics_host")
    @classmethod
    def _metrics_host(cls, value: str) -> str:
        """Checked here, not when the service binds: a typo is one line from ``config check``,
        not a socket error at start. IPv4 only (the endpoint's server is IPv4)."""
        import ipaddress
        import re

        try:
            address = ipaddress.ip_address(value)
        except ValueError:
            address = None
        if address is not None and address.version == 6:
            raise ValueError(f"{value!r}: an IPv6 address; give an IPv4 address (0.0.0.0: every "
                             "interface) or a host name")
        if address is not None:
            return value
        label = r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)"
        if (re.fullmatch(r"[0-9.]+", value) or len(value) > 253
                or not re.fullmatch(rf"{label}(\.{label})*\.?", value)):
            raise ValueError(f"{value!r}: expected an IPv4 address (0.0.0.0: every interface) or a host name")
        return value
