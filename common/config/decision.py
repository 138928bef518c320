"""[decision] and [domains.NAME] — the decision engine and the domains it manages."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from common.config.base import Section, ServiceCommon


class DecisionConfig(ServiceCommon):
    iteration_seconds: float = Field(5.0, gt=0)
    store_url: str = "sqlite:///epu-decision.db"
    resend_seconds: float = Field(30.0, gt=0)
    """Re-send an action whose outcome has not been seen after this long."""
    active_window_seconds: float = Field(180.0, gt=0)
    """The engine acts on a domain only while it holds a snapshot younger than this. Snapshots
    reach only the active consumer of the single-active-consumer input queue, so a standby
    engine never acts; it should exceed the sensor's poll period (default 60 s)."""
    backoff_initial_seconds: float = Field(300.0, ge=0)
    """First pause of a failing site (doubles per consecutive failure)."""
    backoff_max_seconds: float = Field(1800.0, ge=0)
    """Longest pause of a failing site."""


class DomainConfig(Section):
    """One batch cluster plus the cloud sites it may use."""

    policy: str = "queue-demand"
    params: dict[str, Any] = Field(default_factory=dict)
    min_nodes: int = Field(0, ge=0)
    max_nodes: int = Field(10, ge=0)
    sites: list[str] = Field(default_factory=list)
    """Sites in rank order (empty: every configured site, in file order)."""
    placement: Literal["rank", "cheapest", "spread"] = "rank"
    cores_per_node: int = Field(1, ge=1)
    paused: bool = False
    node_names: list[str] = Field(default_factory=list)
    """Names for new workers, first free one first: the batch system's pre-declared slots
    (e.g. Slurm ``NodeName=... State=CLOUD`` lines). Empty: ``<domain>-<launch id>``. A name
    is free again once its instance is terminated or failed; launches beyond the list wait."""

    @model_validator(mode="after")
    def _bounds(self) -> DomainConfig:
        if self.min_nodes > self.max_nodes:
            raise ValueError(f"min_nodes ({self.min_nodes}) is greater than max_nodes ({self.max_nodes})")
        return self
