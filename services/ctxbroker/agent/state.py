"""The agent's persisted state: last applied entry id, current members, init/restart flags.

Written atomically (temp file, fsync, rename) after every entry, so a restart resumes after
the last entry whose scripts finished and never re-applies earlier ones.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class AgentState:
    context_uri: str = ""
    last_id: int = 0
    init_done: bool = False
    restart_pending: bool = False
    members: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> AgentState:
        if not path.exists():
            return cls()
        doc = json.loads(path.read_text())
        return cls(**{k: doc[k] for k in ("context_uri", "last_id", "init_done", "restart_pending", "members")
                      if k in doc})

    def save(self, path: Path) -> None:
        atomic_write(path, json.dumps(self.__dict__, sort_keys=True, separators=(",", ":")))  # C encoder: fast


def atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
