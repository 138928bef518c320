"""Every ``epu`` command's ``--help`` reads like a manual page: what it does, its options each
explained, examples, its exit status, and where its files and environment come from."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from epu.cli import build_parser, walk_parsers

COMMANDS = [(path, p) for path, p in walk_parsers(build_parser())]
IDS = [" ".join(path) or "epu" for path, _p in COMMANDS]
SKIP_ACTIONS = (argparse._HelpAction, argparse._SubParsersAction, argparse._VersionAction)


def test_the_walk_finds_every_command() -> None:
    words = {" ".join(path) for path, _p in COMMANDS}
    assert {"run", "status", "instances list", "policy set", "ctx create", "config check",
            "deploy rabbitmq-definitions", "sensor snapshot", "record", "tap"} <= words
    assert len(COMMANDS) >= 30


@pytest.mark.parametrize(("path", "parser"), COMMANDS, ids=IDS)
def test_help_is_a_manual_page(path: tuple[str, ...], parser: argparse.ArgumentParser) -> None:
    text = parser.format_help()
    lower = text.lower()
    assert len((parser.description or "").split()) >= 12, f"{IDS[COMMANDS.index((path, parser))]}: a real description"
    assert "example" in lower, "an examples section"
    assert "exit status" in lower, "the exit status"
    for action in parser._actions:
        if not isinstance(action, SKIP_ACTIONS):
            assert action.help and len(action.help) >= 12, f"option {action.option_strings or action.dest} explained"
        if action.dest == "config" and (action.help or "").startswith("TOML config file"):
            assert "environment" in lower and "EPU_CONFIG" in text, "files and environment"


def test_help_of_a_subcommand_from_the_command_line() -> None:
    """What an operator types: ``epu status --help`` exits 0 and prints the manual."""
    out = subprocess.run([sys.executable, "-m", "epu", "status", "--help"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert "Examples:" in out.stdout and "Exit status:" in out.stdout and "epu.status.DOMAIN" in out.stdout
