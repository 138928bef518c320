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
