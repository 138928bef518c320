"""[provisioner] and [sites.NAME] — the provisioner and the clouds it launches on."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from common.config.base import Section, ServiceCommon


class ProvisionerConfig(ServiceCommon):
    deployment: str = Field("epu", pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$")
    """Tag value marking instances of this deployment (orphan sweep looks for it)."""
    store_url: str = "sqlite:///epu-provisioner.db"
    poll_seconds: float = Field(15.0, gt=0)
    reconcile_seconds: float = Field(300.0, gt=0)
    orphan_grace_seconds: float = Field(600.0, ge=0)
    """An instance tagged with this deployment but unknown to the store is terminated after this."""
    outbox_seconds: float = Field(10.0, gt=0)
    """How often stored-but-unannounced transitions (a crashed publisher's) are published."""
    retry_attempts: int = Field(6, ge=1)
    """Attempts per cloud call for transient errors (timeouts, 5xx, throttling)."""
    retry_initial_seconds: float = Field(0.5, gt=0)
    retry_max_seconds: float = Field(20.0, gt=0)


class SiteConfig(Section):
    """A cloud: a libcloud provider by name plus its driver arguments, and what to launch there."""

    driver: str
    """libcloud provider name (``ec2``, ``openstack``, ``gce``, ...) or ``epu-sim`` / ``epu-process``."""
    driver_args: dict[str, Any] = Field(default_factory=dict)
    credentials_file: str | None = None
    image: str = ""
    size: str = ""
    location: str | None = None
    keypair: str | None = None
    security_groups: list[str] = Field(default_factory=list)
    tags: dict[str, str] = Field(default_factory=dict)
    quota: int = Field(20, ge=0)
    price_per_hour: float = Field(0.0, ge=0)
    cores: int = Field(1, ge=1)
    userdata_template: str | None = None
    """cloud-init template path (default deploy/cloud-init/epu-worker.yaml)."""
    userdata_max_bytes: int = Field(16384, ge=1)
    """The provider's userdata limit (EC2: 16 KB)."""
    rate_limit_per_second: float = Field(10.0, gt=0)
    max_in_flight: int = Field(8, ge=1)
