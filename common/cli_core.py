"""Core subcommands: ``run``, ``demo``, ``tap``, ``config check``."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from typing import Any

from common.config import ConfigError, EpuConfig, load_config
from common.logs import setup_logging

#: service name → "module:function" building it from an EpuConfig (see common.runtime.Runnable)
SERVICES = {
    "sensor": "services.sensor.app:build_service",
    "decision": "services.decision.app:build_service",
    "provisioner": "services.provisioner.app:build_service",
    "ctxbroker": "services.ctxbroker.app:build_service",
}

RAW = argparse.RawDescriptionHelpFormatter


def add_config_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--config", metavar="FILE",
                   help="TOML config file (default: built-in defaults; EPU_* variables override)")


def load_or_exit(path: str | None) -> EpuConfig:
    try:
        return load_config(path)
    except ConfigError as exc:
        print(f"epu: bad configuration:\n{exc}", file=sys.stderr)
        raise SystemExit(2) from None


def _builder(service: str) -> Any:
    module, func = SERVICES[service].split(":")
    return getattr(importlib.import_module(module), func)


# ---------------------------------------------------------------- run
def cmd_run(args: argparse.Namespace) -> int:
    config = load_or_exit(args.config)
    setup_logging(config.logging.level, config.logging.json_format or args.json_logs)
    service = _builder(args.service)(config)
    service.install_signal_handlers()
    service.run()
    return 0


# ---------------------------------------------------------------- tap
def format_event(envelope: Any, message: Any, routing_key: str) -> str:
    ts = time.strftime("%H:%M:%S", time.localtime(envelope.timestamp))
    body = message.model_dump(mode="json")
    short = {k: v for k, v in body.items() if v not in (None, "", [], {}) and k not in ("jobs", "nodes")}
    if "jobs" in body:
        short["queued"] = sum(j["count"] for j in body["jobs"] if j["state"] == "queued")
        short["nodes"] = len(body["nodes"])
    text = " ".join(f"{k}={json.dumps(v, separators=(',', ':')) if isinstance(v, dict | list) else v}"
                    for k, v in short.items())
    return f"{ts} {routing_key:<40} {envelope.source:<12} {text}"


def cmd_tap(args: argparse.Namespace) -> int:
    from common.tap import follow

    config = load_or_exit(args.config)
    broker = config.broker_obj()
    seen = 0

    def on_event(rk: str, envelope: Any, msg: Any, error: Any) -> None:
        nonlocal seen
        if error is not None:
            line = json.dumps({"routing_key": rk, "error": str(error)}) if args.json else f"{rk}: undecodable: {error}"
        elif args.json:
            line = json.dumps({"routing_key": rk, **envelope.model_dump(mode="json")}, default=str)
        else:
            line = format_event(envelope, msg, rk)
        print(line, flush=True)
        seen += 1

    def bound() -> None:
        print(f"# tapping {broker.topology.events_exchange.name} with pattern {args.pattern!r} "
              f"(Ctrl-C to stop)", file=sys.stderr, flush=True)

    try:
        follow(broker, args.pattern, on_event, stop=lambda: bool(args.count and seen >= args.count),
               seconds=args.seconds, on_bound=bound)
    except KeyboardInterrupt:
        pass
    return 0


# ---------------------------------------------------------------- config
def cmd_config_check(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.file)
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    if args.json:
        doc = config.model_dump(mode="json", by_alias=True)
        from common.logs import redact

        doc["broker"]["url"] = config.broker_obj().redacted_url()
        print(json.dumps(redact(doc), indent=2))
    else:
        print(f"{args.file}: OK — {len(config.domains)} domain(s), {len(config.sites)} site(s), "
              f"broker {config.broker_obj().redacted_url()}")
    return 0


# ---------------------------------------------------------------- deploy
def cmd_rabbitmq_definitions(args: argparse.Namespace) -> int:
    from common.definitions import rabbitmq_definitions
    from common.topology import Topology

    domains = args.domain or []
    if args.config:
        config = load_or_exit(args.config)
        domains = domains or sorted(config.domains)
        topology = Topology(prefix=config.broker.prefix, quorum=config.broker.quorum)
    else:
        topology = Topology()
    passwords: dict[str, str] = {}
    if args.passwords_file:
        import tomllib

        with open(args.passwords_file, "rb") as f:
            passwords = {k: str(v) for k, v in tomllib.load(f).items()}
    doc = rabbitmq_definitions(topology, domains, vhost=args.vhost, passwords=passwords)
    text = json.dumps(doc, indent=2) + "\n"
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run", help="run one service", formatter_class=RAW,
        description="Run one EPU service in the foreground until SIGTERM/SIGINT.\n\n"
                    "On SIGTERM the message in hand is finished and acknowledged, then the service\n"
                    "closes its broker connection and exits 0. Broker loss is survived: the service\n"
                    "reconnects with backoff and resumes.",
        epilog="Example: epu run decision -c /etc/epu/epu.toml")
    p.add_argument("service", choices=sorted(SERVICES), help="which service to run")
    add_config_arg(p)
    p.add_argument("--json-logs", action="store_true", help="log one JSON object per line")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser(
        "tap", help="print every event on the bus, live", formatter_class=RAW,
        description="Bind an exclusive, auto-deleted queue to the events exchange and print every\n"
                    "decoded message as it passes. PATTERN is an AMQP topic pattern over routing keys\n"
                    "such as sensor.snapshot.DOMAIN, instance.state.DOMAIN.STATE, decision.record.DOMAIN,\n"
                    "policy.outcome.DOMAIN, node.result.DOMAIN, context.member.CONTEXT.",
        epilog="Examples:\n  epu tap                       # everything\n"
               "  epu tap 'instance.state.#'      # instance life cycles\n"
               "  epu tap 'decision.record.alpha' --json | jq .body.actions")
    p.add_argument("pattern", nargs="?", default="#", help="topic pattern (default: #, everything)")
    p.add_argument("--json", action="store_true", help="one JSON object per message (envelope + routing_key)")
    p.add_argument("--count", type=int, default=0, help="exit after N messages")
    p.add_argument("--seconds", type=float, default=0, help="exit after S seconds")
    add_config_arg(p)
    p.set_defaults(func=cmd_tap)

    p = sub.add_parser("config", help="validate a configuration file",
                       description="Configuration tools. `epu config check FILE` loads FILE as every service would\n"
                                   "(EPU_SECTION__KEY variables applied) and reports the first bad key.",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    csub = p.add_subparsers(dest="config_command", metavar="ACTION")
    c = csub.add_parser("check", help="validate FILE; errors name the key and what was expected",
                        description="Load FILE with environment overrides and validate every section.\n"
                                    "Exit 0 when valid, 2 with one line per problem otherwise.",
                        formatter_class=RAW)
    c.add_argument("file", metavar="FILE", help="the TOML configuration to check (e.g. /etc/epu/epu.toml)")
    c.add_argument("--json", action="store_true", help="print the effective config (secrets redacted)")
    c.set_defaults(func=cmd_config_check)

    p = sub.add_parser("deploy", help="generate what an operator installs",
                       description="Generate deployment artefacts from the code, so they cannot drift from it\n"
                                   "(deploy/rabbitmq/definitions.json is one; a test checks it is current).",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    dsub = p.add_subparsers(dest="deploy_command", metavar="WHAT")
    d = dsub.add_parser(
        "rabbitmq-definitions", formatter_class=RAW,
        help="RabbitMQ definitions (vhost, least-privilege users, exchanges, queues, policies)",
        description="Print RabbitMQ definitions for `rabbitmqctl import_definitions FILE`, generated\n"
                    "from the one topology declaration in common/topology.py: a vhost, one user per\n"
                    "service with least-privilege (and topic) permissions, the exchanges, queues,\n"
                    "bindings and policies. Users have no password unless --passwords-file is given\n"
                    "(a TOML file of user = \"password\"); the hashes, never the passwords, are written.",
        epilog="Example:\n  epu deploy rabbitmq-definitions -c /etc/epu/epu.toml --passwords-file pw.toml -o defs.json\n"
               "  rabbitmqctl import_definitions defs.json")
    d.add_argument("--domain", action="append", metavar="NAME", help="a domain (repeatable; default: config's)")
    d.add_argument("--vhost", default="epu", help="virtual host (default: epu)")
    d.add_argument("--passwords-file", metavar="FILE", help="TOML: user name = password")
    d.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    add_config_arg(d)
    d.set_defaults(func=cmd_rabbitmq_definitions)

    from common import demo

    demo.register(sub)
