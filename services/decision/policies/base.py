"""The policy contract.

A policy is a pure function ``decide(view, params, now) -> Decision`` plus a pydantic schema
for its parameters (defaults included, unknown keys rejected). It sees only the
``DomainView`` — no broker, no store, no clock — so it runs unchanged in the service, in a
simulator on virtual time, and in a table-driven test.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from epu.services.decision.actions import Decision
from epu.services.decision.view import DomainView
from pydantic import BaseModel, ConfigDict, Field


class Params(BaseModel):
    """Parameters every policy has. Unknown keys are errors so a typo is not a silent default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stall_seconds: float = Field(600.0, gt=0)
    """An instance not joined to the batch system this long after launch is terminated and replaced."""


@dataclass(frozen=True)
class Policy:
    name: str
    params: type[Params]
    decide: Callable[[DomainView, Params, float], Decision]
    source: str
    """Which system or paper the policy comes from."""
