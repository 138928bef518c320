"""Generators reproduce the statistics their documentation states."""

from __future__ import annotations

import math
import statistics

import pytest

from epu.workloads.generators import PatternParams, expected_jobs, generate, rate
from epu.workloads.model import WorkloadError


def test_burst_is_the_papers() -> None:
    w = generate("burst")
    assert len(w.jobs) == 512 and {(j.submit, j.run, j.procs, j.nodes) for j in w.jobs} == {(0.0, 1800.0, 1, 1)}


def test_mpi_is_one_wide_job() -> None:
    (j,) = generate("mpi:nodes=256,duration=60").jobs
    assert (j.nodes, j.procs, j.run) == (256, 256, 60.0)


def test_waves() -> None:
    w = generate("waves:waves=3,jobs=50,period=3600,spread=300,run_min=100,run_max=200")
    assert len(w.jobs) == 150
    for k in range(3):
        wave = [j for j in w.jobs if k * 3600 <= j.submit < (k + 1) * 3600]
        assert len(wave) == 50 and all(j.submit <= k * 3600 + 300 for j in wave)
    runs = [j.run for j in w.jobs]
    assert min(runs) >= 100 and max(runs) <= 200 and abs(statistics.mean(runs) - 150) < 10


@pytest.mark.parametrize("shape", ["constant", "ascending", "descending", "wave"])
def test_pattern_count_matches_the_integral_of_the_rate(shape: str) -> None:
    p = PatternParams(shape=shape, hours=200, low=10, high=100, period=7200)
    n = len(generate(("pattern", p.model_dump())).jobs)
    expected = expected_jobs(p)
    assert abs(n - expected) < 4 * math.sqrt(expected)  # Poisson: within 4 standard deviations


def test_pattern_shapes_follow_their_rate() -> None:
    def halves(shape: str) -> tuple[int, int]:
        jobs = generate(f"pattern:shape={shape},hours=100,low=10,high=100").jobs
        return (sum(1 for j in jobs if j.submit < 50 * 3600), sum(1 for j in jobs if j.submit >= 50 * 3600))

    a, b = halves("ascending")
    assert b > 1.5 * a
    a, b = halves("descending")
    assert a > 1.5 * b
    p = PatternParams(shape="wave", low=0, high=60, period=3600)
    assert rate(p, 0) == 0 and rate(p, 1800) == pytest.approx(60)


def test_same_seed_same_jobs_other_seed_other_jobs() -> None:
    assert generate("waves", seed=3).jobs == generate("waves", seed=3).jobs
    assert generate("waves", seed=3).jobs != generate("waves", seed=4).jobs


@pytest.mark.parametrize("spec, msg", [
    ("burst:jbos=3", "burst.jbos: unknown parameter"),
    ("burst:jobs=-1", "burst.jobs"),
    ("pattern:shape=zigzag", "pattern.shape"),
    ("nope", "unknown generator 'nope'"),
    ("burst:jobs", "expected key=value"),
])
def test_bad_specs_name_the_key(spec: str, msg: str) -> None:
    with pytest.raises(WorkloadError, match=msg):
        generate(spec)
