"""deploy/examples/epu.toml, deploy/systemd and the docs are one coherent set (issue 14).

Before: the example wrote stores under /var/lib/epu/ and the admin token under /etc/epu/,
while the units (``ProtectSystem=strict``) let each service write only /var/lib/epu-SERVICE;
the example Slurm domain had no ``node_names`` though the default add mode needs them; two
docs gave a three-slash (relative) SQLite URL for an absolute path; docs/deploy.md imported
RabbitMQ definitions from a relative path, which the server resolves in its own directory."""

from __future__ import annotations

import configparser
import re
from pathlib import Path, PurePosixPath

import pytest
from epu.common.cliargs import DEFAULT_CONFIG
from epu.common.config import load_config
from epu.common.config.checks import written_paths

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "examples" / "epu.toml"
SERVICES = ("sensor", "decision", "provisioner", "ctxbroker")


def unit(service: str) -> dict[str, str]:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(ROOT / "deploy" / "systemd" / f"epu-{service}.service")
    return dict(parser["Service"])


def writable_under(u: dict[str, str]) -> list[PurePosixPath]:
    """What a unit lets its service write: its StateDirectory (and ReadWritePaths, if any)."""
    assert u["ProtectSystem"] == "strict", "the rule below holds only with ProtectSystem=strict"
    dirs = [PurePosixPath("/var/lib") / d for d in u.get("StateDirectory", "").split()]
    dirs += [PurePosixPath(p.lstrip("-")) for p in u.get("ReadWritePaths", "").split()]
    return dirs


@pytest.mark.parametrize("service", SERVICES)
def test_every_path_the_example_makes_a_service_write_is_allowed_by_its_unit(service: str) -> None:
    config = load_config(EXAMPLE, environ={})
    u = unit(service)
    allowed = writable_under(u)
    cwd = PurePosixPath(u["WorkingDirectory"])
    paths = written_paths(config, service)
    if service != "sensor" or config.sensor.backend != "simulated":
        assert paths, f"{service} writes something (a store, a log): the list must know it"
    for key, path in paths:
        p = cwd / path  # a relative path is relative to the unit's working directory
        assert any(p.is_relative_to(d) for d in allowed), f"{key} = {path}: epu-{service}.service lets it write only {allowed}"


def test_every_file_the_example_makes_a_service_read_is_outside_the_hidden_places() -> None:
    """ProtectHome=yes hides /home and /root; PrivateTmp gives the service its own /tmp."""
    text = EXAMPLE.read_text()
    for path in re.findall(r'"(/[^"]+)"', text):
        assert not path.startswith(("/home/", "/root/", "/tmp/")), path


def test_the_example_slurm_domain_can_add_workers() -> None:
    config = load_config(EXAMPLE, environ={})
    assert config.sensor.backend == "slurm"
    add_mode = config.sensor.options.get("add_mode", "cloud")
    domain = config.domains[config.sensor.domain]
    assert add_mode == "dynamic" or len(domain.node_names) >= 1, \
        "the default add mode powers up pre-declared CLOUD slots: the domain must name them (node_names)"
    assert len(domain.node_names) >= min(domain.max_nodes, 10)


def test_the_units_and_the_commands_agree_on_the_config_path() -> None:
    for service in SERVICES:
        assert unit(service)["ExecStart"].endswith(f"run {service} -c {DEFAULT_CONFIG}")


DOCS = sorted([*(ROOT / "docs").glob("*.md"), ROOT / "README.md", *(ROOT / "deploy").rglob("*.md"),
               *(ROOT / "deploy").rglob("*.toml")])


def test_no_doc_gives_a_relative_sqlite_url_for_an_absolute_path() -> None:
    """``sqlite:///var/lib/x.db`` is var/lib/x.db under the working directory; four slashes
    are the absolute path."""
    bad = []
    for doc in DOCS:
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            if re.search(r"sqlite:///(var|etc|tmp|opt|srv|home|usr|run|data)/", line):
                bad.append(f"{doc.relative_to(ROOT)}:{n}: {line.strip()}")
    assert bad == []


def test_deploy_md_imports_definitions_the_server_can_read() -> None:
    """From an absolute path, or on standard input (the shell opens the file, so /root works)."""
    text = (ROOT / "docs" / "deploy.md").read_text()
    imports = re.findall(r"rabbitmqctl import_definitions (?:< )?(\S+)", text)
    assert imports and all(p.startswith("/") for p in imports), imports
