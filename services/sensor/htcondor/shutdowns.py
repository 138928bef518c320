"""The masters this sensor told to shut down peacefully, kept across sensor restarts.

Why it must last: a node's removal is confirmed by its master having exited, and once it has, its
ad is gone from the collector — the address the master had is the only way left to ask it. A
sensor restarted after the master exited would otherwise see "no ads" (unknown) forever. Kept as
a small JSON file next to the command log (node → the master ad in old ClassAd text), rewritten
atomically on each change; ``path=None`` keeps it in memory.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger("epu.sensor.htcondor")


class ShutdownMemory:
    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path else None
        self._ads: dict[str, Any] = {}
        if self.path is not None and self.path.exists():
            self._load(self.path)

    def _load(self, path: Path) -> None:
        import classad2  # noqa: PLC0415 — the bindings' ClassAd library, imported with the backend

        try:
            stored = json.loads(path.read_text())
            self._ads = {str(node): classad2.parseOne(text) for node, text in stored.items()}
        except Exception as exc:  # a damaged file: start empty, say so (nodes read as unknown until seen)
            log.error("cannot read the remembered HTCondor shutdowns; starting without them",
                      extra={"path": str(path), "error": f"{type(exc).__name__}: {exc}"})
            self._ads = {}

    def get(self, node: str) -> Any | None:
        return self._ads.get(node)

    def __contains__(self, node: str) -> bool:
        return node in self._ads

    def __setitem__(self, node: str, ad: Any) -> None:
        self._ads[node] = ad
        self._save()

    def pop(self, node: str, default: Any = None) -> Any:
        if node not in self._ads:
            return default
        ad = self._ads.pop(node)
        self._save()
        return ad

    def _save(self) -> None:
        if self.path is None:
            return
        text = {node: ad.printOld() if hasattr(ad, "printOld") else str(ad) for node, ad in self._ads.items()}
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(text, sort_keys=True))
        os.replace(tmp, self.path)
