"""Configuration and errors as an operator meets them (issue 14).

* One validation: what ``epu config check`` calls OK, the services accept; what a service
  refuses at start, the check reports first, with the same lines.
* An environment variable's typo is blamed on the variable, not the file.
* A command that needs a config and finds none (-c, $EPU_CONFIG, /etc/epu/epu.toml) says so.
* Every expected failure is one line naming the thing, with the documented exit status.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from epu.common.config import check_config, load_config

import epu.checks  # noqa: F401  (registers the policy check, as the CLI does)
from epu.cli import build_parser

EPU = [sys.executable, "-m", "epu.cli"]
ROOT = Path(__file__).resolve().parents[2]


def run(*argv: str, env: dict[str, str] | None = None, cwd: Path | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("EPU_")}
    return subprocess.run([*EPU, *argv], capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env={**base, "PYTHONPATH": str(ROOT), **(env or {})})


def write(tmp_path: Path, text: str, name: str = "epu.toml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


BAD = """
[broker]
url = "memory://"

[decision]
store_url = "sqlite:///{tmp}/decision.db"

[provisioner]
store_url = "sqlite:///{tmp}/provisioner.db"

[ctxbroker]
cert_file = "{tmp}/missing.crt"
key_file = "{tmp}/missing.key"
admin_token_file = "{tmp}/token"

[domains.alpha]
policy = "queue-demnd"
sites = ["ec2-west"]

[domains.beta]
policy = "queue-demand"
sites = ["sim"]
params = {{ idel_seconds = 30, gang_deadline_seconds = 900 }}

[sites.sim]
driver = "epu-sim"
credentials_file = "{tmp}/missing-credentials.toml"

[sites.other]
driver = "epu-sim"
driver_args = {{ boot_tme_min = 5 }}

