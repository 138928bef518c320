"""The ports are what the services call, and every implementation offers all of it.

* Each implementation (SQL and the simulator's in-memory one) has every method its Protocol
  names, with the Protocol's parameters (names, kinds, which have defaults): the engine and the
  provisioner call only those, so a method missing from the simulator's store could not hide
  behind a probe.
* No module of ``services/`` asks a store or a lease keeper whether it has a method
  (``getattr``/``hasattr`` on ``store``/``leases``): an optional branch only one implementation
  takes is code the simulator runs and production does not, or the reverse.
* The provisioner's cloud port (``cloud.Site``) likewise: the libcloud adapter declares every
  member, and the provisioner never probes a site (issue 33: ``idempotent_create``, ``sizes`` and
  ``deployment`` were ``getattr`` probes).
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import Protocol

import pytest
from epu.services.decision.lease import Leases
from epu.services.decision.ports import DecisionLeases, DecisionStore
from epu.services.decision.store import Store as SqlDecisionStore
from epu.services.provisioner.cloud import LibcloudSite, Site
from epu.services.provisioner.ports import ProvisionerStore
from epu.services.provisioner.store import Store as SqlProvisionerStore

from epu.sim.decision_memstore import MemoryLeases
from epu.sim.decision_memstore import MemoryStore as MemoryDecisionStore
from epu.sim.provisioner_memstore import MemoryStore as MemoryProvisionerStore

ROOT = Path(__file__).resolve().parents[2]

IMPLEMENTATIONS = [
    (DecisionStore, SqlDecisionStore), (DecisionStore, MemoryDecisionStore),
    (DecisionLeases, Leases), (DecisionLeases, MemoryLeases),
    (ProvisionerStore, SqlProvisionerStore), (ProvisionerStore, MemoryProvisionerStore),
    (Site, LibcloudSite),
]


def port_methods(port: type) -> dict[str, inspect.Signature]:
    return {name: inspect.signature(fn) for name, fn in vars(port).items()
            if inspect.isfunction(fn) and not name.startswith("_")}


def shape(sig: inspect.Signature) -> list[tuple[str, object, bool]]:
    """What a caller relies on: each parameter's name, kind and whether it may be left out."""
    return [(p.name, p.kind, p.default is not inspect.Parameter.empty) for p in sig.parameters.values()]


@pytest.mark.parametrize(("port", "impl"), IMPLEMENTATIONS, ids=lambda x: x.__module__.split(".")[-1] + "." + x.__name__)
def test_every_implementation_offers_every_method_of_its_port(port: type[Protocol], impl: type) -> None:
    methods = port_methods(port)
    assert methods, f"{port.__name__} names no method"
    missing = [m for m in methods if not callable(getattr(impl, m, None))]
    assert missing == [], f"{impl.__module__}.{impl.__name__} lacks {missing}"
    differ = {m: (shape(sig), shape(inspect.signature(getattr(impl, m))))
              for m, sig in methods.items() if shape(sig) != shape(inspect.signature(getattr(impl, m)))}
    assert differ == {}, f"{impl.__name__}: parameters differ from {port.__name__}: {differ}"


def test_the_ports_name_every_method_the_engine_and_the_provisioner_call() -> None:
    """``self.store.X`` / ``self.leases.X`` (or ``store.X`` of a function given the store) in the
    engine, the modules it hands its store to, and the provisioner: each X is the port's."""
    decision = {"store": DecisionStore, "leases": DecisionLeases}
    calls = {ROOT / f"services/decision/{name}.py": decision
             for name in ("engine", "health", "instance_events", "node_results", "control")}
    for name in ("provisioner", "terminations"):
        calls[ROOT / f"services/provisioner/{name}.py"] = {"store": ProvisionerStore}
    unnamed = []
    for path, ports in calls.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Attribute):
                continue
            owner = node.value
            if isinstance(owner, ast.Attribute) and isinstance(owner.value, ast.Name) and owner.value.id == "self":
                name, shown = owner.attr, f"self.{owner.attr}"
            elif isinstance(owner, ast.Name):
                name, shown = owner.id, owner.id
            else:
                continue
            if name in ports and node.attr not in port_methods(ports[name]):
                unnamed.append(f"{path.name}:{node.lineno} {shown}.{node.attr}")
    assert unnamed == []


def probes(tree: ast.AST) -> list[int]:
    """Lines of ``getattr``/``hasattr`` calls whose object is a store or a lease keeper."""
    out = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
                and node.args):
            target = node.args[0]
            name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
            if name in ("store", "leases") or name.endswith(("_store", "_leases")):
                out.append(node.lineno)
    return out


def test_no_service_probes_its_store_for_a_method() -> None:
    found = [f"{p.relative_to(ROOT)}:{line}" for p in sorted((ROOT / "services").rglob("*.py"))
             for line in probes(ast.parse(p.read_text()))]
    assert found == []


def test_the_probe_finder_finds_a_probe() -> None:
    """The scan above would see the probes this suite exists to keep out."""
    code = "def f(self, store):\n    a = getattr(self.store, 'x', None)\n    b = hasattr(store, 'y')\n    c = getattr(self.leases, 'z', None)\n"
    assert probes(ast.parse(code)) == [2, 3, 4]
    assert probes(ast.parse("getattr(site, 'unchanged', None)")) == []


def test_the_libcloud_site_declares_every_member_of_the_site_port(tmp_path: Path) -> None:
    """Attributes and properties too (the provisioner reads ``deployment`` and ``idempotent_create``
    of every site, unprobed)."""
    from epu.common.config.provisioner import SiteConfig
    from epu.services.provisioner.sim import SimulatedNodeDriver

    site = LibcloudSite("sim", SiteConfig.model_validate({"driver": "epu-sim", "image": "i", "size": "s"}),
                        SimulatedNodeDriver(path=str(tmp_path / "cloud.db")))
    declared = set(Site.__annotations__) | {n for n, v in vars(Site).items() if isinstance(v, property)}
    assert declared >= {"name", "config", "deployment", "idempotent_create"}
    assert [m for m in sorted(declared) if not hasattr(site, m)] == []


def site_probes(tree: ast.AST) -> list[int]:
    """Lines of ``getattr``/``hasattr`` calls whose object is a site (``site``, ``s``, ``*_site``, ``sites[...]``)."""
    out = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
                and node.args):
            target = node.args[0]
            if isinstance(target, ast.Subscript):
                target = target.value
            name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
            if name in ("site", "s", "sites") or name.endswith("_site"):
                out.append(node.lineno)
    return out


def test_the_provisioner_never_probes_a_site() -> None:
    found = [f"{p.relative_to(ROOT)}:{line}" for p in sorted((ROOT / "services" / "provisioner").glob("*.py"))
             for line in site_probes(ast.parse(p.read_text()))]
    assert found == []
    code = ("a = getattr(site, 'sizes', None)\nb = {d for s in x if (d := getattr(s, 'deployment', None))}\n"
            "c = hasattr(self.sites['x'], 'y')\nd = getattr(driver, 'type', '')\n")
    assert sorted(site_probes(ast.parse(code))) == [1, 2, 3]
