"""Argument helpers every ``epu`` subcommand shares (config option, config loading, help format).

They live in ``common`` so a service's own CLI module can use them without importing the
composition layer (``epu``) above it.

Which configuration a command uses: ``-c FILE``, else the file named by ``EPU_CONFIG``, else
``/etc/epu/epu.toml`` if it exists. A command that needs one and finds none says so and stops
(exit 2) rather than running on built-in defaults (which once meant: tap the guest account on
vhost ``/``, create ``./epu-provisioner.db``, report a domain as unknown).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable
from pathlib import Path

from epu.common.config import ConfigError, EpuConfig, check_config, load_config

RAW = argparse.RawDescriptionHelpFormatter
CONFIG_ENV = "EPU_CONFIG"
DEFAULT_CONFIG = "/etc/epu/epu.toml"
#: The broker URL (password redacted) of the config loaded last, for error messages.
loaded_broker_url: str | None = None


def nonneg_int(text: str) -> int:
    """An argparse type: a whole number ≥ 0 (a negative count is a usage error, one line)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def nonneg_float(text: str) -> float:
    """An argparse type: seconds ≥ 0 (finite)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def validation_line(exc: Exception) -> str:
    """A pydantic ValidationError as one line: each field with what is wrong and the value given
    (never the pydantic dump of several lines and a URL)."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return str(exc)
    parts = []
    for err in errors():
        key = ".".join(str(p) for p in err["loc"]) or "value"
        msg = str(err["msg"]).removeprefix("Value error, ")
        got = err.get("input")
        shown = "" if err["type"] in ("missing", "extra_forbidden") or isinstance(got, dict | list) else f" (got {got!r})"
        parts.append(f"{key}: {msg}{shown}")
    return "; ".join(parts)


def add_config_arg(p: argparse.ArgumentParser, *, optional_note: str | None = None) -> None:
    note = optional_note or "required"
    p.add_argument("-c", "--config", metavar="FILE",
                   help=f"TOML config file (default: ${CONFIG_ENV}, else {DEFAULT_CONFIG} if it exists; {note}); "
                        "EPU_SECTION__KEY variables override it")


def config_path(arg: str | None, *, required: bool = True) -> str | None:
    """The config file to use (see the module docstring); None when there is none and it is
    not ``required``; exit 2 with what to do when it is."""
    if arg:
        return arg
    env = os.environ.get(CONFIG_ENV)
    if env:
        return env
    if Path(DEFAULT_CONFIG).exists():
        return DEFAULT_CONFIG
    if required:
        print(f"epu: no configuration: give -c FILE, set {CONFIG_ENV}=FILE, or create {DEFAULT_CONFIG} "
              "(start from deploy/examples/epu.toml; `epu deploy path` shows where it is)", file=sys.stderr)
        raise SystemExit(2)
    return None


def load_or_exit(path: str | None, *, services: Iterable[str] = (), required: bool = True) -> EpuConfig:
    """Find, load and validate the config (schema, then the checks of ``services``); on any
    problem print one line per problem and exit 2."""
    global loaded_broker_url
    resolved = config_path(path, required=required)
    try:
        config = load_config(resolved)
        problems = check_config(config, services) if services else []
    except ConfigError as exc:
        print(f"epu: bad configuration:\n{exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if problems:
        print("epu: bad configuration:\n" + "\n".join(f"{resolved}: {p}" for p in problems), file=sys.stderr)
        raise SystemExit(2)
    try:
        loaded_broker_url = config.broker_obj().redacted_url()
    except Exception:  # an unparsable URL is reported when it is used
        loaded_broker_url = None
    return config
