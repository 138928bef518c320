"""Run scenarios over seeds and sum up: what ``epu sim`` and the tests call.

A run is independent of every other (its own world, its own databases in a temporary
directory), so seeds can be split over processes (``jobs``) without changing any result.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from epu.sim.scenarios import get_scenario
from epu.sim.simulation import RunResult, Simulation


def run_one(scenario: str, seed: int, domain: dict[str, Any] | None = None) -> RunResult:
    """One run; ``domain`` replaces fields of the scenario's ``DomainSpec`` (policy, params,
    bounds...: ``epu sim -c FILE`` simulates the configured domain)."""
    sc = get_scenario(scenario)
    if domain:
        sc.domain = replace(sc.domain, **domain)
    return Simulation(sc, seed).run()


@dataclass
class ScenarioSummary:
    scenario: str
    runs: int = 0
    simulated_hours: float = 0.0
    violations: int = 0
    by_invariant: dict[int, int] = field(default_factory=dict)
    failing_seeds: list[int] = field(default_factory=list)
    wall_seconds: float = 0.0
    cpu_seconds: float = 0.0
    first: list[str] = field(default_factory=list)
    """The first violation of each failing seed (up to a few), with its replay command."""
    replay_suffix: str = ""
    """Appended to replay commands (``-c FILE`` when the domain came from a config file)."""

    def add(self, r: RunResult) -> None:
        self.runs += 1
        self.simulated_hours += r.simulated_seconds / 3600.0
        self.wall_seconds += r.wall_seconds
        self.cpu_seconds += r.cpu_seconds
        if r.violations:
            self.violations += len(r.violations)
            self.failing_seeds.append(r.seed)
            for v in r.violations:
                self.by_invariant[v.invariant] = self.by_invariant.get(v.invariant, 0) + 1
            if len(self.first) < 5:
                self.first.append(f"seed {r.seed}: {r.violations[0]} — replay: {r.replay()}{self.replay_suffix}")

    def as_json(self) -> dict[str, Any]:
        return {"runs": self.runs, "simulated_hours": round(self.simulated_hours, 2),
                "violations": self.violations,
                "by_invariant": {str(k): v for k, v in sorted(self.by_invariant.items())},
                "failing_seeds": self.failing_seeds[:50],
                "replay": [f"epu sim --seed {s} --scenario {self.scenario}{self.replay_suffix}"
                           for s in self.failing_seeds[:10]],
                "wall_seconds": round(self.wall_seconds, 2), "cpu_seconds": round(self.cpu_seconds, 2)}


def _work(args: tuple[str, int, dict[str, Any] | None]) -> RunResult:
    return run_one(*args)


def run_many(scenarios: Iterable[str], seeds: Iterable[int], *, jobs: int = 1,
             progress: Callable[[RunResult], None] | None = None, domain: dict[str, Any] | None = None,
             replay_suffix: str = "") -> dict[str, ScenarioSummary]:
    """Every (scenario, seed) pair; ``jobs`` > 1 spreads them over processes."""
    todo = [(s, seed, domain) for s in scenarios for seed in seeds]
    out: dict[str, ScenarioSummary] = {s: ScenarioSummary(s, replay_suffix=replay_suffix) for s, _, _ in todo}

    def take(r: RunResult) -> None:
        out[r.scenario].add(r)
        if progress is not None:
            progress(r)

    if jobs <= 1 or len(todo) <= 1:
        for item in todo:
            take(_work(item))
    else:
        with ProcessPoolExecutor(max_workers=min(jobs, os.cpu_count() or 1)) as pool:
            for r in pool.map(_work, todo, chunksize=1):
                take(r)
    return out
