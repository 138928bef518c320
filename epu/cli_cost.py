"""``epu cost``: node-hours and cost per domain, site, type, account, user and partition.

Why a ledger: what a node-second bought is known only while it happens (which jobs ran on the
node then), and no service keeps that history. ``epu cost record`` taps the event stream (like
``epu record``) and appends the few facts accounting needs — instance state changes and, per
snapshot, which jobs ran on which instance and whose they are — to a JSON-lines ledger;
``epu cost`` folds the ledger (``epu.cost.Ledger``, the rule is in ``epu/cost.py``) and prints the
table for a period. Prices come from the configuration's site catalogues.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import signal
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from epu.cost import DIMENSIONS, Ledger, group, total

RAW = argparse.RawDescriptionHelpFormatter
DEFAULT_LEDGER = "/var/lib/epu/cost-ledger.jsonl"


class CostError(ValueError):
    """Bad input to ``epu cost``: one line, exit status 2."""


def parse_when(text: str, now: float) -> float:
    """An ISO 8601 date or time (UTC unless it says), or a duration ago: ``90m``, ``24h``, ``7d``."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", text.strip())
    if m:
        return now - float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    try:
        dt = datetime.fromisoformat(text.strip())
    except ValueError:
        raise CostError(f"not a time: {text!r} (ISO 8601 like 2026-11-28T10:00, or a duration ago like 24h, 7d)") \
            from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def prices_of(config: Any) -> dict[tuple[str, str], float]:
    """(site, type) → $/h from the configuration's catalogues; (site, "") is the site's price."""
    from epu.common.config.catalogue import site_types

    out: dict[tuple[str, str], float] = {}
    for name, site in config.sites.items():
        out[(name, "")] = float(site.price_per_hour)
        for t in site_types(name, site):
            out[(name, t.name)] = float(t.price_per_hour)
    return out


def read_ledger(path: Path) -> Ledger:
    ledger = Ledger()
    try:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    ledger.apply(json.loads(line))
                except (ValueError, KeyError, TypeError, IndexError):
                    raise CostError(f"{path}:{n}: not a ledger line") from None
    except FileNotFoundError:
        raise CostError(f"no ledger at {path} (run `epu cost record --ledger {path}` to keep one)") from None
    return ledger


def table(ledger: Ledger, prices: dict[tuple[str, str], float], since: float, until: float,
          by: list[str]) -> dict[str, Any]:
    usage = ledger.attribute(prices, since, until)
    t = total(usage)
    rows = [{**dict(zip(by, k, strict=True)), "node_hours": round(u.node_seconds / 3600, 4), "cost": round(u.cost, 4)}
            for k, u in group(usage, by)]
    return {"since": since, "until": until, "by": by, "rows": rows,
            "total": {"node_hours": round(t.node_seconds / 3600, 4), "cost": round(t.cost, 4)}}


def _print_table(result: dict[str, Any]) -> None:
    by = result["by"]
    rows = [[str(r[d]) or "-" for d in by] + [f"{r['node_hours']:.2f}", f"{r['cost']:.2f}"] for r in result["rows"]]
    t = result["total"]
    rows.append(["TOTAL"] + [""] * (len(by) - 1) + [f"{t['node_hours']:.2f}", f"{t['cost']:.2f}"])
    head = [*by, "node-hours", "cost"]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:<{w}}}" if i < len(by) else f"{{:>{w}}}" for i, w in enumerate(widths))
    print(fmt.format(*head))
    for r in rows:
        print(fmt.format(*r))


def cmd_cost(args: argparse.Namespace) -> int:
    from epu.common.cliargs import load_or_exit

    now = time.time()
    try:
        by = [d.strip() for d in args.by.split(",") if d.strip()]
        bad = [d for d in by if d not in DIMENSIONS]
        if bad or not by:
            raise CostError(f"--by: unknown dimension(s) {', '.join(bad) or '(none)'} (one or more of "
                            f"{', '.join(DIMENSIONS)})")
        since = parse_when(args.since, now) if args.since else 0.0
        until = parse_when(args.until, now) if args.until else now
        if until <= since:
            raise CostError("--until is not after --since")
        ledger = read_ledger(Path(args.ledger))
    except CostError as exc:
        print(f"epu cost: {exc}", file=sys.stderr)
        return 2
    config = load_or_exit(args.config)
    result = table(ledger, prices_of(config), since, until, by)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    elif args.csv:
        w = csv.writer(sys.stdout)
        w.writerow([*by, "node_hours", "cost"])
        for r in result["rows"]:
            w.writerow([*(r[d] for d in by), r["node_hours"], r["cost"]])
        w.writerow(["TOTAL", *[""] * (len(by) - 1), result["total"]["node_hours"], result["total"]["cost"]])
    else:
        _print_table(result)
    return 0


