"""[decision] and [domains.NAME] — the decision engine and the domains it manages."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from common.config.base import Section, ServiceCommon


class DecisionConfig(ServiceCommon):
    iteration_seconds: float = Field(5.0, gt=0)
    store_url: str = "sqlite:///epu-decision.db"
    resend_seconds: float = Field(30.0, gt=0)
    """Re-send an action whose outcome has not been seen after this long."""


class DomainConfig(Section):
    """One batch cluster plus the cloud sites it may use."""

    policy: str = "queue-demand"
    params: dict[str, Any] = Field(default_factory=dict)
    min_nodes: int = Field(0, ge=0)
    max_nodes: int = Field(10, ge=0)
    sites: list[str] = Field(default_factory=list)
    placement: str = "rank"
    cores_per_node: int = Field(1, ge=1)
    paused: bool = False

    @model_validator(mode="after")
    def _bounds(self) -> DomainConfig:
        if self.min_nodes > self.max_nodes:
            raise ValueError(f"min_nodes ({self.min_nodes}) is greater than max_nodes ({self.max_nodes})")
        return self
