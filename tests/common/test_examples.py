"""The configuration shipped in deploy/examples is valid."""

from __future__ import annotations

from pathlib import Path

import pytest
from epu.common.config import load_config

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "deploy" / "examples").glob("*.toml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_config_is_valid(path: Path) -> None:
    config = load_config(path, environ={})
    for domain in config.domains.values():
        assert set(domain.sites) <= set(config.sites), "every site a domain uses is defined"
