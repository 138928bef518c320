"""The layers of the design brief, checked on the source: ``common`` (contract, runtime,
config) imports no service and not the composition layer; a service imports no other service
and not the composition layer (``epu`` itself: CLI, demo, recorder, simulator)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("sensor", "decision", "provisioner", "ctxbroker")


def imports(folder: Path) -> list[tuple[Path, str]]:
    out = []
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                out.append((path, node.module))
            elif isinstance(node, ast.Import):
                out += [(path, a.name) for a in node.names]
    return out


def composition(module: str) -> bool:
    return module.startswith("epu.") and not module.startswith(("epu.common", "epu.services"))


def test_common_imports_no_service_and_no_composition() -> None:
    bad = [(str(p.relative_to(ROOT)), m) for p, m in imports(ROOT / "common")
           if m.startswith("epu.services") or composition(m) or m in ("epu",)]
    assert bad == []


def test_services_import_neither_each_other_nor_the_composition_layer() -> None:
    bad = []
    for name in SERVICES:
        for p, m in imports(ROOT / "services" / name):
            other = m.startswith("epu.services.") and not m.startswith(f"epu.services.{name}")
            if other or composition(m) or m == "epu":
                bad.append((str(p.relative_to(ROOT)), m))
    assert bad == []


def test_no_generic_top_level_import() -> None:
    """Everything is imported under the ``epu`` name (installed, there is no ``common`` package)."""
    bad = [(str(p.relative_to(ROOT)), m)
           for folder in ("common", "services", "epu", "tests", "bench")
           for p, m in imports(ROOT / folder) if m.split(".")[0] in ("common", "services")]
    assert bad == []


def test_epu_run_decision_imports_no_other_roles_libraries() -> None:
    """What ``epu run decision`` loads (the CLI's parser, then the decision app) stays the
    decision engine's own: another role's libraries would be megabytes of a 100 MB budget
    (issue 15 item 4), and a control host need not have them installed."""
    import subprocess
    import sys

    code = ("import sys; from epu.cli import build_parser; build_parser(); "
            "import epu.services.decision.app; print(' '.join(sorted(sys.modules)))")
    loaded = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                timeout=60).stdout.split())
    assert "epu.services.decision.app" in loaded
    other_roles = {"libcloud", "fastapi", "uvicorn", "starlette", "httpx", "matplotlib", "numpy", "hypothesis",
                   "epu.services.ctxbroker.app", "epu.services.provisioner.app", "epu.services.sensor.app"}
    assert loaded & other_roles == set()
