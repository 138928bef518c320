"""Config: one TOML file, environment overrides, errors that name file, key and expectation."""

from __future__ import annotations

from pathlib import Path

import pytest
from epu.common.config import ConfigError, load_config

from epu.cli import main

GOOD = """
[broker]
url = "amqp://epu:secret@127.0.0.1:5672/epu"

[decision]
iteration_seconds = 2

[domains.alpha]
policy = "queue-demand"
max_nodes = 8
sites = ["sim"]

[sites.sim]
driver = "epu-sim"
quota = 10
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "epu.toml"
    p.write_text(text)
    return p


def test_good_file_loads_with_sections_per_service_and_domain(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, GOOD), environ={})
    assert cfg.decision.iteration_seconds == 2
    assert cfg.domains["alpha"].max_nodes == 8
    assert cfg.sites["sim"].quota == 10
    assert cfg.sensor.poll_seconds == 60  # default


def test_metrics_host_takes_an_address_or_a_host_name(tmp_path: Path) -> None:
    for host in ("0.0.0.0", "192.0.2.7", "control1.cluster.example.org", "localhost"):
        cfg = load_config(write(tmp_path, GOOD + f"[provisioner]\nmetrics_host = '{host}'\n"), environ={})
        assert cfg.provisioner.metrics_host == host
    assert load_config(write(tmp_path, GOOD), environ={}).decision.metrics_host == "127.0.0.1"


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    env = {"EPU_DOMAINS__ALPHA__MAX_NODES": "20", "EPU_BROKER__URL": "memory://", "EPU_DECISION__ITERATION_SECONDS": "0.5",
           "EPU_LOGGING__JSON": "true", "UNRELATED": "x"}
    cfg = load_config(write(tmp_path, GOOD), environ=env)
    assert cfg.domains["alpha"].max_nodes == 20
    assert cfg.broker.url == "memory://"
    assert cfg.decision.iteration_seconds == 0.5
    assert cfg.logging.json_format is True


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[decision]\niteration_seconds = 'fast'\n", "decision.iteration_seconds: Input should be a valid number"),
        ("[decision]\niteration_secs = 2\n", "decision.iteration_secs: unknown key"),
        ("[domains.alpha]\nmin_nodes = 5\nmax_nodes = 2\n", "domains.alpha: Value error, min_nodes (5) is greater"),
        ("[domains.Alpha]\n", "domains: Value error, name 'Alpha' must match"),
        ("[sites.sim]\nquota = 2\n", "sites.sim.driver: Field required"),
        ("[sensor]\nbackend = 'pbspro'\n", "sensor.backend: Input should be 'simulated', 'torque', 'slurm' or 'htcondor'"),
        ("[broker\n", "not valid TOML"),
        ("[decision]\nmetrics_host = '::'\n", "decision.metrics_host: Value error, '::': an IPv6 address"),
        ("[sensor]\nmetrics_host = '10.0.0.300'\n", "sensor.metrics_host: Value error, '10.0.0.300': expected an IPv4"),
        ("[provisioner]\nmetrics_host = 'http://prom'\n", "provisioner.metrics_host: Value error"),
    ],
)
def test_bad_config_names_the_file_and_the_key(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(path, environ={})
    assert str(err.value).startswith(str(path))
    assert expected in str(err.value)


def test_bad_environment_override_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"domains\.alpha\.max_nodes: Input should be a valid integer"):
        load_config(write(tmp_path, GOOD), environ={"EPU_DOMAINS__ALPHA__MAX_NODES": "lots"})


def test_epu_config_check_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "check", str(write(tmp_path, GOOD))]) == 0
    out = capsys.readouterr().out
    assert "OK" in out and "1 domain(s)" in out and "secret" not in out
    assert main(["config", "check", str(write(tmp_path, "[decision]\nbogus = 1\n"))]) == 2
    assert "decision.bogus: unknown key" in capsys.readouterr().err


def test_config_check_json_redacts_secrets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = GOOD + '\n[sites.sim.driver_args]\nsecret = "hunter2"\n'
    assert main(["config", "check", "--json", str(write(tmp_path, text))]) == 0
    out = capsys.readouterr().out
    assert "hunter2" not in out and "epu:secret@" not in out and "epu:***@" in out
