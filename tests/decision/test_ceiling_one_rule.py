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


def test_a_file_above_the_quotas_is_refused_at_start_and_the_docs_say_so(tmp_path) -> None:  # noqa: ANN001
    """Issue 33: docs/decision.md and ``DomainConfig.max_nodes_ceiling`` said a file's
    ``max_nodes`` above the quotas becomes the ceiling, while the start-up check refuses such a
    file. The refusal is the rule (a bound the clouds can never give is a misreading of capacity,
    and a mistyped number must not lift what run-time changes may set); the docs now say so."""
    import inspect
    import subprocess
    import sys
    from pathlib import Path

    from epu.common.config.decision import DomainConfig

    path = tmp_path / "epu.toml"
    path.write_text(f"""
[broker]
url = "memory://"
[decision]
store_url = "sqlite:///{tmp_path}/d.db"
[domains.alpha]
max_nodes = 41
sites = ["a", "b"]
[sites.a]
driver = "epu-sim"
quota = 30
[sites.b]
driver = "epu-sim"
quota = 10
""")
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-m", "epu.cli", "run", "decision", "-c", str(path)], capture_output=True,
                       text=True, timeout=60, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.splitlines()[1:] == [f"{path}: domains.alpha.max_nodes: 41 is above the ceiling 40 (the sum "
                                         "of the quotas of sites a, b; raise a quota or set max_nodes_ceiling)"]
    doc = " ".join((root / "docs" / "decision.md").read_text().split())
    field = " ".join(inspect.getsource(DomainConfig).split())
    for text in (doc, field):
        assert "if larger" not in text  # the file's own max_nodes never lifts the ceiling
        assert "refused at start" in text
