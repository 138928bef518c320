"""[ctxbroker] — the contextualization broker (REST over HTTPS)."""

from __future__ import annotations

from pydantic import Field

from common.config.base import ServiceCommon


class CtxBrokerConfig(ServiceCommon):
    host: str = "127.0.0.1"
    port: int = Field(8443, ge=0, le=65535)
    public_url: str | None = None
    """Base URL agents use (defaults to https://host:port)."""
    cert_file: str | None = None
    key_file: str | None = None
    admin_token_file: str | None = None
    store_url: str = "sqlite:///epu-ctxbroker.db"
