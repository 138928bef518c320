"""[ctxbroker] — the contextualization broker (REST over HTTPS); [workers.DOMAIN] — what a new
worker of a domain is told at boot (its context among it)."""

from __future__ import annotations

from epu.common.config.base import Section, ServiceCommon
from pydantic import Field, model_validator


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
    history_entries: int = Field(1000, ge=1, le=10_000_000)
    """Entries of each context's list kept for agents a few entries behind. A new agent, or one
    further behind, gets the current members as one snapshot instead of the whole history."""
    refresh_interval: float = Field(0.5, gt=0, le=60)
    """Seconds between re-checks of the store for entries appended by another replica (PostgreSQL
    replicas are also woken at once by LISTEN/NOTIFY; this is the safety net)."""


class WorkersConfig(Section):
    """[workers.DOMAIN]: rendered into every new worker's cloud-init userdata by the provisioner.

    The context: ``context_uri`` and ``context_secret_file`` come from ``epu ctx create DOMAIN
    --secret-file FILE``. The provisioner derives each instance's own node credential from the
    secret (bound to its host name and instance id); the secret itself never leaves this host.
    """

    head_node: str | None = Field(None, pattern=r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,252})$")
    """The batch head node's host name (the worker's batch daemon reports there)."""
    batch_system: str | None = Field(None, pattern=r"^(torque|slurm|htcondor|simulated)$")
    """Default: [sensor] backend when [sensor] domain is this domain."""
    context_uri: str | None = Field(None, pattern=r"^https://[^/\s]+/v1/contexts/[A-Za-z0-9_-]{1,64}/?$")
    """The context's URI (``https://HOST:PORT/v1/contexts/ID``), as ``epu ctx create`` prints it."""
    context_secret_file: str | None = None
    """File holding the context's secret (``epu ctx create --secret-file``), readable by the provisioner."""
    context_ca_file: str | None = None
    """PEM certificate (or CA) the workers' agents verify the broker with; embedded in the userdata.
    Unset: the system's CAs (the broker's certificate must then be publicly trusted)."""

    @model_validator(mode="after")
    def _context_pair(self) -> WorkersConfig:
        if (self.context_uri is None) != (self.context_secret_file is None):
            raise ValueError("context_uri and context_secret_file go together (both from `epu ctx create "
                             "DOMAIN --secret-file FILE`)")
        return self
