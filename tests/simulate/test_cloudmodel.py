from __future__ import annotations

import random
import statistics
from pathlib import Path

import pytest

from epu.simulate.cloudmodel import Dist, ModelError, SiteModel, load_cloud_model


def _draws(d: Dist, n: int = 20000) -> list[float]:
    r = random.Random(7)
    f = d.sampler()
    return [f(r) for _ in range(n)]


def test_distributions() -> None:
    assert set(_draws(Dist(dist="constant", seconds=42), 10)) == {42}
    u = _draws(Dist(dist="uniform", min=10, max=20))
    assert min(u) >= 10 and max(u) <= 20 and abs(statistics.mean(u) - 15) < 0.2
    n = _draws(Dist(dist="normal", mean=100, std=10))
    assert abs(statistics.mean(n) - 100) < 0.5 and abs(statistics.stdev(n) - 10) < 0.5
    ln = _draws(Dist(dist="lognormal", median=120, sigma=0.5))
    assert abs(statistics.median(ln) - 120) < 3
    assert abs(statistics.mean(ln) - Dist(dist="lognormal", median=120, sigma=0.5).mean_seconds()) < 3


def test_empirical_from_a_file(tmp_path: Path) -> None:
    (tmp_path / "boots.txt").write_text("# measured\n60\n90\n120\n")
    (tmp_path / "m.toml").write_text('[sites.a]\nboot = { dist = "empirical", file = "boots.txt" }\n')
    m = load_cloud_model(tmp_path / "m.toml")
    assert set(_draws(m.site("a").boot, 300)) == {60.0, 90.0, 120.0}
    assert m.site("other") == m.default


def test_billing_and_capacity() -> None:
    hourly = SiteModel(billing="hour")
    assert hourly.billed_seconds(1) == 3600 and hourly.billed_seconds(3600) == 3600
    assert hourly.billed_seconds(3601) == 7200 and hourly.billed_seconds(0) == 0
    assert SiteModel(billing="second", billing_minimum_seconds=60).billed_seconds(5) == 60
    assert SiteModel(billing="minute").billed_seconds(61) == 120
    cap = SiteModel(capacity=[(0, 100), (3600, 10)])
    assert (cap.capacity_at(0), cap.capacity_at(3599), cap.capacity_at(3600)) == (100, 100, 10)
    assert SiteModel().capacity_at(5) is None


def test_bad_models_name_the_key(tmp_path: Path) -> None:
    p = tmp_path / "m.toml"
    p.write_text('[sites.a]\nboot = { dist = "lognormal", median = 0 }\n')
    with pytest.raises(ModelError, match="m.toml: sites.a.boot"):
        load_cloud_model(p)
    p.write_text("[sites.a]\nbiling = \"hour\"\n")
    with pytest.raises(ModelError, match="sites.a.biling: unknown key"):
        load_cloud_model(p)
    p.write_text('[sites.a]\nboot = { dist = "empirical", file = "none.txt" }\n')
    with pytest.raises(ModelError, match="none.txt: cannot read"):
        load_cloud_model(p)
