"""Running batch-system commands: the only place the sensor starts a process.

Why here and nowhere else: one place guarantees there is never a shell (argument lists only),
there is always a timeout, and the native stdout/stderr/exit code always come back so the
operator sees the batch system's own words in the command result.
"""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

log = logging.getLogger("epu.sensor.runner")


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def text(self) -> str:
        """Native output for the result event: stdout and stderr, trimmed."""
        parts = [p.strip() for p in (self.stdout, self.stderr) if p and p.strip()]
        return "\n".join(parts)[-4000:]


class CommandRunner:
    """Runs argument lists with a timeout. Tests substitute ``FakeRunner``-style objects with
    the same ``run`` signature to replay captured outputs."""

    def __init__(self, timeout: float = 60.0, env: dict[str, str] | None = None) -> None:
        self.timeout = timeout
        self.env = env

    def run(self, argv: Sequence[str], timeout: float | None = None) -> CommandResult:
        args = tuple(str(a) for a in argv)
        if not args or any("\x00" in a for a in args):
            raise ValueError(f"bad command line {args!r}")
        env = None if self.env is None else {**os.environ, **self.env}
        try:
            proc = subprocess.run(list(args), capture_output=True, text=True, shell=False,
                                  timeout=timeout or self.timeout, env=env, stdin=subprocess.DEVNULL,
                                  errors="replace")
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
            log.warning("batch command timed out", extra={"argv": list(args), "timeout": timeout or self.timeout})
            return CommandResult(args, -1, out, err + f"\n(timed out after {timeout or self.timeout:g}s)",
                                 timed_out=True)
        except FileNotFoundError as exc:
            return CommandResult(args, 127, "", f"{args[0]}: command not found ({exc.strerror})")
        except PermissionError as exc:
            return CommandResult(args, 126, "", f"{args[0]}: permission denied ({exc.strerror})")
        return CommandResult(args, proc.returncode, proc.stdout, proc.stderr)
