"""Synthetic workloads of the seed papers' experiments, each with documented parameters.

Every generator is a pure function of its parameters and a seed (``random.Random(seed)``), so
the same spec gives the same jobs. Written on the command line as ``NAME:key=value,...``
(``burst:jobs=512,duration=1800``); unknown keys and bad values are errors naming the key.

* ``burst`` — the EPU paper's Fig. 5/6 workload (Marshall, Tufo, Keahey, ICSOFT 2012):
  ``jobs`` single-node jobs of ``cores`` cores running ``duration`` s, all submitted at ``at``
  (defaults: 512 × 1 core × 1800 s at 0).
* ``mpi`` — the EPU paper's Fig. 3 reactivity workload: one job of ``nodes`` nodes ×
  ``cores`` cores for ``duration`` s at ``at`` (the time until it runs is the reactivity).
* ``waves`` — EC3's case studies (Caballer et al., "EC3: Elastic Cloud Computing Cluster",
  JCSS 2015): ``waves`` bursts of ``jobs`` jobs, one every ``period`` s; a wave's jobs arrive
  uniformly within ``spread`` s and run uniform(``run_min``, ``run_max``) s on ``cores`` cores.
  The cluster sits idle between waves — where elasticity saves against a static cluster.
* ``pattern`` — AutoElastic's load patterns (Righi et al., IEEE TCC 2016): single-core jobs
  of ``duration`` s arriving as a Poisson process whose rate follows ``shape`` over ``hours``:
  ``constant`` (``high``), ``ascending`` (``low`` → ``high``, linear), ``descending``
  (``high`` → ``low``), ``wave`` (``low`` + (``high`` − ``low``)·(1 − cos 2πt/``period``)/2).
  Rates are jobs per hour; the expected number of jobs is the integral of the rate
  (``expected_jobs``), which the tests check the generator reproduces.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from epu.workloads.model import TraceJob, Workload, WorkloadError


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seed: int = 1


class BurstParams(_Params):
    jobs: int = Field(512, ge=1)
    cores: int = Field(1, ge=1)
    duration: float = Field(1800.0, ge=0)
    at: float = Field(0.0, ge=0)


class MpiParams(_Params):
    nodes: int = Field(16, ge=1)
    cores: int = Field(1, ge=1)
    duration: float = Field(600.0, ge=0)
    at: float = Field(0.0, ge=0)


class WavesParams(_Params):
    waves: int = Field(4, ge=1)
    jobs: int = Field(64, ge=1)
    period: float = Field(4 * 3600.0, gt=0)
    spread: float = Field(600.0, ge=0)
    run_min: float = Field(600.0, ge=0)
    run_max: float = Field(3600.0, ge=0)
    cores: int = Field(1, ge=1)


class PatternParams(_Params):
    shape: Literal["constant", "ascending", "descending", "wave"] = "wave"
    hours: float = Field(12.0, gt=0)
    low: float = Field(20.0, ge=0)
    high: float = Field(120.0, ge=0)
    period: float = Field(4 * 3600.0, gt=0)
    duration: float = Field(900.0, ge=0)
    cores: int = Field(1, ge=1)


def burst(p: BurstParams) -> list[TraceJob]:
    return [TraceJob(str(i + 1), p.at, p.duration, p.cores, nodes=1, time_limit=p.duration)
            for i in range(p.jobs)]


def mpi(p: MpiParams) -> list[TraceJob]:
    return [TraceJob("1", p.at, p.duration, p.nodes * p.cores, nodes=p.nodes, time_limit=p.duration)]


def waves(p: WavesParams) -> list[TraceJob]:
    if p.run_max < p.run_min:
        raise WorkloadError(f"waves: run_max ({p.run_max}) < run_min ({p.run_min})")
    rng = random.Random(f"waves/{p.seed}")
    jobs = []
    for w in range(p.waves):
        for _ in range(p.jobs):
            run = rng.uniform(p.run_min, p.run_max)
            jobs.append(TraceJob(str(len(jobs) + 1), w * p.period + rng.uniform(0, p.spread), round(run),
                                 p.cores, nodes=1, time_limit=float(math.ceil(p.run_max))))
    return jobs


def rate(p: PatternParams, t: float) -> float:
    """Jobs per hour at ``t`` seconds."""
    x = t / (p.hours * 3600.0)
    if p.shape == "constant":
        return p.high
    if p.shape == "ascending":
        return p.low + (p.high - p.low) * x
    if p.shape == "descending":
        return p.high - (p.high - p.low) * x
    return p.low + (p.high - p.low) * (1 - math.cos(2 * math.pi * t / p.period)) / 2


def expected_jobs(p: PatternParams, steps: int = 10_000) -> float:
    """The integral of the rate over ``hours`` (midpoint rule)."""
    horizon = p.hours * 3600.0
    dt = horizon / steps
    return sum(rate(p, (i + 0.5) * dt) for i in range(steps)) * dt / 3600.0


def pattern(p: PatternParams) -> list[TraceJob]:
    """Non-homogeneous Poisson arrivals by thinning (Lewis and Shedler)."""
    rng = random.Random(f"pattern/{p.seed}")
    top = max(p.low, p.high) / 3600.0
    horizon = p.hours * 3600.0
    jobs: list[TraceJob] = []
    t = 0.0
    if top <= 0:
        return jobs
    while True:
        t += rng.expovariate(top)
        if t >= horizon:
            return jobs
        if rng.random() * top <= rate(p, t) / 3600.0:
            jobs.append(TraceJob(str(len(jobs) + 1), round(t, 3), p.duration, p.cores, nodes=1,
                                 time_limit=p.duration))


GENERATORS: dict[str, tuple[type[_Params], Callable[[Any], list[TraceJob]], str]] = {
    "burst": (BurstParams, burst, "EPU paper Fig. 5/6: N single-core jobs of 30 minutes at once"),
    "mpi": (MpiParams, mpi, "EPU paper Fig. 3: one N-node MPI job (reactivity)"),
    "waves": (WavesParams, waves, "EC3 case studies: waves of jobs with idle gaps"),
    "pattern": (PatternParams, pattern, "AutoElastic load patterns: constant, ascending, descending, wave"),
}


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """``NAME:key=value,key=value`` → (name, {key: value})."""
    name, _, rest = spec.partition(":")
    params: dict[str, str] = {}
    for item in filter(None, (x.strip() for x in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise WorkloadError(f"generator {name}: expected key=value, got {item!r}")
        params[key.strip()] = value.strip()
    return name.strip(), params


def params_of(name: str, values: dict[str, Any]) -> _Params:
    if name not in GENERATORS:
        raise WorkloadError(f"unknown generator {name!r} (known: {', '.join(GENERATORS)})")
    model = GENERATORS[name][0]
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        parts = []
        for err in exc.errors():
            key = ".".join(str(x) for x in err["loc"])
            msg = "unknown parameter" if err["type"] == "extra_forbidden" else err["msg"]
            parts.append(f"{name}.{key}: {msg}")
        raise WorkloadError("; ".join(parts)) from None


def generate(spec: str | tuple[str, dict[str, Any]], seed: int | None = None) -> Workload:
    """A workload from ``NAME:key=value,...`` (or (name, params)); ``seed`` overrides the spec's."""
    name, values = parse_spec(spec) if isinstance(spec, str) else spec
    if seed is not None and "seed" not in values:
        values = {**values, "seed": seed}
    p = params_of(name, values)
    jobs = GENERATORS[name][1](p)
    if not jobs:
        raise WorkloadError(f"generator {name}: these parameters give no job")
    text = ",".join(f"{k}={v}" for k, v in p.model_dump().items())
    return Workload(name, jobs, source=f"generator {name}:{text}")
