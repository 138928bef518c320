"""One bound on ``max_nodes`` for the file and for run-time changes (issue 27).

Before: ``epu config check`` passed ``max_nodes = 1000000`` in the file while ``epu policy set
max_nodes=1000000`` was refused (above the sum of the sites' quotas); the file's own value
even raised the ceiling a change was held to."""

from __future__ import annotations

import pytest
from epu.common.config import check_config, parse_config
from epu.common.messages import PolicyChange
from epu.services.decision.changes import ChangeRejected, apply_change, check_ceiling

import epu.checks  # noqa: F401  (registers the decision engine's checks)


def config(max_nodes: int, **domain: object) -> object:
    return parse_config({"domains": {"alpha": {"max_nodes": max_nodes, "sites": ["a", "b"], **domain}},
                         "sites": {"a": {"driver": "epu-sim", "quota": 30}, "b": {"driver": "epu-sim", "quota": 10},
                                   "c": {"driver": "epu-sim", "quota": 500}}}, environ={})


def file_accepts(cfg: object) -> bool:
    return not [p for p in check_config(cfg, ["decision"]) if p.startswith("domains.alpha.max_nodes")]


def change_accepts(cfg: object, max_nodes: int) -> bool:
    current = cfg.domains["alpha"].model_copy(update={"max_nodes": 1})
    try:
        new = apply_change(current, PolicyChange(change_id="c1", domain="alpha", max_nodes=max_nodes), ["a", "b", "c"])
        check_ceiling(new, cfg.domains["alpha"], {n: s.quota for n, s in cfg.sites.items()})
    except ChangeRejected:
        return False
    return True


@pytest.mark.parametrize("value", [0, 10, 40, 41, 1000000])
def test_the_file_and_a_change_accept_the_same_values(value: int) -> None:
    cfg = config(value if value <= 40 else 40)
    assert file_accepts(config(value)) == change_accepts(cfg, value) == (value <= 40)


def test_the_message_names_the_key_the_bound_and_where_it_comes_from() -> None:
    [problem] = [p for p in check_config(config(1000000), ["decision"]) if "max_nodes" in p]
    assert problem == ("domains.alpha.max_nodes: 1000000 is above the ceiling 40 (the sum of the quotas of sites "
                       "a, b; raise a quota or set max_nodes_ceiling)")


def test_max_nodes_ceiling_lifts_both() -> None:
    cfg = config(1000, max_nodes_ceiling=2000)
    assert file_accepts(cfg) and change_accepts(cfg, 2000) and not change_accepts(cfg, 2001)
