"""``epu policy show|set|pause|resume`` and ``epu status``.

``set``/``pause``/``resume`` publish a PolicyChange to the engine's control queue and wait for
its PolicyOutcome on an exclusive queue bound to ``policy.outcome.DOMAIN`` (bound *before*
publishing, so the answer cannot be missed). ``show`` reads the engine's store where this host and
user can, the engine's retained status over the broker elsewhere (``common.storeaccess``).
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
import tomllib
from typing import Any

from epu.common.cliargs import RAW, add_config_arg, load_or_exit, nonneg_float, validation_line
from epu.common.messages import PolicyChange, new_id

FIELDS = ("policy", "min_nodes", "max_nodes", "sites", "placement", "paused", "budget_per_hour", "mode")


class UsageError(ValueError):
    pass


def _literal(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def parse_assignments(pairs: list[str]) -> dict[str, Any]:
    """``key=value`` words → PolicyChange fields; unknown keys are policy parameters.

    Values are TOML literals where they parse (``3``, ``0.5``, ``true``), strings otherwise;
    ``sites`` takes a comma-separated list; ``budget_per_hour=none`` removes the spend cap."""
    out: dict[str, Any] = {"params": {}}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"expected key=value, got {pair!r}")
        if key == "sites":
            out["sites"] = [s.strip() for s in value.split(",") if s.strip()]
        elif key == "budget_per_hour" and value.strip().lower() == "none":
            out["clear_budget"] = True  # no cap (0 is refused, as in the file)
        elif key in ("policy", "placement", "mode"):
            out[key] = value
        elif key in FIELDS:
            out[key] = _literal(value)
        else:
            out["params"][key.removeprefix("params.")] = _literal(value)
    return out


def unknown_domain(config: Any, domain: str) -> str | None:
    """Why ``domain`` is no domain this deployment manages (None: it is one, or this host cannot
    tell). Where the truth comes from, in order: the configuration's ``[domains]`` when it names
    any (the operator's own file may name none: only the broker), else the decision engine's
    store (``decision.store_url``: every domain the engine was ever configured with) where this
    host can read it. Asked before the broker, which answers a status queue of an unknown domain
    with a 403 that says nothing of the cause (issue 34)."""
    from epu.common.storeaccess import read_store

    if config.domains:
        if domain in config.domains:
            return None
        return (f"unknown domain {domain!r} (the configuration's [domains]: "
                f"{', '.join(sorted(config.domains))})")

    def read() -> list[str]:
        from epu.services.decision.store import Store

        store = Store(config.decision.store_url)
        try:
            return store.domains()
        finally:
            store.engine.dispose()

    known, why = read_store(config.decision.store_url, "decision.store_url", read)
    if why is not None or known is None or domain in known:
        return None
    return f"unknown domain {domain!r} (the decision engine's store knows: {', '.join(sorted(known)) or 'none'})"


def send_change(config: Any, change: PolicyChange, timeout: float) -> Any:
    """Publish ``change`` once a tap for its outcome is bound, and wait for the outcome (None
    on timeout). The tap is an ``epu.tap.*`` queue: all the operator user may create."""
    from epu.common.answers import request

    return request(config.broker_obj(), change, f"policy.outcome.{change.domain}",
                   lambda msg: getattr(msg, "change_id", None) == change.change_id,
                   timeout=timeout, source=f"cli:{getpass.getuser()}")


def _change_cmd(args: argparse.Namespace, fields: dict[str, Any]) -> int:
    config = load_or_exit(args.config)
    try:
        change = PolicyChange(change_id=new_id(), domain=args.domain, operator=getpass.getuser(), **fields)
    except Exception as exc:
        print(f"epu policy: invalid change: {validation_line(exc)}", file=sys.stderr)
        return 2
    outcome = send_change(config, change, args.timeout)
    if outcome is None:
        print(f"epu policy: no answer within {args.timeout:.0f}s (is a decision engine running for "
              f"{args.domain}?). The change {change.change_id} stays queued.", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(outcome.model_dump(mode="json"), indent=2))
    elif outcome.applied:
        budget = outcome.config.get("budget_per_hour")
        print(f"{args.domain}: applied as version {outcome.version} ({outcome.config.get('policy')}, "
              f"nodes {outcome.config.get('min_nodes')}..{outcome.config.get('max_nodes')}, "
              f"mode {outcome.config.get('mode', 'act')}, budget {f'{budget:g}/h' if budget is not None else 'none'}"
              f"{', PAUSED' if outcome.config.get('paused') else ''})")
    else:
        print(f"{args.domain}: rejected: {outcome.reason}", file=sys.stderr)
    return 0 if outcome.applied else 1


def cmd_set(args: argparse.Namespace) -> int:
    try:
        fields = parse_assignments(args.assignments)
    except UsageError as exc:
        print(f"epu policy set: {exc}", file=sys.stderr)
        return 2
    return _change_cmd(args, fields)


def cmd_pause(args: argparse.Namespace) -> int:
    return _change_cmd(args, {"paused": args.pause})


def cmd_release_breaker(args: argparse.Namespace) -> int:
    return _change_cmd(args, {"release_breaker": True})


def _from_engine_status(config: Any, domain: str) -> tuple[int, Any, str] | str:
    """(version, DomainConfig, source) from the engine's retained status of ``domain``, or why not."""
    import time

    from epu.common.config import DomainConfig
    from epu.common.retained import engine_statuses
    from epu.common.topology import check_name

    try:
        check_name(domain)
    except ValueError as exc:
        return str(exc)
    found, why = engine_statuses(config.broker_obj(), [domain])
    status = found.get(domain)
    if status is None or not getattr(status, "config", None):
        return why.get(domain, "the engine's status carries no configuration (an older engine)")
    age = max(0.0, time.time() - status.at)
    return status.policy_version, DomainConfig.model_validate(status.config), f"engine status, {age:.0f}s old"


def cmd_show(args: argparse.Namespace) -> int:
    from epu.common.storeaccess import read_store
    from epu.services.decision.policies import PolicyError, validate_params

    config = load_or_exit(args.config)

    def from_store() -> tuple[int, Any, str] | None:
        from epu.services.decision.store import Store

        store = Store(config.decision.store_url).create()
        try:
            current = store.current_config(args.domain)
            if current is None:
                return None
            return current[0], current[1], store.config_history(args.domain)[-1]["source"]
        finally:
            store.engine.dispose()

    got, why = read_store(config.decision.store_url, "decision.store_url", from_store)
    if why is not None:  # not where the engine's store is, or not ours to read: ask the engine
        print(f"epu policy show: {why}: reading the decision engine's status over the broker", file=sys.stderr)
        answer = _from_engine_status(config, args.domain)
        if isinstance(answer, str):
            print(f"epu policy show: {answer}", file=sys.stderr)
            return 1
        version, cfg, source = answer
    elif got is None:
        if args.domain not in config.domains:
            print(f"epu policy show: unknown domain {args.domain!r}", file=sys.stderr)
            return 1
        version, cfg, source = 0, config.domains[args.domain], "file (engine not started yet)"
    else:
        version, cfg, source = got
    try:
        effective = validate_params(cfg.policy, cfg.params).model_dump()
    except PolicyError as exc:
        effective = {"error": str(exc)}
    doc = {"domain": args.domain, "version": version, "source": source, **cfg.model_dump(mode="json"),
           "effective_params": effective}
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(f"domain {args.domain}  version {version} ({source}){'  PAUSED' if cfg.paused else ''}")
    print(f"  policy     {cfg.policy}")
    print(f"  nodes      min {cfg.min_nodes}, max {cfg.max_nodes}, {cfg.cores_per_node} core(s) each")
    print(f"  sites      {', '.join(cfg.sites) or '(all configured)'}  placement {cfg.placement}")
    print(f"  mode       {cfg.mode}" + ("  (observe: decisions recorded, nothing done)" if cfg.mode == "observe" else ""))
    print("  budget     " + (f"{cfg.budget_per_hour:g} per hour (spend cap)" if cfg.budget_per_hour is not None
                             else "none (no spend cap)"))
    for k, v in effective.items():
        mark = "" if k in cfg.params else "  (default)"
        print(f"  {k:<24} {v}{mark}")
    return 0


def load_retained(broker: Any, domains: list[str], board: Any) -> list[str]:
    """Fold each domain's retained ``EngineStatus`` into ``board``; returns a note per domain
    without one."""
    from epu.common.retained import engine_statuses

    found, why = engine_statuses(broker, domains)
    for msg in found.values():
        board.apply(msg)
    return [f"domain {d}: {reason}; showing live events only" for d, reason in sorted(why.items())]


def cmd_status(args: argparse.Namespace) -> int:
    from epu.common.tap import follow
    from epu.services.decision.status import Board, render

    config = load_or_exit(args.config)
    broker = config.broker_obj()
    if args.domain and config.domains and args.domain not in config.domains:
        # an operator's own config may name no domain at all (only the broker): then any name goes
        print(f"epu status: unknown domain {args.domain!r} (configured: {', '.join(sorted(config.domains))})",
              file=sys.stderr)
        return 2
    if args.domain:
        from epu.common.topology import check_name

        try:
            check_name(args.domain)
        except ValueError as exc:
            print(f"epu status: {exc}", file=sys.stderr)
            return 2
    d = args.domain or "*"
    keys = [f"sensor.snapshot.{d}", f"instance.state.{d}.*", f"decision.record.{d}", f"decision.status.{d}"]
    board = Board(args.domain)
    live = None

    def emit() -> None:
        if live is not None:
            live.update(render(board))
        elif args.watch and args.json:
            print(json.dumps(board.as_json()), flush=True)

    def on_bound() -> None:
        # bound first, read second: nothing published in between is missed, and the board
        # keeps whichever of the two is newer
        domains = [args.domain] if args.domain else sorted(config.domains)
        if not domains:
            print("epu status: the configuration names no domain: give DOMAIN to see the engine's whole "
                  "status; showing live events only", file=sys.stderr)
        for note in load_retained(broker, domains, board):
            print(f"epu status: {note}", file=sys.stderr)
        if board.domains:
            emit()

    def on_event(_rk: str, _env: Any, msg: Any, error: Any) -> None:
        try:
            changed = error is None and board.apply(msg)
        except Exception:
            changed = False
        if changed:
            emit()

    def on_idle() -> None:
        if live is not None:
            live.update(render(board))

    if args.watch and not args.json:
        from rich.live import Live

        live = Live(render(board), refresh_per_second=4)
        live.start()
    try:
        follow(broker, keys, on_event, stop=lambda: bool(not args.watch and not args.seconds),
               seconds=0 if args.watch else args.seconds, on_bound=on_bound, on_idle=on_idle)
    except KeyboardInterrupt:
        pass
    finally:
        if live is not None:
            live.stop()
    if not args.watch:
        if args.json:
            print(json.dumps(board.as_json(), indent=2))
        else:
            from rich.console import Console

            Console().print(render(board))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("policy", help="show or change a domain's policy (decision engine)",
                       formatter_class=RAW,
                       description="Show a domain's policy from the engine's store, or change it at run time.\n"
                                   "Changes travel as PolicyChange messages; the engine validates, versions and\n"
                                   "applies them at its next iteration and answers applied or rejected (reason).\n"
                                   "An operator needs only the epu-operator user's permissions (docs/deploy.md).",
                       epilog="Examples:\n  epu policy show alpha\n  epu policy set alpha max_nodes=40 idle_seconds=300\n"
                              "  epu policy pause alpha\n\n"
                              "Exit status: see each ACTION's --help; 2 when no ACTION is given.")
    p.set_defaults(func=lambda _args: p.print_help() or 2)
    psub = p.add_subparsers(dest="policy_command", metavar="ACTION")

    s = psub.add_parser("show", help="the domain's current config version and effective parameters",
                        formatter_class=RAW,
                        description="Read DOMAIN's current policy, version, bounds and sites from the engine's\n"
                                    "store (decision.store_url), with every parameter's effective value;\n"
                                    "parameters left at their default are marked (default). Where the store\n"
                                    "cannot be read (another host, no SQL layer installed, a directory closed\n"
                                    "to this user) it reads the engine's retained status over the broker and\n"
                                    "says so (source: engine status).",
                        epilog="Example: epu policy show alpha -c /etc/epu/epu.toml\n"
                               "Exit status: 0; 1 unknown domain; 2 bad configuration.")
    s.add_argument("domain", help="the domain, as named under [domains] in the configuration")
    s.add_argument("--json", action="store_true", help="print the domain's config, version, source and effective_params as JSON")
    add_config_arg(s)
    s.set_defaults(func=cmd_show)

    s = psub.add_parser("set", help="change policy, parameters, bounds or sites", formatter_class=RAW,
                        description="KEY=VALUE words: policy, min_nodes, max_nodes, sites (comma list, in rank\n"
                                    "order), placement (rank|cheapest|spread), paused, mode (act|observe: observe\n"
                                    "records what the engine would do and does nothing), budget_per_hour (the\n"
                                    "domain's spend cap per hour, above 0; `none` removes the cap; refused when\n"
                                    "a type it judges has no price or one instance costs more); any other key is\n"
                                    "a parameter of the policy (see docs/policies.md).",
                        epilog="Examples:\n  epu policy set alpha policy=threshold jobs_per_vm=2 max_nodes=40\n"
                               "  epu policy set alpha sites=cheap,backup placement=cheapest\n"
                               "  epu policy set alpha stall_seconds=300\n"
                               "  epu policy set alpha budget_per_hour=25 mode=observe\n"
                               "  epu policy set alpha budget_per_hour=none             # no spend cap\n\n"
                               "Exit status: 0 applied (the new version is printed); 1 rejected (the reason is\n"
                               "printed, nothing changed) or no answer within --timeout (is the engine running?),\n"
                               "or RabbitMQ refused or cannot be reached; 2 bad usage (a word without =) or\n"
                               "bad configuration.")
    s.add_argument("domain", help="the domain to change")
    s.add_argument("assignments", nargs="+", metavar="KEY=VALUE",
                   help="what to change; values are parsed as TOML scalars (2, 0.5, true, text)")
    s.add_argument("--timeout", type=nonneg_float, default=30.0, help="seconds to wait for the engine's answer (default 30)")
    s.add_argument("--json", action="store_true", help="print the PolicyOutcome as JSON")
    add_config_arg(s)
    s.set_defaults(func=cmd_set)
    from epu.services.decision.cli_history import add_parser as add_history

    add_history(psub)

    pause_help = {
        "pause": ("stop acting on a domain: no launch, no scale-down, no node command",
                  "Pause DOMAIN: the engine keeps watching and recording but takes no action until\n"
                  "resumed. Instances and nodes stay as they are. Answered like `policy set`."),
        "resume": ("act on a paused domain again",
                   "Resume DOMAIN after `epu policy pause`: from its next iteration the engine acts\n"
                   "again on the current view (launches, scale-down, node commands), as the policy\n"
                   "decides. Answered like `policy set`."),
    }
    for name, pause in (("pause", True), ("resume", False)):
        short, long_ = pause_help[name]
        s = psub.add_parser(name, help=short, description=long_, formatter_class=RAW,
                            epilog=f"Example: epu policy {name} alpha -c /etc/epu/epu.toml\n"
                                   "Exit status: 0 applied, 1 rejected or no answer, 2 bad configuration or domain name.")
        s.add_argument("domain", help="the domain to " + name)
        s.add_argument("--timeout", type=nonneg_float, default=30.0, help="seconds to wait for the engine's answer (default 30)")
        s.add_argument("--json", action="store_true", help="print the PolicyOutcome as JSON")
        add_config_arg(s)
        s.set_defaults(func=cmd_pause, pause=pause)

    s = psub.add_parser("release-breaker", help="act on implausible snapshots anyway (circuit breaker)",
                        formatter_class=RAW,
                        description="The engine's circuit breaker opens when a snapshot is implausible — more\n"
                                    "than [decision] breaker_missing_share of the domain's joined nodes missing at\n"
                                    "once, or jobs running on no listed node — and then freezes scale-down and\n"
                                    "lost-node handling (docs/decision.md). Release it when you know the nodes are\n"
                                    "really gone: the engine acts on the current picture until the next plausible\n"
                                    "snapshot closes the breaker anyway. Answered like `policy set`.",
                        epilog="Example: epu policy release-breaker alpha -c /etc/epu/epu.toml\n"
                               "Exit status: 0 applied, 1 rejected or no answer, 2 bad configuration or domain name.")
    s.add_argument("domain", help="the domain whose breaker to release")
    s.add_argument("--timeout", type=nonneg_float, default=30.0, help="seconds to wait for the engine's answer (default 30)")
    s.add_argument("--json", action="store_true", help="print the PolicyOutcome as JSON")
    add_config_arg(s)
    s.set_defaults(func=cmd_release_breaker)

    s = sub.add_parser("status", help="live view: queue, nodes, instances by state and site, last decision",
                       formatter_class=RAW,
                       description="The whole current state of each domain, at once, then kept live.\n\n"
                                   "It starts from the decision engine's retained status (the queue\n"
                                   "epu.status.DOMAIN holds the newest; it is read and left in place): every live\n"
                                   "instance with its site, state and whether its node is in the batch system,\n"
                                   "the queue (jobs, cores), batch nodes by state, policy and version, bounds,\n"
                                   "pause and circuit breaker, and the last decision with its actions and notes.\n"
                                   "Events (snapshots, instance events, decision records, new statuses) then\n"
                                   "keep it current through an exclusive tap queue; a piece is applied only\n"
                                   "when newer than what is shown. Needs only the operator's read access to the\n"
                                   "broker, never a service's store. Without an engine status (engine not\n"
                                   "started yet) it says so and shows what the events tell.\n\n"
                                   "Without --watch it prints after --seconds of listening (0: at once, from\n"
                                   "the retained status only).",
                       epilog="Examples:\n"
                              "  epu status alpha -c /etc/epu/epu.toml --seconds 0   # now, from the engine's status\n"
                              "  epu status --watch -c /etc/epu/epu.toml             # live board, every domain\n"
                              "  epu status alpha --watch --json | jq .[0].queue     # one JSON line per change\n"
                              "  epu status alpha --json --seconds 0 | jq '.[0].instances[] | select(.in_batch)'\n\n"
                              "Files and environment: the configuration (-c, $EPU_CONFIG, /etc/epu/epu.toml)\n"
                              "names the broker and the domains; EPU_BROKER__URL overrides the broker URL.\n"
                              "Exit status: 0; 1 when the broker cannot be reached or refuses the login;\n"
                              "2 on a bad configuration or an unknown domain.")
    s.add_argument("domain", nargs="?", help="show only this domain (default: every domain seen)")
    s.add_argument("--json", action="store_true",
                   help="JSON instead of the board: a list of domains; with --watch one line per change")
    s.add_argument("--watch", action="store_true", help="keep updating until Ctrl-C")
    s.add_argument("--seconds", type=nonneg_float, default=3.0,
                   help="how long to listen for events without --watch (default 3; 0: print the retained status at once)")
    add_config_arg(s)
    s.set_defaults(func=cmd_status)
