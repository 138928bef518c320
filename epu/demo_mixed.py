"""``epu demo --workload mixed``: jobs of several shapes on a typed catalogue (issue 13).

The cloud sites offer instance types — a cheap 4-core ``c4``, a 512 GB ``r16`` with the ``bigmem``
feature, an 8-core ``g8`` with one GPU — and the domain maps its partitions to them (``cpu`` →
c4, ``bigmem`` → r16, ``gpu`` → g8). The burst mixes 1-core cpu jobs, 200 GB bigmem jobs and
1-GPU jobs, plus jobs no new node can start: two pending on a QOS limit and one asking 64 cores per
node, which no type has. The engine launches the cheapest type for each partition, nothing for the
stuck jobs (they stay pending, reported as unsatisfiable or not demand), and scales back to zero.

Workers are named per type (``type_nodes`` patterns, as Slurm CLOUD slots declared per type would
be), so the simulated batch system gives each new node its type's memory, GPUs, features and
partition when the engine adds it.
"""

from __future__ import annotations

import random
from typing import Any

from epu.services.sensor.simulated import SimulatedBatch

TYPES: dict[str, dict[str, Any]] = {
    "c4": {"size": "sim.c4", "cores": 4, "memory_mb": 16000, "price_per_hour": 0.05},
    "r16": {"size": "sim.r16", "cores": 16, "memory_mb": 512000, "features": ["bigmem"], "price_per_hour": 0.5},
    "g8": {"size": "sim.g8", "cores": 8, "memory_mb": 61000, "gpus": 1, "features": ["gpu"], "price_per_hour": 1.2},
}
PARTITIONS = {"cpu": ["c4"], "bigmem": ["r16"], "gpu": ["g8"]}
PREFIX = {"c4": "cpu", "r16": "bigmem", "g8": "gpu"}
"""Type → the word in its workers' names (``demo-gpu-1a2b3c4d``)."""
STUCK = 3
"""Jobs the mixed burst leaves pending on purpose (two limit-blocked, one unsatisfiable)."""


def sites(base: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The demo's two sites with catalogues: cloud-a offers every type, cloud-b (dearer) only c4."""
    dear = {"c4": {**TYPES["c4"], "price_per_hour": 0.12}}
    return {"cloud-a": {**base, "quota": 8, "types": TYPES}, "cloud-b": {**base, "quota": 8, "types": dear}}


def domain_keys() -> dict[str, Any]:
    return {"partitions": PARTITIONS, "default_partition": "cpu",
            "type_nodes": {t: {"pattern": f"{{domain}}-{p}-{{id}}"} for t, p in PREFIX.items()}}


class TypedBatch(SimulatedBatch):
    """A simulated batch system whose nodes take their type's resources from their name when they
    are created (before anything is scheduled on them, as a declared Slurm slot would)."""

    def _add(self, name: str, cores: int, instance_id: str | None = None) -> None:
        super()._add(name, cores, instance_id)
        for kind, word in PREFIX.items():
            if f"-{word}-" in name:
                t, node = TYPES[kind], self._nodes[name]
                node.memory_mb, node.gpus = t["memory_mb"], t.get("gpus", 0)
                node.features, node.partitions = frozenset(t.get("features", ())), frozenset({word})


def submit(batch: SimulatedBatch, jobs: int, job_seconds: float, rng: random.Random) -> int:
    """The mixed burst: ``jobs`` runnable jobs (70 % cpu, 15 % bigmem, 15 % gpu) plus ``STUCK`` that
    no node will start. Returns how many are stuck."""
    def seconds() -> float:
        return job_seconds * rng.uniform(0.5, 1.5)

    big = max(1, jobs * 15 // 100)
    gpu = max(1, jobs * 15 // 100)
    for _ in range(max(1, jobs - big - gpu)):
        batch.submit(cores=1, duration=seconds(), queue="cpu")
    for _ in range(big):
        batch.submit(cores=4, memory_mb=200_000, features=("bigmem",), duration=seconds(), queue="bigmem")
    for _ in range(gpu):
        batch.submit(cores=2, gpus=1, features=("gpu",), duration=seconds(), queue="gpu")
    batch.submit(cores=1, count=2, duration=seconds(), queue="cpu", blocked="QOSMaxJobsPerUserLimit")
    batch.submit(cores=64, duration=seconds(), queue="cpu")
    return STUCK
