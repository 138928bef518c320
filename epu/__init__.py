"""EPU, an elastic manager for batch clusters.

Installed, everything lives under this one name: ``epu.common`` (the contract, runtime and
config; the folder ``common/`` of the source tree), ``epu.services`` (the four services;
``services/``) and this package itself, the composition layer above them (the ``epu`` CLI,
the demo, the recorder and the simulator), which wires services together. ``common`` imports
no service; no service imports this layer.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("epu")
except PackageNotFoundError:  # running from a tree that was never installed
    __version__ = "0+unknown"