[workers.beta]
context_uri = "https://ctx.example.org:8443/v1/contexts/abc123"
context_secret_file = "{tmp}/missing.secret"
"""

EXPECTED = {
    "decision": ["domains.alpha.sites: names site 'ec2-west', which has no [sites.ec2-west] (defined: sim, other)",
                 "domains.alpha.policy: unknown policy 'queue-demnd'",
                 "domains.beta.params.idel_seconds: unknown parameter (queue-demand takes: gang_deadline_seconds, "
                 "idle_seconds,",
                 "domains.beta.params.gang_deadline_seconds: 900 is above stall_seconds (600)"],
    "provisioner": ["sites.sim.credentials_file: credentials file {tmp}/missing-credentials.toml does not exist",
                    "sites.other: site other: driver_args key 'boot_tme_min'",
                    "workers.beta.context_secret_file: file {tmp}/missing.secret does not exist"],
    "ctxbroker": ["ctxbroker.cert_file: certificate {tmp}/missing.crt does not exist",
                  "ctxbroker.key_file: private key {tmp}/missing.key does not exist"],
}


def test_config_check_reports_what_the_services_refuse(tmp_path: Path) -> None:
    path = write(tmp_path, BAD.format(tmp=tmp_path))
    assert load_config(path, environ={})  # the schema alone is satisfied: these need the checks
    r = run("config", "check", str(path))
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.splitlines()
    for service, needles in EXPECTED.items():
        for needle in needles:
            assert any(line.startswith(f"{path}: ") and needle.format(tmp=tmp_path) in line for line in lines), \
                (service, needle, lines)
    assert "Traceback" not in r.stderr
    # each service refuses at start with the same lines, and only its own
    for service, needles in EXPECTED.items():
        s = run("run", service, "-c", str(path), timeout=60)
        assert s.returncode == 2, (service, s.stderr[-2000:])
        assert s.stderr.startswith("epu: bad configuration:\n") and "Traceback" not in s.stderr
        got = s.stderr.splitlines()[1:]
        want = [line for line in lines if any(n.format(tmp=tmp_path) in line for n in needles)]
        assert got == want, service
    # --service: a head node running only the sensor is not asked for the broker's certificate
    assert run("config", "check", "--service", "sensor", str(path)).returncode == 0


def test_a_good_config_passes_check_and_start(tmp_path: Path) -> None:
    path = write(tmp_path, f"""
        [broker]
        url = "memory://"
        [decision]
        store_url = "sqlite:///{tmp_path}/d.db"
        [domains.alpha]
        policy = "threshold"
        sites = ["sim"]
        params = {{ jobs_per_vm = 2 }}
        [sites.sim]
        driver = "epu-sim"
        """)
    assert check_config(load_config(path, environ={})) == []
    r = run("config", "check", "-c", str(path))
    assert r.returncode == 0 and "OK for every service" in r.stdout


def test_an_environment_typo_names_the_variable(tmp_path: Path) -> None:
    path = write(tmp_path, '[broker]\nurl = "memory://"\n')
    r = run("config", "check", str(path), env={"EPU_BROKER__URLL": "amqp://x", "EPU_DECISION__ITERATION_SECONDS": "fast"})
    assert r.returncode == 2
    assert "environment variable EPU_BROKER__URLL: broker.urll: unknown key" in r.stderr
    assert "environment variable EPU_DECISION__ITERATION_SECONDS: decision.iteration_seconds:" in r.stderr
    assert str(path) not in r.stderr  # the file is not to blame


def _leaf_parsers(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    out = []
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [(prefix, parser)]
    for sub in subs:
        for name, p in sub.choices.items():
            out += _leaf_parsers(p, (*prefix, name))
    return out


def test_every_command_accepts_c_and_epu_config(tmp_path: Path) -> None:
    leaves = _leaf_parsers(build_parser())
    assert len(leaves) > 15
    missing = [" ".join(name) for name, p in leaves
               if not any("-c" in a.option_strings for a in p._actions)]
    assert missing == []
    # EPU_CONFIG is the config when -c is not given
    path = write(tmp_path, '[broker]\nurl = "memory://"\n[decision]\nbogus = 1\n')
    r = run("config", "check", env={"EPU_CONFIG": str(path)})
    assert r.returncode == 2 and f"{path}: decision.bogus: unknown key" in r.stderr


@pytest.mark.parametrize("argv", [["tap", "--seconds", "1"], ["status", "alpha"], ["policy", "show", "alpha"],
                                  ["instances", "list"], ["run", "decision"], ["config", "check"],
                                  ["ctx", "list"], ["record", "--out", "x", "--seconds", "1"]])
def test_without_a_config_a_command_says_so_and_stops(argv: list[str], tmp_path: Path) -> None:
    if Path("/etc/epu/epu.toml").exists():
        pytest.fail("this machine has /etc/epu/epu.toml: the test needs a machine without one")
    r = run(*argv, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == ("epu: no configuration: give -c FILE, set EPU_CONFIG=FILE, or create "
                                "/etc/epu/epu.toml (start from deploy/examples/epu.toml; `epu deploy path` "
                                "shows where it is)")
    assert list(tmp_path.iterdir()) == []  # nothing created (no ./epu-provisioner.db)


def test_a_wrong_broker_password_is_one_line(tmp_path: Path, rabbit_vhost: str) -> None:
    path = write(tmp_path, f'[broker]\nurl = "amqp://guest:wrong-password@127.0.0.1:5672/{rabbit_vhost}"\n')
    for argv in (["tap", "--seconds", "2"], ["status", "alpha"], ["policy", "pause", "alpha"]):
        r = run(*argv, "-c", str(path))
        assert r.returncode == 1, (argv, r.stderr)
        assert r.stderr.strip() == (f"epu: RabbitMQ at amqp://guest:***@127.0.0.1:5672/{rabbit_vhost} refused the "
                                    "login (ACCESS_REFUSED): check the user name and password in [broker] url "
                                    "(or EPU_BROKER__URL)"), argv
    path = write(tmp_path, '[broker]\nurl = "amqp://guest:guest@127.0.0.1:1/"\n', "closed.toml")
    r = run("tap", "--seconds", "2", "-c", str(path))
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and "cannot reach RabbitMQ" in r.stderr


def test_a_missing_certificate_stops_the_broker_before_it_serves(tmp_path: Path) -> None:
    path = write(tmp_path, f"""
        [broker]
        url = "memory://"
        [ctxbroker]
        port = 0
        cert_file = "{tmp_path}/nope.crt"
        key_file = "{tmp_path}/nope.key"
        store_url = "sqlite:///{tmp_path}/c.db"
        admin_token_file = "{tmp_path}/token"
        """)
    r = run("run", "ctxbroker", "-c", str(path))
    assert r.returncode == 2 and "serving" not in r.stderr and "Traceback" not in r.stderr
    assert f"ctxbroker.cert_file: certificate {tmp_path}/nope.crt does not exist" in r.stderr


def test_broken_files_are_one_line(tmp_path: Path) -> None:
    broken = write(tmp_path, "[broker\n", "broken.toml")
    r = run("config", "check", str(broken))
    assert r.returncode == 2 and r.stderr.strip() == f"{broken}: not valid TOML: Expected ']' at the end of a table declaration (at line 1, column 8)"
    r = run("tap", "-c", str(broken))
    assert r.returncode == 2 and "Traceback" not in r.stderr and "not valid TOML" in r.stderr
    r = run("deploy", "rabbitmq-definitions", "--passwords-file", str(broken))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "not valid TOML" in r.stderr
    r = run("deploy", "rabbitmq-definitions", "--passwords-file", str(tmp_path / "none.toml"))
    assert r.returncode == 2 and "No such file" in r.stderr and "Traceback" not in r.stderr
    r = run("config", "check", str(tmp_path / "none.toml"))
    assert r.returncode == 2 and "cannot read" in r.stderr and "Traceback" not in r.stderr
