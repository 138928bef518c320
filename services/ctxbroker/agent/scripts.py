"""Run the administrator's scripts: every executable file of a directory, in name order.

Never through a shell: each script is exec'd directly with an argument-less argv and the
node's fields in environment variables (``EPU_NODE_HOSTNAME`` ...), so a hostile field
value can never become a command. A failing script is logged and the next one runs; the
agent does not stop applying the list because one hook broke.
"""

from __future__ import annotations

import logging
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("epu.ctxagent.scripts")

HOOKS = ("init", "add-node", "delete-node", "restart")
#: Variables of the agent's own environment passed through to scripts.
PASS_ENV = ("PATH", "LANG", "LC_ALL", "HOME", "PYTHONPATH", "TZ")


@dataclass(frozen=True)
class ScriptResult:
    path: str
    returncode: int
    output: str


def hook_dir(scripts_dir: str | Path, hook: str) -> Path:
    """``<scripts_dir>/<hook>.d`` (e.g. add-node.d)."""
    return Path(scripts_dir) / f"{hook}.d"


def scripts_of(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    return [p for p in sorted(directory.iterdir())
            if p.is_file() and os.access(p, os.X_OK) and not p.name.startswith(".")
            and not p.name.endswith(("~", ".disabled"))]


def run_hook(scripts_dir: str | Path, hook: str, env: dict[str, str], timeout: float = 120.0) -> list[ScriptResult]:
    base = {k: os.environ[k] for k in PASS_ENV if k in os.environ}
    full = {**base, **env, "EPU_HOOK": hook}
    results = []
    for script in scripts_of(hook_dir(scripts_dir, hook)):
        try:
            proc = subprocess.run([str(script)], env=full, capture_output=True, text=True, timeout=timeout,
                                  shell=False, stdin=subprocess.DEVNULL)
            res = ScriptResult(str(script), proc.returncode, (proc.stdout + proc.stderr)[-4000:])
        except subprocess.TimeoutExpired:
            res = ScriptResult(str(script), -1, f"timed out after {timeout}s")
        except OSError as exc:
            res = ScriptResult(str(script), -1, f"cannot run: {exc}")
        if res.returncode != 0:
            log.error("context script failed", extra={"script": res.path, "hook": hook,
                                                      "returncode": res.returncode, "output": res.output})
        results.append(res)
    return results
