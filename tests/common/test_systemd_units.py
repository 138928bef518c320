"""deploy/systemd: one unit per service, each valid for systemd itself (``systemd-analyze
verify``) and saying what an operator relies on: the command, restart on failure, its own
user, hardening.

``verify`` checks that ExecStart's binary exists and that every referenced unit is known, so
it runs against a scratch root: the system's own units, plus a stand-in
``/usr/local/bin/epu`` (where ``pip install`` puts the real one on a site).
"""

from __future__ import annotations

import configparser
import shutil
import subprocess
from pathlib import Path

import pytest

UNITS_DIR = Path(__file__).resolve().parents[2] / "deploy" / "systemd"
SERVICES = ("sensor", "decision", "provisioner", "ctxbroker")
SYSTEM_UNITS = Path("/usr/lib/systemd/system")


def unit(service: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # keys are case-sensitive in systemd
    parser.read(UNITS_DIR / f"epu-{service}.service")
    return parser


@pytest.mark.parametrize("service", SERVICES)
def test_unit_runs_the_service_as_its_own_user(service: str) -> None:
    u = unit(service)["Service"]
    assert u["ExecStart"] == f"/usr/local/bin/epu run {service} -c /etc/epu/epu.toml"
    assert u["Restart"] == "on-failure"
    assert u["User"] == f"epu-{service}"
    assert u["NoNewPrivileges"] == "yes" and u["ProtectSystem"] == "strict"
    assert u["CapabilityBoundingSet"] == ""
    assert u["StateDirectory"] == f"epu-{service}"


def test_one_unit_per_service_and_nothing_else() -> None:
    assert sorted(p.name for p in UNITS_DIR.glob("*.service")) == sorted(f"epu-{s}.service" for s in SERVICES)


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    exe = shutil.which("systemd-analyze")
    assert exe, "systemd-analyze is missing: apt-get install -y systemd (scripts/ensure-services.sh)"
    assert SYSTEM_UNITS.is_dir(), f"{SYSTEM_UNITS} missing: the system's units are needed to resolve targets"
    root = tmp_path / "root"
    (root / "usr" / "local" / "bin").mkdir(parents=True)
    (root / "usr" / "lib" / "systemd").mkdir(parents=True)
    (root / "etc" / "systemd" / "system").mkdir(parents=True)
    shutil.copytree(SYSTEM_UNITS, root / "usr" / "lib" / "systemd" / "system", symlinks=True)
    stub = root / "usr" / "local" / "bin" / "epu"
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)
    paths = []
    for service in SERVICES:
        target = root / "etc" / "systemd" / "system" / f"epu-{service}.service"
        shutil.copy(UNITS_DIR / target.name, target)
        paths.append(str(target))
    proc = subprocess.run([exe, "verify", f"--root={root}", *paths], capture_output=True, text=True, timeout=120)
    # verify exits 0 on mere warnings (an unknown key, a bad value): any line about our units fails too
    ours = [line for line in (proc.stdout + proc.stderr).splitlines() if "epu-" in line]
    assert proc.returncode == 0 and not ours, proc.stdout + proc.stderr


@pytest.mark.parametrize("service", SERVICES)
def test_the_documentation_a_unit_names_is_shipped_and_installed_by_the_guide(service: str) -> None:
    """Before: every unit pointed to /usr/share/doc/epu/deploy.md, which nothing installed (the
    wheel carried no docs and the guide copied none): ``systemctl help`` found nothing."""
    root = UNITS_DIR.parents[1]
    urls = unit(service)["Unit"]["Documentation"].split()
    assert f"file:///usr/share/doc/epu/{service}.md" in urls
    installed = 'sudo install -D -m 0644 -t /usr/share/doc/epu "$(epu deploy path)"/../docs/*.md'
    assert installed in (root / "docs" / "deploy.md").read_text()
    setup = (root / "setup.py").read_text()
    assert '"epu.docs": "docs"' in setup and 'glob("*.md")' in setup, "the wheel carries docs/*.md as epu/docs"
    for url in urls:
        assert url.startswith("file:///usr/share/doc/epu/"), url
        name = url.removeprefix("file:///usr/share/doc/epu/")
        assert name.endswith(".md") and (root / "docs" / name).is_file(), url
