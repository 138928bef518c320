"""One rule for a spend cap in the file (``epu config check``) and at run time (``epu policy set``):
a cap over a type nobody priced is refused with the type named (issue 33, defect 4), and so is a
cap below the price of one instance of the cheapest type it may launch (issue 34: it passed
``config check`` and then held every launch)."""

from __future__ import annotations

import pytest
from epu.common.config import check_config, parse_config
from epu.common.messages import PolicyChange

import epu.checks  # noqa: F401  (registers the decision engine's checks)
from tests.decision.helpers import make_engine

SITES = {"cheap": {"driver": "epu-sim", "quota": 10, "price_per_hour": 0.1},
         "typed": {"driver": "epu-sim", "quota": 10,
                   "types": {"c4": {"cores": 4, "price_per_hour": 0.2}, "dark": {"cores": 8}}},
         "bare": {"driver": "epu-sim", "quota": 10}}


def config(sites: list[str], cap: float | None = None, *, site_caps: dict[str, float] | None = None,
           **domain: object) -> object:
    sections = {n: {**SITES[n], **({"budget_per_hour": site_caps[n]} if site_caps and n in site_caps else {})}
                for n in SITES}
    return parse_config({"decision": {"store_url": "sqlite://"},
                         "domains": {"alpha": {"max_nodes": 5, "sites": sites, **domain,
                                               **({"budget_per_hour": cap} if cap is not None else {})}},
                         "sites": sections}, environ={})


def file_problems(cfg: object) -> list[str]:
    return [p for p in check_config(cfg, ["decision"]) if "budget_per_hour" in p]


def change_outcome(sites: list[str], cap: float) -> object:
    """``epu policy set alpha budget_per_hour=CAP`` on a domain of ``sites`` without a cap."""
    e, _bus, clock = make_engine(cfg=config(sites))
    e.store.seed_config("alpha", e.config.domains["alpha"], clock.now())
    return e.on_policy_change(PolicyChange(change_id="c", domain="alpha", budget_per_hour=cap))


@pytest.mark.parametrize(("sites", "cap", "named"), [
    (["cheap"], 1.0, None),
    (["bare"], 1.0, "bare/default has no price_per_hour"),
    (["typed"], 1.0, "typed/dark has no price_per_hour"),
    (["cheap", "typed"], 1.0, "typed/dark"),
    (["cheap"], 0.05, "below the price of one instance of the cheapest type it may launch (cheap/default at 0.1/h)"),
    (["typed"], 0.15, "typed/c4 at 0.2/h"),
])
def test_the_file_and_a_change_refuse_the_same_caps_naming_why(sites, cap, named) -> None:
    problems = file_problems(config(sites, cap))
    out = change_outcome(sites, cap)
    if named is None:
        assert problems == [] and out.applied
        return
    assert problems and all(p.startswith("domains.alpha.budget_per_hour: ") for p in problems)
    assert any(named in p for p in problems), problems
    assert not out.applied and named in out.reason


def test_a_partition_map_limits_what_the_cap_judges() -> None:
    """A type the domain can never launch (no partition lists it) needs no price."""
    cfg = config(["typed"], 1.0, partitions={"cpu": ["c4"]}, default_partition="cpu")
    assert file_problems(cfg) == []


def test_a_site_cap_over_an_unpriced_type_or_below_its_cheapest_is_refused() -> None:
    problems = file_problems(config(["cheap"], site_caps={"typed": 5.0, "cheap": 0.01}))
    assert any(p.startswith("sites.typed.budget_per_hour: 5 is set but typed/dark has no price_per_hour")
               for p in problems), problems
    assert any(p.startswith("sites.cheap.budget_per_hour: 0.01 is below") for p in problems), problems


def test_a_change_that_does_not_touch_the_cap_is_not_refused_for_it() -> None:
    """A cap the catalogue outgrew at run time is held by the engine (test_budget_unpriced); an
    unrelated change (max_nodes) still goes through."""
    e, _bus, clock = make_engine(cfg=config(["typed"], 1.0))
    e.store.seed_config("alpha", e.config.domains["alpha"], clock.now())
    assert e.on_policy_change(PolicyChange(change_id="m", domain="alpha", max_nodes=4)).applied
    out = e.on_policy_change(PolicyChange(change_id="s", domain="alpha", sites=["typed"]))
    assert not out.applied and "typed/dark" in out.reason
