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
    """PEM certificate (chain) served over HTTPS. Unset: a self-signed one is generated next to
    the admin token at first start (fine for a test bed; give a real one in production)."""
    key_file: str | None = None
    admin_token_file: str | None = None
    """File holding the admin token (created with a random token, mode 0600, if missing).
    Unset: ``epu-ctxbroker.admin-token`` in the working directory."""
    store_url: str = "sqlite:///epu-ctxbroker.db"
    """``sqlite:///PATH`` (WAL) or ``postgresql://...`` (several replicas on one database)."""
    refresh_interval: float = Field(0.5, gt=0, le=60)
    """Seconds between re-checks of the store for entries appended by another replica (PostgreSQL
    replicas are also woken at once by LISTEN/NOTIFY; this is the safety net)."""
