"""``epu``: the one command for operators and services.

Subcommands come from small modules so a reader finds each where its service lives:
``epu.cli_core`` (run, demo, tap, config, deploy), ``epu.cli_record`` (record) and
``services.<name>.cli`` (sensor; policy and status; instances; ctx). Each module exposes ``register(subparsers)``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Iterator

from epu import __version__

COMMAND_MODULES = (
    "epu.cli_core",
    "epu.cli_record",
    "epu.cli_cost",
    "epu.cli_dead",
    "epu.cli_slurm",
    "epu.services.sensor.cli",
    "epu.services.decision.cli",
    "epu.services.provisioner.cli",
    "epu.services.ctxbroker.cli",
    "epu.sim.cli",
    "epu.simulate.cli",
    "epu.cli_slurm_conf",  # last: adds `conf` to the `epu slurm` group, whoever made it
)

DESCRIPTION = """\
EPU — an elastic manager for batch clusters.

Sensors on batch head nodes (Torque, Slurm, HTCondor) publish queue and node state over
AMQP; a decision engine runs a policy per domain; a libcloud provisioner launches and
terminates instances; a context broker keeps every node's view of the cluster current.
"""

EPILOG = """\
Examples:
  epu config check -c /etc/epu/epu.toml          # validate before starting anything
  epu run decision -c /etc/epu/epu.toml          # one service in the foreground
  epu status alpha --watch                       # a domain, whole and live
  epu demo --jobs 4                              # everything in one process, no setup
  epu COMMAND --help                             # each command's manual

Configuration: one TOML file: -c FILE, else $EPU_CONFIG, else /etc/epu/epu.toml; a command
that needs one and finds none says so and stops. EPU_<SECTION>__<KEY> variables override it.
Exit status: 0 success, 1 runtime failure (one line saying what failed: RabbitMQ refused the
login, a file cannot be read, ...), 2 bad usage or bad configuration (one line per problem).
Docs: README.md, docs/deploy.md (an operator's guide), docs/messages.md (the wire contract),
docs/ for each service.
"""

FILES_ENV = """\
Files and environment: the configuration is -c FILE, else $EPU_CONFIG, else /etc/epu/epu.toml;
EPU_<SECTION>__<KEY> variables override its keys (e.g. EPU_BROKER__URL for the broker URL with
this user's credentials), and an error names the variable that set a bad value."""


def walk_parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[
        tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every parser of the command tree with its command words (the top one first)."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from walk_parsers(sub, (*path, name))


def _add_files_section(parser: argparse.ArgumentParser) -> None:
    """Give every command that reads the services' config a FILES AND ENVIRONMENT section, in one
    wording, unless its own help already says where its files and variables come from."""
    for path, p in walk_parsers(parser):
        reads_config = any(a.dest == "config" and (a.help or "").startswith("TOML config file") for a in p._actions)
        if path and reads_config and "environment" not in (p.epilog or "").lower():
            p.epilog = f"{p.epilog.rstrip()}\n\n{FILES_ENV}" if p.epilog else FILES_ENV


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="epu", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # that service has no CLI yet
                continue
            raise
        module.register(sub)
    _add_files_section(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        from epu.errors import explain

        known = explain(exc)
        if known is None:
            raise  # a bug: keep the traceback
        status, message = known
        print(f"epu: {message}", file=sys.stderr)
        return status


if __name__ == "__main__":
    sys.exit(main())
