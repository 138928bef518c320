"""The layers of the design brief, checked on the source: ``common`` (contract, runtime,
config) imports no service and not the composition layer; a service imports no other service
and not the composition layer (``epu`` itself: CLI, demo, recorder, simulator). Within the
composition layer its packages (``epu/sim``, ``epu/simulate``, ``epu/workloads``) import each
other in one direction only; and no service module exists for the simulators alone (what only
they use lives in ``epu/sim``, so the services hold what production runs)."""

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


def module_name(path: Path) -> str:
    """The installed name of a source file (``services/x/y.py`` → ``epu.services.x.y``)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[0] in ("common", "services"):
        parts = ("epu", *parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def references(path: Path) -> set[str]:
    """Modules a file imports (anywhere in it, a function's lazy import included) or names as a
    string (``epu/cli.py`` loads each role's CLI module by name)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("epu."):
            out.add(node.value)
    return out


def code_files() -> list[Path]:
    """The project's code (not its tests): what a service module's users are counted in."""
    return [p for folder in ("common", "services", "epu", "bench") for p in (ROOT / folder).rglob("*.py")]


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The cycles of a directed graph, each once (as found by a depth-first search)."""
    found: list[list[str]] = []
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                found.append([*path[path.index(nxt):], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    return found


def composition_packages() -> dict[str, set[str]]:
    """Package → the other composition packages it imports (``epu.sim`` → {``epu.workloads``})."""
    packages = sorted(f"epu.{d.name}" for d in (ROOT / "epu").iterdir() if (d / "__init__.py").exists())
    edges: dict[str, set[str]] = {p: set() for p in packages}
    for pkg in packages:
        for path in (ROOT / pkg.replace(".", "/")).rglob("*.py"):
            for m in references(path):
                edges[pkg].update(o for o in packages if o != pkg and (m == o or m.startswith(o + ".")))
    return edges


def test_no_import_cycle_between_simulator_packages() -> None:
    """``epu/simulate`` builds on ``epu/sim`` (processes, bus, clouds, the in-memory stores);
    ``epu/sim`` must not import ``epu/simulate`` back: a cycle makes neither readable alone."""
    edges = composition_packages()
    assert "epu.sim" in edges and "epu.simulate" in edges
    assert "epu.sim" in edges["epu.simulate"]
    assert cycles(edges) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


SIMULATORS = ("epu.sim", "epu.simulate")


def test_no_service_module_only_the_simulators_use() -> None:
    """A module of ``services/`` that only ``epu/sim`` or ``epu/simulate`` imports is simulator
    code inside a service (the in-memory stores were): it belongs under ``epu/sim``. The
    documented fake sites (``sensor/simulated.py``, ``provisioner/sim.py``) are the services'
    own, used by ``make run`` through the services' factories, so they pass."""
    users: dict[str, set[str]] = {}
    for path in code_files():
        me = module_name(path) if path.parts[len(ROOT.parts)] != "bench" else f"bench.{path.stem}"
        for m in references(path):
            if m.startswith("epu.services.") and m != me:
                users.setdefault(m, set()).add(me)
    only_sim = {}
    for path in (ROOT / "services").rglob("*.py"):
        name = module_name(path)
        who = users.get(name, set())
        if who and all(any(u == s or u.startswith(s + ".") for s in SIMULATORS) for u in who):
            only_sim[name] = sorted(who)
    assert only_sim == {}