def record(config_path: str | None, ledger_path: Path, seconds: float = 0.0,
           ready_file: Path | None = None, stop_when: Callable[[], bool] | None = None) -> int:
    """Tap the events until ``seconds`` passed (0: until SIGTERM/SIGINT), appending each fact to
    the ledger as it comes (flushed: a crash loses at most the line being written). A restarted
    recorder folds the ledger first, so instance lives continue where they were."""
    from epu.common.cliargs import load_or_exit
    from epu.common.tap import follow

    config = load_or_exit(config_path)
    ledger = read_ledger(ledger_path) if ledger_path.exists() else Ledger()
    stop = False

    def on_signal(signum: int, frame: Any) -> None:
        nonlocal stop
        stop = True

    if stop_when is None:  # the command (a library caller stops it its own way)
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
    written = 0
    with open(ledger_path, "a") as out:
        def on_event(_rk: str, _envelope: Any, msg: Any, error: Any) -> None:
            nonlocal written
            if error is None:
                fact = ledger.observe(msg)
                if fact is not None:
                    out.write(json.dumps(fact, sort_keys=True) + "\n")
                    out.flush()
                    written += 1

        follow(config.broker_obj(), "#", on_event, stop=lambda: stop or bool(stop_when and stop_when()),
               seconds=seconds,
               on_bound=(lambda: ready_file.write_text("ready\n")) if ready_file is not None else None)
    return written


def cmd_record(args: argparse.Namespace) -> int:
    n = record(args.config, Path(args.ledger), args.seconds, Path(args.ready_file) if args.ready_file else None)
    print(f"epu cost record: {n} fact(s) appended to {args.ledger}", file=sys.stderr)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    from epu.common.cliargs import add_config_arg

    p = sub.add_parser(
        "cost", help="node-hours and cost per domain, site, type, account, user, partition", formatter_class=RAW,
        description="Print node-hours and cost for a period, grouped by --by, from the ledger that\n"
                    "`epu cost record` keeps. Each paid node-second is shared equally among the jobs\n"
                    "running on the node then (their account, user, partition); time with no job on\n"
                    "the node (booting, idle, draining) goes to the account (idle). The sum over\n"
                    "accounts is the total. Prices: the sites' catalogues in the configuration.",
        epilog="Examples:\n  epu cost --since 24h --by account -c /etc/epu/epu.toml\n"
               "  epu cost --since 2026-11-01 --until 2026-12-01 --by domain,site,type --csv\n"
               "  epu cost record --ledger /var/lib/epu/cost-ledger.jsonl      # keep the ledger (a service)\n\n"
               "Exit status: 0 table printed; 2 bad option, no ledger, or bad configuration.")
    p.add_argument("--ledger", default=DEFAULT_LEDGER, metavar="FILE", help=f"the ledger (default {DEFAULT_LEDGER})")
    p.add_argument("--since", metavar="WHEN", help="start: ISO 8601 (UTC) or a duration ago (24h, 7d); default: "
                                                   "the ledger's start")
    p.add_argument("--until", metavar="WHEN", help="end (default: now)")
    p.add_argument("--by", default="account", help=f"dimensions, comma-separated: {', '.join(DIMENSIONS)} "
                                                    "(default: account)")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="one JSON object: rows, total, period")
    fmt.add_argument("--csv", action="store_true", help="CSV with a TOTAL row")
    add_config_arg(p)
    p.set_defaults(func=cmd_cost)
    csub = p.add_subparsers(dest="cost_command", metavar="COMMAND")
    r = csub.add_parser("record", help="tap the events and append accounting facts to the ledger",
                        formatter_class=RAW,
                        description="Tap every event (like `epu tap`) and append to the ledger what accounting\n"
                                    "needs: instance state changes, and per sensor snapshot which jobs run on\n"
                                    "which instance and whose they are. Run it as a service next to the decision\n"
                                    "engine; a restart continues the same ledger.",
                        epilog="Example: epu cost record --ledger /var/lib/epu/cost-ledger.jsonl -c /etc/epu/epu.toml\n\n"
                               "Exit status: 0 stopped (--seconds, SIGTERM or Ctrl-C); 1 RabbitMQ refused or\n"
                               "cannot be reached, or the ledger cannot be written; 2 bad configuration.")
    r.add_argument("--ledger", default=DEFAULT_LEDGER, metavar="FILE", help=f"the ledger (default {DEFAULT_LEDGER})")
    r.add_argument("--seconds", type=float, default=0, help="stop after S seconds (default: until SIGTERM/Ctrl-C)")
    r.add_argument("--ready-file", metavar="FILE", help="create FILE once the tap is bound (for scripts and tests)")
    add_config_arg(r)
    r.set_defaults(func=cmd_record)
