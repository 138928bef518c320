"""Core subcommands: ``run``, ``demo``, ``tap``, ``config check``."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import epu.checks  # noqa: F401  (registers the services' own config checks)
from epu.common.cliargs import RAW, add_config_arg, config_path, load_or_exit, nonneg_float, nonneg_int
from epu.common.config import ConfigError, check_config, load_config
from epu.common.logs import setup_logging

#: service name → "module:function" building it from an EpuConfig (see common.runtime.Runnable)
SERVICES = {
    "sensor": "epu.workloads.feed:build_sensor",  # the sensor app, fed by [sensor.options] workload if set
    "decision": "epu.services.decision.app:build_service",
    "provisioner": "epu.services.provisioner.app:build_service",
    "ctxbroker": "epu.services.ctxbroker.app:build_service",
}

def _builder(service: str) -> Any:
    module, func = SERVICES[service].split(":")
    return getattr(importlib.import_module(module), func)


# ---------------------------------------------------------------- run
def cmd_run(args: argparse.Namespace) -> int:
    config = load_or_exit(args.config, services={args.service})
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
    from epu.common.tap import follow

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
    path = config_path(args.file or args.config)
    services = set(args.service) if args.service else None
    try:
        config = load_config(path)
        problems = check_config(config, services)
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    if problems:
        print("\n".join(f"{path}: {p}" for p in problems), file=sys.stderr)
        return 2
    if services is None or "decision" in services:
        from epu.simulate.assumptions import config_warnings

        for w in config_warnings(config):  # valid, but the operator should know
            print(f"{path}: warning: {w}", file=sys.stderr)
    if args.json:
        doc = config.model_dump(mode="json", by_alias=True)
        from epu.common.logs import redact

        doc["broker"]["url"] = config.broker_obj().redacted_url()
        print(json.dumps(redact(doc), indent=2))
    else:
        checked = ", ".join(sorted(services)) if services else "every service"
        print(f"{path}: OK for {checked} — {len(config.domains)} domain(s), {len(config.sites)} site(s), "
              f"broker {config.broker_obj().redacted_url()}")
    return 0


# ---------------------------------------------------------------- deploy
def cmd_rabbitmq_definitions(args: argparse.Namespace) -> int:
    from epu.common.definitions import DefinitionsError, rabbitmq_definitions, write_private
    from epu.common.topology import Topology

    domains = args.domain or []
    path = config_path(args.config, required=False)
    if path:
        config = load_or_exit(path)
        domains = domains or sorted(config.domains)
        topology = Topology(prefix=config.broker.prefix, quorum=config.broker.quorum)
    else:
        topology = Topology()
    passwords: dict[str, str] | None = None
    if args.passwords_file:
        import tomllib

        try:
            with open(args.passwords_file, "rb") as f:
                passwords = {k: str(v) for k, v in tomllib.load(f).items()}
        except OSError as exc:
            print(f"epu deploy: cannot read the passwords file {args.passwords_file}: {exc.strerror}", file=sys.stderr)
            return 2
        except tomllib.TOMLDecodeError as exc:
            print(f"epu deploy: {args.passwords_file} is not valid TOML (user = \"password\" lines): {exc}",
                  file=sys.stderr)
            return 2
    import re

    if not re.fullmatch(r"[A-Za-z0-9._-]*", args.user_prefix):
        print(f"epu deploy: --user-prefix {args.user_prefix!r}: letters, digits, '.', '_' and '-' only", file=sys.stderr)
        return 2
    try:
        doc = rabbitmq_definitions(topology, domains, vhost=args.vhost, passwords=passwords,
                                   user_prefix=args.user_prefix)
    except DefinitionsError as exc:
        print(f"epu deploy: {args.passwords_file}: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(doc, indent=2) + "\n"
    if args.output:
        write_private(args.output, text)  # 0600: it may carry password hashes
    else:
        sys.stdout.write(text)
    return 0


def deploy_dir() -> Path:
    """Where the shipped deploy/ files are: inside the package when installed from a wheel
    (``epu/deploy``), at the top of a source checkout otherwise."""
    here = Path(__file__).resolve().parent
    installed = here / "deploy"
    return installed if installed.is_dir() else here.parent / "deploy"


def cmd_deploy_path(_args: argparse.Namespace) -> int:
    print(deploy_dir())
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run", help="run one service", formatter_class=RAW,
        description="Run one EPU service in the foreground until SIGTERM/SIGINT.\n\n"
                    "On SIGTERM the message in hand is finished and acknowledged, then the service\n"
                    "closes its broker connection and exits 0. Broker loss is survived: the service\n"
                    "reconnects with backoff and resumes. A refusal retrying cannot mend (a wrong password,\n"
                    "no permission on the vhost or a queue, no such vhost, an unreadable TLS certificate)\n"
                    "is retried 5 times in a row over 10 s or more, then the service exits 1 for its\n"
                    "supervisor (systemd's Restart=) to see. /healthz says which kind each failure is\n"
                    "(error_kind: permanent (KIND) or transient).",
        epilog="Examples:\n  epu run decision -c /etc/epu/epu.toml\n"
               "  EPU_CONFIG=/etc/epu/epu.toml epu run sensor --json-logs   # as the systemd units do\n\n"
               "Exit status: 0 stopped by SIGTERM/SIGINT; 1 a runtime failure it cannot survive (one line:\n"
               "RabbitMQ refused the login, a permission or the vhost, a port is in use (named), a file\n"
               "cannot be read); 2 bad configuration (one line per problem, what `epu config check\n"
               "--service SERVICE` prints).")
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
               "  epu tap 'decision.record.alpha' --json | jq .body.actions\n"
               "  epu tap 'sensor.snapshot.*' --count 2 --seconds 30\n\n"
               "Exit status: 0 after --count messages, --seconds, or Ctrl-C; 1 RabbitMQ refused or cannot\n"
               "be reached (or the events exchange does not exist: load the definitions); 2 bad configuration.")
    p.add_argument("pattern", nargs="?", default="#", help="topic pattern (default: #, everything)")
    p.add_argument("--json", action="store_true", help="one JSON object per message (envelope + routing_key)")
    p.add_argument("--count", type=nonneg_int, default=0, help="exit after N messages")
    p.add_argument("--seconds", type=nonneg_float, default=0, help="exit after S seconds")
    add_config_arg(p)
    p.set_defaults(func=cmd_tap)

    p = sub.add_parser("config", help="validate a configuration file",
                       description="Configuration tools. `epu config check FILE` loads FILE as every service would\n"
                                   "(EPU_SECTION__KEY variables applied) and reports every problem, one line\n"
                                   "each, naming the key (or the environment variable that set it).",
                       epilog="Examples:\n  epu config check /etc/epu/epu.toml\n"
                              "  epu config check --service sensor\n\n"
                              "Exit status: 0 valid; 2 problems found, or no ACTION given.",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(func=lambda _args: p.print_help() or 2)
    csub = p.add_subparsers(dest="config_command", metavar="ACTION")
    c = csub.add_parser("check", help="validate FILE; errors name the key and what was expected",
                        description="Load FILE with environment overrides and run every check a service runs\n"
                                    "when it starts: the schema (types, ranges, unknown keys), references\n"
                                    "between sections (a domain's sites), each policy's name and parameters,\n"
                                    "and the files the services read (certificates, credentials, secrets) and\n"
                                    "write (stores, the admin token). A config this calls OK is one the\n"
                                    "services accept. With --service, only what that service checks (a head\n"
                                    "node running only the sensor holds no broker certificate).",
                        epilog="Examples:\n  epu config check /etc/epu/epu.toml\n"
                               "  epu config check --service sensor     # on the batch head node\n"
                               "  EPU_CONFIG=/etc/epu/epu.toml epu config check --json\n\n"
                               "Exit status: 0 when valid; 2 with one line per problem otherwise: FILE (or the\n"
                               "environment variable that set the key): KEY: what is wrong.",
                        formatter_class=RAW)
    c.add_argument("file", metavar="FILE", nargs="?", help="the TOML configuration to check (default: -c, "
                   "$EPU_CONFIG, /etc/epu/epu.toml)")
    c.add_argument("--service", action="append", choices=sorted(SERVICES),
                   help="check only what this service checks at start (repeatable; default: every service)")
    c.add_argument("--json", action="store_true", help="print the effective config (secrets redacted)")
    add_config_arg(c)
    c.set_defaults(func=cmd_config_check)

    p = sub.add_parser("deploy", help="generate what an operator installs",
                       description="Generate deployment artefacts from the code, so they cannot drift from it\n"
                                   "(deploy/rabbitmq/definitions.json is one; a test checks it is current), and\n"
                                   "find the files EPU ships (systemd units, cloud-init, ctx scripts, examples).",
                       epilog="Examples:\n  epu deploy rabbitmq-definitions --passwords-file pw.toml -o defs.json\n"
                              "  ls \"$(epu deploy path)\"\n\n"
                              "Exit status: 0 success; 2 bad usage, configuration or passwords file.",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(func=lambda _args: p.print_help() or 2)
    dsub = p.add_subparsers(dest="deploy_command", metavar="WHAT")
    d = dsub.add_parser(
        "rabbitmq-definitions", formatter_class=RAW,
        help="RabbitMQ definitions (vhost, least-privilege users, exchanges, queues, policies)",
        description="Print RabbitMQ definitions for `rabbitmqctl import_definitions`, generated\n"
                    "from the one topology declaration in common/topology.py: a vhost, one user per\n"
                    "service with least-privilege (and topic) permissions, the exchanges, queues,\n"
                    "bindings and policies (queue bounds). Users have no password unless --passwords-file\n"
                    "is given: a TOML file of user = \"password\" naming every user exactly (a missing or\n"
                    "unknown user is an error, exit 2); the hashes, never the passwords, are written, and\n"
                    "the -o file is created readable by its owner only (0600).\n\n"
                    "User names are global to a RabbitMQ server, vhosts or not: importing a second EPU's\n"
                    "definitions with the same names gives the first EPU's users the second one's\n"
                    "passwords. Give each EPU on one broker its own --vhost and its own --user-prefix\n"
                    "(site2- makes site2-epu-decision, ...); its services then log in as those users.",
        epilog="Example:\n  epu deploy rabbitmq-definitions -c /etc/epu/epu.toml --passwords-file pw.toml -o defs.json\n"
               "  sudo rabbitmqctl import_definitions < defs.json   # on standard input: the server would\n"
               "                                                   # resolve a file path itself\n"
               "  epu deploy rabbitmq-definitions --domain alpha -o deploy/rabbitmq/definitions.json\n"
               "  epu deploy rabbitmq-definitions -c /etc/epu2/epu.toml --vhost epu2 --user-prefix site2- \\\n"
               "      --passwords-file pw2.toml -o defs2.json      # a second EPU on the same RabbitMQ\n\n"
               "Exit status: 0 written; 2 bad configuration, or a passwords file that cannot be read or\n"
               "does not name every user exactly (the message names them).")
    d.add_argument("--domain", action="append", metavar="NAME", help="a domain (repeatable; default: config's)")
    d.add_argument("--vhost", default="epu", help="virtual host (default: epu)")
    d.add_argument("--user-prefix", default="", metavar="PREFIX",
                   help="put PREFIX before every user name (PREFIXepu-decision, ...): RabbitMQ users are global to "
                        "the broker, so a second EPU on it needs its own (default: none)")
    d.add_argument("--passwords-file", metavar="FILE", help="TOML: user name = password")
    d.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    add_config_arg(d, optional_note="optional: the domains and name prefix come from it")
    d.set_defaults(func=cmd_rabbitmq_definitions)
    d = dsub.add_parser(
        "path", formatter_class=RAW, help="print where the shipped deploy/ files are",
        description="Print the directory of the files EPU ships for an operator to install: systemd\n"
                    "units (systemd/), the cloud-init template (cloud-init/), the context agent's\n"
                    "scripts (ctx-scripts/), example configs (examples/), RabbitMQ definitions.",
        epilog="Example:\n  sudo cp -r \"$(epu deploy path)/ctx-scripts\" /etc/epu/ctx-scripts\n\n"
               "Exit status: 0.")
    add_config_arg(d, optional_note="not used")
    d.set_defaults(func=cmd_deploy_path)

    from epu import demo

    demo.register(sub)
