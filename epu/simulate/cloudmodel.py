"""The cloud model of a simulation: per site, how instances boot, fail, answer and cost.

Read from a TOML file (``epu simulate --cloud FILE``), one table per site of the config::

    [sites.ec2]
    boot = { dist = "lognormal", median = 95, sigma = 0.35 }   # seconds to boot
    boot_failure_rate = 0.0      # share of instances that end in ERROR
    never_boot_rate = 0.043      # share that stay pending forever (the paper's Fig. 6: 22/512)
    api_latency = { dist = "constant", seconds = 0.4 }
    api_error_rate = 0.01        # share of API calls failing with a transient 503
    capacity = [[0, 1000], [7200, 200]]   # from second T on, at most N live instances
    price_per_hour = 0.085       # default: the site config's price_per_hour
    billing = "second"           # second, minute or hour: the granularity a started period is paid in
    billing_minimum_seconds = 60 # shortest billed life (EC2 per-second billing: 60 s)

Boot-time distributions (``dist``): ``constant`` (``seconds``), ``uniform`` (``min``,
``max``), ``normal`` (``mean``, ``std``, cut at ``min``, default 1 s), ``lognormal``
(``median``, ``sigma``: the log's standard deviation), ``empirical`` (``file``: one boot time
in seconds per line, drawn at random; or ``values`` inline). Every draw comes from the world's
seeded streams, so the same seed boots the same instances at the same times.

Sites the file does not name get the default model (uniform 60–180 s boots, no failure, per
second billing at the site's configured price).
"""

from __future__ import annotations

import math
import random
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from epu.workloads.model import WorkloadError


class ModelError(ValueError):
    """A cloud model that cannot be used; the message names the file and key."""


class Dist(BaseModel):
    """A distribution of seconds."""

    model_config = ConfigDict(extra="forbid")
    dist: Literal["constant", "uniform", "normal", "lognormal", "empirical"] = "uniform"
    seconds: float = Field(0.0, ge=0)
    min: float = Field(60.0, ge=0)
    max: float = Field(180.0, ge=0)
    mean: float = Field(0.0, ge=0)
    std: float = Field(0.0, ge=0)
    median: float = Field(0.0, ge=0)
    sigma: float = Field(0.0, ge=0)
    file: str | None = None
    values: list[float] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self) -> Dist:
        if self.dist == "uniform" and self.max < self.min:
            raise ValueError(f"uniform: max ({self.max}) < min ({self.min})")
        if self.dist == "lognormal" and self.median <= 0:
            raise ValueError("lognormal needs median > 0")
        if self.dist == "empirical" and not self.values and not self.file:
            raise ValueError("empirical needs file or values")
        return self

    def load(self, base: Path | None = None) -> Dist:
        """Read an empirical file (relative to the model file's folder)."""
        if self.dist != "empirical" or self.values or not self.file:
            return self
        p = Path(self.file)
        if not p.is_absolute() and base is not None:
            p = base / p
        try:
            text = p.read_text()
        except OSError as exc:
            raise ModelError(f"{p}: cannot read: {exc.strerror}") from None
        vals = []
        for i, line in enumerate(text.splitlines(), 1):
            line = line.split("#")[0].strip()
            if not line:
                continue
            try:
                v = float(line.split(",")[0])
            except ValueError:
                raise ModelError(f"{p}:{i}: not a number of seconds: {line!r}") from None
            if v < 0:
                raise ModelError(f"{p}:{i}: negative boot time {v}")
            vals.append(v)
        if not vals:
            raise ModelError(f"{p}: no boot times")
        return self.model_copy(update={"values": vals})

    def sampler(self) -> Callable[[random.Random], float]:
        d = self
        if d.dist == "constant":
            return lambda _r: d.seconds
        if d.dist == "uniform":
            return lambda r: d.min + r.random() * (d.max - d.min)
        if d.dist == "normal":
            floor = d.min if "min" in d.model_fields_set else 1.0
            return lambda r: max(floor, r.gauss(d.mean, d.std))
        if d.dist == "lognormal":
            mu = math.log(d.median)
            return lambda r: r.lognormvariate(mu, d.sigma)
        vals = list(d.values)
        return lambda r: vals[int(r.random() * len(vals))]

    def high_seconds(self) -> float:
        """A slow draw: the largest one for bounded distributions (constant, uniform, empirical),
        about the 98th percentile for the others (mean + 2 std; median × e^(2σ)). What a
        ``stall_seconds`` must outlast (``assumptions.stall_warning``)."""
        if self.dist == "constant":
            return self.seconds
        if self.dist == "uniform":
            return self.max
        if self.dist == "normal":
            return self.mean + 2 * self.std
        if self.dist == "lognormal":
            return self.median * math.exp(2 * self.sigma)
        return max(self.values) if self.values else 0.0

    def mean_seconds(self) -> float:
        if self.dist == "constant":
            return self.seconds
        if self.dist == "uniform":
            return (self.min + self.max) / 2
        if self.dist == "normal":
            return self.mean
        if self.dist == "lognormal":
            return self.median * math.exp(self.sigma ** 2 / 2)
        return sum(self.values) / len(self.values) if self.values else 0.0


class SiteModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    boot: Dist = Field(default_factory=Dist)
    boot_failure_rate: float = Field(0.0, ge=0, le=1)
    never_boot_rate: float = Field(0.0, ge=0, le=1)
    api_latency: Dist = Field(default_factory=lambda: Dist(dist="uniform", min=0.2, max=1.0))
    api_error_rate: float = Field(0.0, ge=0, lt=1)
    capacity: list[tuple[float, int]] = Field(default_factory=list)
    """(seconds from the start, most live instances from then on); empty: unlimited."""
    price_per_hour: float | None = Field(None, ge=0)
    billing: Literal["second", "minute", "hour"] = "second"
    billing_minimum_seconds: float = Field(0.0, ge=0)

    @property
    def period(self) -> float:
        return {"second": 1.0, "minute": 60.0, "hour": 3600.0}[self.billing]

    def billed_seconds(self, life: float) -> float:
        """Seconds paid for an instance that lived ``life`` seconds."""
        if life <= 0:
            return 0.0
        life = max(life, self.billing_minimum_seconds)
        p = self.period
        return math.ceil(life / p - 1e-9) * p

    def capacity_at(self, t: float) -> int | None:
        cap = None
        for since, n in sorted(self.capacity):
            if t >= since:
                cap = n
        return cap


class CloudModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sites: dict[str, SiteModel] = Field(default_factory=dict)
    default: SiteModel = Field(default_factory=SiteModel)
    """The model of sites the file does not name."""

    def site(self, name: str) -> SiteModel:
        return self.sites.get(name, self.default)


def load_cloud_model(path: str | Path | None, data: dict[str, Any] | None = None) -> CloudModel:
    """From a TOML file (or already-parsed ``data``); errors name the file and key."""
    source = str(path) if path else "<cloud model>"
    base = Path(path).parent if path else None
    if data is None:
        if path is None:
            return CloudModel()
        try:
            data = tomllib.loads(Path(path).read_text())
        except OSError as exc:
            raise ModelError(f"{path}: cannot read: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ModelError(f"{path}: not valid TOML: {exc}") from None
    try:
        model = CloudModel.model_validate(data)
    except ValidationError as exc:
        lines = []
        for e in exc.errors():
            key = ".".join(str(p) for p in e["loc"])
            msg = "unknown key" if e["type"] == "extra_forbidden" else e["msg"]
            lines.append(f"{source}: {key}: {msg}")
        raise ModelError("\n".join(lines)) from None
    for s in [*model.sites.values(), model.default]:
        s.boot = s.boot.load(base)
        s.api_latency = s.api_latency.load(base)
    return model


__all__ = ["CloudModel", "Dist", "ModelError", "SiteModel", "WorkloadError", "load_cloud_model"]
