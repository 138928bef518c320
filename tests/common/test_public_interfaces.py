"""EPU uses its dependencies' public interfaces: a private method (py-amqp's ``_basic_publish``,
uvicorn's ``_write_whole``) changes without notice and breaks silently on an upgrade. Those two
must never come back, and nothing private is read off an imported third-party module."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: Private internals of dependencies that were once used (issue 14).
FORBIDDEN = {"_basic_publish", "_write_whole"}

#: Reviewed module-level names: public in all but name.
ALLOWED = {("argparse", "_SubParsersAction"), ("os", "_Environ"), ("os", "_exit")}


def _modules(tree: ast.Module) -> dict[str, str]:
    """Local name → imported module, for non-EPU imports."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if not a.name.startswith("epu"):
                    out[a.asname or a.name.split(".")[0]] = a.name
    return out


def test_no_private_internals_of_dependencies() -> None:
    bad = []
    for top in ("common", "services", "epu"):
        for path in sorted((ROOT / top).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            modules = _modules(tree)
            for node in ast.walk(tree):
                if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
                    continue
                where = f"{path.relative_to(ROOT)}:{node.lineno} .{node.attr}"
                if node.attr in FORBIDDEN:
                    bad.append(where)
                elif isinstance(node.value, ast.Name) and node.value.id in modules \
                        and (node.value.id, node.attr) not in ALLOWED:
                    bad.append(f"{where} of module {modules[node.value.id]}")
    assert bad == [], "use a public interface"
