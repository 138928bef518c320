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
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator


class Params(BaseModel):
    """Parameters every policy has. Unknown keys are errors so a typo is not a silent default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stall_seconds: float = Field(600.0, gt=0)
    """An instance not joined to the batch system this long after launch is terminated and replaced."""
    gang_deadline_seconds: float | None = Field(None, gt=0)
    """A group launched together for multi-node jobs (a gang) not wholly joined this long (of
    healthy pipeline) after its launch is released whole and the jobs re-placed. Default:
    ``stall_seconds``. Shorter gives up sooner on a type or site that delivers part of a group
    (paid nodes idle around a job that cannot start); it cannot be longer than
    ``stall_seconds``, which replaces a member that never joins by itself first."""

    @field_validator("gang_deadline_seconds")
    @classmethod
    def _gang_deadline(cls, value: float | None, info: ValidationInfo) -> float | None:
        stall = info.data.get("stall_seconds")
        if value is not None and stall is not None and value > stall:
            raise ValueError(f"{value:g} is above stall_seconds ({stall:g}): a member that never joins is "
                             "replaced by itself at stall_seconds, so the group would never wait that long")
        return value

    @property
    def gang_deadline(self) -> float:
        """Seconds a gang may take to join whole (``gang_deadline_seconds``, else ``stall_seconds``)."""
        return self.gang_deadline_seconds or self.stall_seconds


@dataclass(frozen=True)
class Policy:
    name: str
    params: type[Params]
    decide: Callable[[DomainView, Params, float], Decision]
    source: str
    """Which system or paper the policy comes from."""
