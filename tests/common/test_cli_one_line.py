"""Bad values at the command line are one line each, never a pydantic dump or a traceback (issue 27).

Before: ``epu policy set alpha max_nodes=-1`` printed "1 validation error for PolicyChange",
the field, the pydantic type tag and a URL on four lines; ``--timeout -1``, ``--count -1`` and
``--seconds -1`` were taken as they came; a change the broker refused (no commands exchange)
was a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def epu(tmp_path: Path, *argv: str, url: str = "amqp://guest:guest@127.0.0.1:1/x",
        prefix: str = "") -> subprocess.CompletedProcess[str]:
    cfg = tmp_path / "epu.toml"
    cfg.write_text(f'[broker]\nurl = "{url}"\nprefix = "{prefix}"\n[domains.alpha]\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("EPU_")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "epu", *argv, "-c", str(cfg)], capture_output=True, text=True,
                          timeout=60, env=env, cwd=tmp_path)


@pytest.mark.parametrize("argv, expected", [
    (["policy", "set", "alpha", "max_nodes=-1"], "epu policy: invalid change: max_nodes: Input should be greater "
                                                 "than or equal to 0 (got -1)"),
    (["policy", "set", "alpha", "min_nodes=-3", "max_nodes=x"], "min_nodes: Input should be greater than or equal "
                                                                "to 0 (got -3); max_nodes: "),
    (["policy", "set", "alpha", "max_nodes=2", "--timeout", "-1"], "argument --timeout: must be 0 or more, got -1"),
    (["instances", "terminate", "i-1", "--timeout", "-5"], "argument --timeout: must be 0 or more, got -5"),
    (["tap", "--count", "-1"], "argument --count: must be 0 or more, got -1"),
    (["tap", "--seconds", "-1"], "argument --seconds: must be 0 or more, got -1"),
    (["status", "--seconds", "-2"], "argument --seconds: must be 0 or more, got -2"),
    (["record", "--seconds", "-2", "--out", "x"], "argument --seconds: must be 0 or more, got -2"),
])
def test_a_bad_value_is_one_line_and_exit_2(tmp_path: Path, argv: list[str], expected: str) -> None:
    res = epu(tmp_path, *argv)
    assert res.returncode == 2, res
    last = res.stderr.strip().splitlines()[-1]
    assert expected in last, res.stderr
    assert "validation error" not in res.stderr and "errors.pydantic.dev" not in res.stderr


@pytest.mark.rabbitmq
def test_a_request_the_broker_refuses_is_one_line(tmp_path: Path, rabbit_url: str, prefix: str) -> None:
    """No commands exchange of this prefix in the vhost: the publish is refused (404)."""
    res = epu(tmp_path, "policy", "set", "alpha", "max_nodes=2", "--timeout", "5", url=rabbit_url, prefix=prefix)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert "refused the request" in res.stderr and "no exchange" in res.stderr and "nothing was sent" in res.stderr
