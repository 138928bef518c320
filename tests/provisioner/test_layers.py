"""The provisioner's layers, checked on the source (issue 33, design rule 12): one module calls a
site's destroy, and the pure judgement of a listing imports no database library."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROVISIONER = ROOT / "services" / "provisioner"

#: The one door to destroy.
DOOR = "terminations.py"
#: ``Site.terminate``'s libcloud adapter: the site's own implementation calls its driver's destroy.
ADAPTER = ("cloud.py", "LibcloudSite", "terminate")


def destroy_calls(path: Path) -> list[tuple[str, int, str]]:
    """Calls of ``<anything>.terminate(...)`` or ``<anything>.destroy_node(...)`` in ``path``, with the
    class and function they are in."""
    out: list[tuple[str, int, str]] = []

    def visit(node: ast.AST, where: tuple[str, ...]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                visit(child, (*where, child.name))
                continue
            if (isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute)
                    and child.func.attr in ("terminate", "destroy_node")):
                out.append((".".join(where), child.lineno, child.func.attr))
            visit(child, where)

    visit(ast.parse(path.read_text(), str(path)), ())
    return out


def test_only_terminations_calls_a_sites_destroy() -> None:
    """Every destroy goes through ``Terminations.destroy`` (its proof recorded); the only other
    call is the libcloud adapter's own ``terminate`` calling its driver."""
    bad = []
    for path in sorted(PROVISIONER.glob("*.py")):
        for where, line, attr in destroy_calls(path):
            if path.name == DOOR and where == "Terminations.destroy" and attr == "terminate":
                continue
            if (path.name, *where.split(".")) == ADAPTER and attr == "destroy_node":
                continue
            bad.append(f"{path.name}:{line} {where} calls .{attr}()")
    assert bad == []
    door = destroy_calls(PROVISIONER / DOOR)
    assert [(w, a) for w, _, a in door] == [("Terminations.destroy", "terminate")]


def test_the_check_sees_a_destroy_outside_the_door(tmp_path: Path) -> None:
    """The check above would see a new door: a call of a site's terminate anywhere else."""
    rogue = tmp_path / "provisioner.py"
    rogue.write_text("class Provisioner:\n    def sweep(self, site, cid):\n        site.terminate(cid)\n"
                     "def helper(driver, node):\n    return driver.destroy_node(node)\n")
    assert destroy_calls(rogue) == [("Provisioner.sweep", 3, "terminate"), ("helper", 5, "destroy_node")]


def test_the_pure_reconcile_imports_no_sqlalchemy() -> None:
    """``reconcile`` (and ``unstarted``, ``states``, the record types) are pure: importing them
    loads no database library (they used to import the SQL store for its record types)."""
    code = ("import sys; import epu.services.provisioner.reconcile, epu.services.provisioner.unstarted, "
            "epu.services.provisioner.records; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'sqlalchemy'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"
