"""Packages and data files of the ``epu`` distribution (the rest of the metadata is in pyproject.toml).

The source tree keeps the user's layout (``common/`` and ``services/`` at the top); installed,
they are ``epu.common`` and ``epu.services`` beside the composition layer ``epu/``, so no
generic top-level name such as ``common`` lands in site-packages. Computed rather than listed
so a new subpackage is never left out of the wheel.

``docs/*.md`` is installed as ``epu/docs/`` (what the systemd units' ``Documentation=`` points to,
once copied to ``/usr/share/doc/epu``). ``deploy/`` is installed as ``epu/deploy/``: what the code reads at run time (the cloud-init
template the provisioner renders) and what an operator installs from it (context scripts,
systemd units, RabbitMQ definitions, example configs; ``epu deploy path`` prints where). The
code finds it at the same place relative to itself in a checkout and in a wheel.
"""

from pathlib import Path

from setuptools import find_packages, setup

ROOTS = {"epu": "epu", "epu.common": "common", "epu.services": "services", "epu.deploy": "deploy",
         "epu.docs": "docs"}
HERE = Path(__file__).parent

packages = ["epu", *(f"epu.{p}" for p in find_packages("epu"))]
for name, folder in ROOTS.items():
    if name not in ("epu", "epu.deploy", "epu.docs"):
        packages += [name, *(f"{name}.{p}" for p in find_packages(folder))]

# Each deploy/ file belongs to the deepest "package" holding it: folders whose names are Python
# identifiers (deploy/systemd) are listed as packages of their own (setuptools insists), the
# others (deploy/cloud-init, deploy/ctx-scripts/...) are data of the nearest one above.
package_data: dict[str, list[str]] = {"epu.deploy": []}
for path in sorted((HERE / "deploy").rglob("*")):
    if not path.is_file() or "__pycache__" in path.parts or path.name.endswith((".pyc", "~")):
        continue
    parts = path.relative_to(HERE / "deploy").parts
    depth = 0
    while depth < len(parts) - 1 and parts[depth].isidentifier():
        depth += 1
    package = ".".join(("epu.deploy", *parts[:depth]))
    package_data.setdefault(package, []).append("/".join(parts[depth:]))
packages += sorted(package_data)
# The guides (docs/*.md) are installed as epu/docs/, beside epu/deploy/: the systemd units'
# Documentation= names them where docs/deploy.md's install step copies them (/usr/share/doc/epu).
package_data["epu.docs"] = sorted(p.name for p in (HERE / "docs").glob("*.md"))
packages.append("epu.docs")

setup(packages=packages, package_dir=ROOTS, package_data=package_data)
