"""Each service's doc has a module map naming every module of the service, and nothing else.

A newcomer reads docs/<service>.md to find their way in ``services/<service>/``; a module the map
does not name (or a name whose module is gone) sends them to read the code blind. The map is the
doc's ``## Module map`` section; a module is named in the first column of its tables by its path
inside the service in backticks (``policies/queue_demand.py``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("decision", "sensor", "provisioner", "ctxbroker")


def module_map(doc: str) -> str:
    """The text of the ``## Module map`` section (up to the next ``## `` heading)."""
    m = re.search(r"^## Module map\n(.*?)(?=^## |\Z)", doc, re.S | re.M)
    assert m, "no '## Module map' section"
    return m.group(1)


def named(section: str) -> set[str]:
    """The modules named in the first column of the section's table rows."""
    return {name for line in section.splitlines() if line.startswith("| ")
            for name in re.findall(r"`([\w/]+\.py)`", line.split("|")[1])}


def modules(service: str) -> set[str]:
    folder = ROOT / "services" / service
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*.py") if p.name != "__init__.py"}


@pytest.mark.parametrize("service", SERVICES)
def test_every_module_of_the_service_is_in_its_docs_module_map(service: str) -> None:
    section = module_map((ROOT / "docs" / f"{service}.md").read_text())
    assert sorted(modules(service) - named(section)) == [], "modules missing from the map"
    assert sorted(named(section) - modules(service)) == [], "the map names modules that do not exist"


def test_the_map_reader_sees_a_missing_module() -> None:
    doc = ("# X\n\n## Module map\n\n`tests/t.py` checks it.\n\n| `a.py` | one, unlike `d.py` |\n| `sub/b.py` | two |\n"
           "\n## Next\n\n| `c.py` | elsewhere |\n")
    assert named(module_map(doc)) == {"a.py", "sub/b.py"}
