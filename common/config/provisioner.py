"""[provisioner] and [sites.NAME] — the provisioner and the clouds it launches on."""

from __future__ import annotations

from typing import Any

from epu.common.config.base import Section, ServiceCommon
from epu.common.config.catalogue import TYPE_NAME, InstanceTypeConfig
from pydantic import Field, model_validator


class ProvisionerConfig(ServiceCommon):
    deployment: str | None = Field(None, pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$")
    """This deployment's identity, the ``epu-deployment`` tag on its instances. Unset (the default):
    made at the store's first start and kept there, so provisioners sharing a store share it and
    no two stores share one by accident. Set it only to name it explicitly; every provisioner on
    that store must then set the same value (a mismatch with the store's refuses to start)."""
    store_url: str = "sqlite:///epu-provisioner.db"
    poll_seconds: float = Field(15.0, gt=0)
    reconcile_seconds: float = Field(300.0, gt=0)
    orphan_grace_seconds: float = Field(600.0, ge=0)
    """A node of this deployment and store whose launch id the store does not know is destroyed
    this long after the store first saw it (not after the cloud made it)."""
    vanish_misses: int = Field(3, ge=2)
    """Consecutive listings that must omit a record's node before it is presumed gone."""
    vanish_min_seconds: float = Field(60.0, ge=0)
    """... and the time those listings must span. A presumed-gone node is never destroyed."""
    max_destroys_per_reconcile: int = Field(5, ge=0)
    """Most nodes one reconciliation destroys. More orphans than this at once are all refused
    (a ``provisioner.alert``); other destroys beyond it wait for the next reconciliation."""
    outbox_seconds: float = Field(10.0, gt=0)
    """How often stored-but-unannounced transitions (a crashed publisher's) are published."""
    report_seconds: float = Field(60.0, gt=0)
    """How often the full state of each domain's instances is published (``instance.report``):
    anti-entropy, so an engine that lost an instance event repairs its table."""
    discover_seconds: float = Field(3600.0, gt=0)
    """How often sites that ``discover`` sizes list them again (libcloud ``list_sizes()``; also
    once at start). The types found reach the engine in ``instance.report``."""
    report_horizon_seconds: float = Field(3600.0, ge=0)
    """Ended (terminated/failed) instances are reported for this long after they ended."""
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
    """Security group names (EC2, OpenStack); a driver that takes none is an error."""
    create_args: dict[str, Any] = Field(default_factory=dict)
    """Provider extras passed to the driver's ``create_node``, by libcloud's argument names: e.g.
    EC2 ``ex_subnet`` (an id), ``ex_security_group_ids``, ``ex_iamprofile``, ``ex_spot``,
    ``ex_spot_max_price``, ``ex_assign_public_ip``; OpenStack ``networks`` (ids),
    ``ex_availability_zone``, ``ex_config_drive``. An argument the driver does not take, or one EPU
    sets itself, is an error naming the key (docs/provisioner.md, "Provider extras")."""
    tags: dict[str, str] = Field(default_factory=dict)
    quota: int = Field(20, ge=0)
    price_per_hour: float | None = Field(None, ge=0)
    """$/h of one instance of the site's single type. Unset: unpriced — a spend cap refuses such
    a site (``epu config check``) and ``epu cost`` warns instead of billing it as 0."""
    cores: int = Field(1, ge=1)
    budget_per_hour: float | None = Field(None, gt=0)
    """Spend cap of the site over every domain: the most its live instances may cost per hour
    together. A launch past it is held (``services/decision/budget.py``). None: no cap."""
    userdata_template: str | None = None
    """cloud-init template path (default deploy/cloud-init/epu-worker.yaml)."""
    userdata_max_bytes: int = Field(16384, ge=1)
    """The provider's userdata limit (EC2: 16 KB)."""
    rate_limit_per_second: float = Field(10.0, gt=0)
    max_in_flight: int = Field(8, ge=1)
    types: dict[str, InstanceTypeConfig] = Field(default_factory=dict)
    """The site's instance-type catalogue (common/config/catalogue.py). Empty: one type made of
    ``size``, ``cores`` and ``price_per_hour``."""
    discover: list[str] = Field(default_factory=list)
    """Offer the driver's sizes (``list_sizes()``) whose id matches one of these patterns
    (``c5.*``); a ``types`` entry with the same ``size`` overrides what the driver reports."""

    @model_validator(mode="after")
    def _catalogue(self) -> SiteConfig:
        import re

        for name, t in self.types.items():
            if not re.match(TYPE_NAME, name):
                raise ValueError(f"types.{name}: type name must match {TYPE_NAME}")
            if t.cores is None and not self.discover:
                raise ValueError(f"types.{name}.cores: required (the site discovers no sizes)")
        if self.types:
            legacy = sorted({"size", "cores", "price_per_hour"} & self.model_fields_set)
            if legacy:
                raise ValueError(f"{', '.join(legacy)}: set per type in [types] when the site has a types table")
        return self
