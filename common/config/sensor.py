"""[sensor] — the batch head node's sensor."""

from __future__ import annotations

from typing import Any, Literal

from epu.common.config.base import ServiceCommon
from pydantic import Field


class SensorConfig(ServiceCommon):
    domain: str = Field("default", pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$")
    backend: Literal["simulated", "torque", "slurm", "htcondor"] = "simulated"
    poll_seconds: float = Field(60.0, gt=0)
    command_timeout_seconds: float = Field(60.0, gt=0)
    options: dict[str, Any] = Field(default_factory=dict)
    """Backend-specific settings (e.g. paths to binaries, partition, simulated cluster shape)."""


def command_log_path(sc: SensorConfig) -> str | None:
    """Where the sensor remembers executed command ids: ``[sensor.options] state_path``, else
    ``sensor-DOMAIN.sqlite3`` in the working directory (``/var/lib/epu-sensor`` under the shipped
    systemd unit); None to keep it in memory (``":memory:"``, or the simulated backend unless a
    path is given). The sensor and the config checks both ask here."""
    path = sc.options.get("state_path")
    if path == ":memory:" or (path is None and sc.backend == "simulated"):
        return None
    return str(path or f"sensor-{sc.domain}.sqlite3")
