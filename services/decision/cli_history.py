"""``epu policy history DOMAIN``: every operator change of a domain, who made it, when, applied or
refused and why.

Why from the engine's retained status: an operator's install reaches the broker only, never the
engine's store. The engine keeps each change's outcome with who asked and what (the store's
``decision_changes``) and carries the newest ones in the ``EngineStatus`` it retains per domain
(``changes``), so this reads one message, like ``epu status``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from epu.common.cliargs import RAW, add_config_arg, load_or_exit


def describe(request: dict[str, Any]) -> str:
    """The change as asked, as ``policy set`` words (``params`` flattened)."""
    words = [f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in request.items() if k != "params"]
    words += [f"{k}={v}" for k, v in (request.get("params") or {}).items()]
    return " ".join(words) or "(nothing)"


def render(entries: list[Any]) -> list[str]:
    lines = []
    for e in entries:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(e.at))
        verdict = f"applied v{e.version}" if e.applied and e.version is not None else \
            "applied (no change)" if e.applied else "REFUSED"
        lines.append(f"{when}Z  {e.operator or '?':<12} {verdict:<20} {describe(e.request)}"
                     + (f"  — {e.reason}" if e.reason else ""))
    return lines


def cmd_history(args: argparse.Namespace) -> int:
    from epu.common.retained import engine_statuses
    from epu.common.topology import check_name

    try:
        check_name(args.domain)
    except ValueError as exc:
        print(f"epu policy history: {exc}", file=sys.stderr)
        return 2
    from epu.services.decision.cli import unknown_domain

    config = load_or_exit(args.config)
    problem = unknown_domain(config, args.domain)
    if problem is not None:
        print(f"epu policy history: {problem}", file=sys.stderr)
        return 2
    found, why = engine_statuses(config.broker_obj(), [args.domain])
    status = found.get(args.domain)
    if status is None:
        print(f"epu policy history: {args.domain}: {why.get(args.domain, 'no engine status')}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps([e.model_dump(mode="json") for e in status.changes], indent=2))
        return 0
    if not status.changes:
        print(f"{args.domain}: no operator change recorded (the configuration file's, version "
              f"{status.policy_version}, is in force)")
        return 0
    for line in render(status.changes):
        print(line)
    return 0


def add_parser(psub: argparse._SubParsersAction) -> None:
    s = psub.add_parser("history", help="every operator change of a domain: who, when, applied or refused, why",
                        formatter_class=RAW,
                        description="List DOMAIN's operator changes (policy set, pause, resume, terminate\n"
                                    "requests that retire instances...), oldest first: when the engine answered,\n"
                                    "who asked, applied (with the version it made) or REFUSED (with the reason),\n"
                                    "and what was asked. Read from the engine's retained status over the\n"
                                    "broker (the newest 50 changes); no access to the engine's store needed.",
                        epilog="Example: epu policy history alpha -c /etc/epu/operator.toml\n"
                               "Exit status: 0 listed; 1 no engine status for the domain (engine not running,\n"
                               "or RabbitMQ refused or cannot be reached); 2 bad domain name, unknown domain\n"
                               "(not in the configuration's [domains], or not in the engine's store where\n"
                               "this host can read it), or bad configuration.")
    s.add_argument("domain", help="the domain, as named under [domains] in the configuration")
    s.add_argument("--json", action="store_true", help="print the entries as a JSON list")
    add_config_arg(s)
    s.set_defaults(func=cmd_history)
