"""[sensor] — the batch head node's sensor."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from common.config.base import ServiceCommon


class SensorConfig(ServiceCommon):
    domain: str = Field("default", pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$")
    backend: Literal["simulated", "torque", "slurm", "htcondor"] = "simulated"
    poll_seconds: float = Field(60.0, gt=0)
    command_timeout_seconds: float = Field(60.0, gt=0)
    options: dict[str, Any] = Field(default_factory=dict)
    """Backend-specific settings (e.g. paths to binaries, partition, simulated cluster shape)."""
