"""``epu cost``: node-hours and cost per domain, site, type, account, user and partition.

Where the truth comes from (issue 34): the records the services keep durably anyway, not a tap
that must be running to see anything. The provisioner's store holds every instance's life — when
its launch was asked for (``created_at``, where billing starts, as the spend cap counts it), when
it ended (``ended_at``) and the price its type had at that launch (``price_per_hour``) —
``ProvisionerStore.lives``; the engine's store holds which job ran on which instance's node, and
when (``DecisionStore.job_spans``, ``services/decision/occupancy.py``). So a period that began
before anyone asked, an engine restarted or a night with nobody watching loses nothing and bills
nothing extra, and the total agrees with the engine's ``epu_spend_total``. ``epu cost`` folds them
with ``epu/cost.py``'s rule.

Prices: each instance at the price recorded at its launch; a record without one (launched before
prices were kept, or adopted) at the configuration's catalogue, with a warning; where neither
knows, its node-hours are reported unpriced — never as 0 — and the cost is marked incomplete.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from epu.cost import DIMENSIONS, IDLE, Life, Occupancy, Usage, attribute, group, life_price, total

RAW = argparse.RawDescriptionHelpFormatter
NO_JOBS = "(no job record)"
"""The account of paid time whose jobs are unknown because the engine's store cannot be read."""


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


def catalogue_prices(config: Any) -> dict[tuple[str, str], float | None]:
    """(site, type) → $/h from the configuration's catalogues (None: unpriced); (site, "") is the
    site's own price. Only for records that kept no price of their own."""
    from epu.common.config.catalogue import site_types

    out: dict[tuple[str, str], float | None] = {}
    for name, site in config.sites.items():
        out[(name, "")] = site.price_per_hour
        for t in site_types(name, site):
            out[(name, t.name)] = t.price
    return out


@dataclass
class CostReport:
    """What ``epu cost`` prints: the attribution, and what the reader must know about it."""

    since: float
    until: float
    usage: dict[tuple[str, str, str, str, str, str], Usage]
    warnings: list[str] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)


def usage_from_records(records: list[Any], spans: list[Any] | None, fallback: dict[tuple[str, str], float | None],
                       since: float, until: float, horizon: float) -> CostReport:
    """The attribution over [since, until) of the provisioner's ``records`` (``InstanceRecord``s)
    and the engine's job ``spans`` (None: unknown — every paid second goes to ``NO_JOBS``).
    ``fallback``: prices for records that kept none; ``horizon``: how long after it was last
    seen an open span still counts (``JobSpan.until``). Pure."""
    lives = []
    for r in records:
        end = r.ended_at
        if end is None and r.state in ("terminated", "failed"):
            end = r.updated_at  # ended before ended_at existed and not brought up to date
        lives.append(Life(r.instance_id, r.domain, r.site, r.instance_type or "", r.created_at, end,
                          r.node_name, r.seq, r.price_per_hour))
    report = CostReport(since, until, {})
    if spans is None:
        occupancy: list[Occupancy] = [Occupancy(life.instance_id, life.start, float("inf"), NO_JOBS) for life in lives]
        owners = {NO_JOBS: (NO_JOBS, NO_JOBS, NO_JOBS)}
    else:
        occupancy = [Occupancy(s.instance_id, s.start, s.until(horizon, until), s.job_id) for s in spans]
        owners = {s.job_id: (s.account, s.user, s.partition) for s in spans}
    report.usage = attribute(lives, occupancy, owners, fallback, since, until)
    by_catalogue = [li for li in lives if li.price is None and life_price(li, fallback) is not None]
    if by_catalogue:
        report.warnings.append(f"{len(by_catalogue)} instance(s) of {', '.join(_kinds(by_catalogue))} kept no price "
                               "at launch (recorded before prices were kept, or adopted): priced at the "
                               "configuration's catalogue as it is now")
    unpriced = [life for life in lives if life_price(life, fallback) is None]
    if unpriced:
        kinds = _kinds(unpriced)
        hours = total(report.usage).unpriced_seconds / 3600
        report.warnings.append(f"UNPRICED: {len(unpriced)} instance(s) of {', '.join(kinds)} have no price (none "
                               f"recorded at launch, none in the configuration): their {hours:.2f} node-hour(s) in "
                               "the period are NOT in the cost, which is incomplete (give the type a "
                               "price_per_hour)")
    return report


def _kinds(lives: list[Life]) -> list[str]:
    return sorted({f"{li.site}/{li.instance_type}" if li.instance_type else li.site for li in lives})


def read_report(config: Any, since: float, until: float, now: float) -> CostReport:
    """The cost of [since, until) from the services' stores (the module docstring). Raises
    ``CostError`` when the provisioner's store, where what was paid is kept, cannot be read; an
    unreadable engine store only loses whose the time was (a warning)."""
    from epu.common.storeaccess import read_store

    until = min(until, now)  # a live instance is paid until now, not until a future --until

    def lives() -> list[Any]:
        from epu.services.provisioner.store import Store as ProvisionerStore

        store = ProvisionerStore(config.provisioner.store_url)
        try:
            return store.lives(since, until)
        finally:
            store.close()

    def spans() -> list[Any]:
        from epu.services.decision.store import Store as DecisionStore

        store = DecisionStore(config.decision.store_url)
        try:
            return store.job_spans(since, until)
        finally:
            store.engine.dispose()

    records, why = read_store(config.provisioner.store_url, "provisioner.store_url", lives)
    if why is not None or records is None:
        raise CostError(f"{why}: what instances cost is read from the provisioner's store (the instance records: "
                        "launch, end, price at launch); run epu cost where it is readable (the control-plane host)")
    jobs, why_jobs = read_store(config.decision.store_url, "decision.store_url", spans)
    report = usage_from_records(records, jobs, catalogue_prices(config), since, until,
                                config.decision.active_window_seconds)
    report.sources = {"instances": "provisioner.store_url", "jobs": "decision.store_url" if jobs is not None else ""}
    if jobs is None:
        report.warnings.insert(0, f"{why_jobs}: which jobs ran where is unknown here — the total is right, the "
                                  f"paid time is shown under {NO_JOBS!r} instead of accounts")
    return report


def table(report: CostReport, by: list[str]) -> dict[str, Any]:
    t = total(report.usage)

    def row(u: Usage) -> dict[str, Any]:
        return {"node_hours": round(u.node_seconds / 3600, 4), "cost": round(u.cost, 4),
                "unpriced_node_hours": round(u.unpriced_seconds / 3600, 4)}

    return {"since": report.since, "until": report.until, "by": by,
            "rows": [{**dict(zip(by, k, strict=True)), **row(u)} for k, u in group(report.usage, by)],
            "total": {**row(t), "complete": t.unpriced_seconds == 0},
            "warnings": list(report.warnings), "sources": dict(report.sources)}


def _cost(r: dict[str, Any]) -> str:
    return f"{r['cost']:.2f}" + (" + unpriced" if r["unpriced_node_hours"] else "")


def _print_table(result: dict[str, Any]) -> None:
    by = result["by"]
    rows = [[str(r[d]) or "-" for d in by] + [f"{r['node_hours']:.2f}", _cost(r)] for r in result["rows"]]
    t = result["total"]
    rows.append(["TOTAL"] + [""] * (len(by) - 1) + [f"{t['node_hours']:.2f}", _cost(t)])
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
        config = load_or_exit(args.config)
        result = table(read_report(config, since, until, now), by)
    except CostError as exc:
        print(f"epu cost: {exc}", file=sys.stderr)
        return 2
    for w in result["warnings"]:
        print(f"epu cost: warning: {w}", file=sys.stderr)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    elif args.csv:
        w = csv.writer(sys.stdout)
        w.writerow([*by, "node_hours", "cost", "unpriced_node_hours"])
        for r in result["rows"]:
            w.writerow([*(r[d] for d in by), r["node_hours"], r["cost"], r["unpriced_node_hours"]])
        t = result["total"]
        w.writerow(["TOTAL", *[""] * (len(by) - 1), t["node_hours"], t["cost"], t["unpriced_node_hours"]])
    else:
        _print_table(result)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    from epu.common.cliargs import add_config_arg

    p = sub.add_parser(
        "cost", help="node-hours and cost per domain, site, type, account, user, partition", formatter_class=RAW,
        description="Print node-hours and cost for a period, grouped by --by, from the records the\n"
                    "services keep: the provisioner's store (each instance's launch, end and price at\n"
                    "launch: what was paid) and the decision engine's (which job ran on which\n"
                    "instance, and when: whose it was). Nothing has to be running to keep them.\n"
                    "Each paid node-second is shared equally among the jobs running on the node then\n"
                    f"(their account, user, partition); time with no job on the node (booting, idle,\n"
                    f"draining) goes to the account {IDLE}. The sum over accounts is the total.\n"
                    "An instance is billed from its launch request to its end (as the spend cap counts\n"
                    "it) at the price recorded at its launch; one without (launched before prices were\n"
                    "kept) at the configuration's catalogue, with a warning; one no one priced is shown\n"
                    "as 'unpriced' node-hours, never as 0, and the total says it is incomplete.\n"
                    "Run it where both stores are readable (the control-plane host); without the\n"
                    f"engine's store the total is still right, under the account {NO_JOBS}.",
        epilog="Examples:\n  epu cost --since 24h --by account -c /etc/epu/epu.toml\n"
               "  epu cost --since 2026-11-01 --until 2026-12-01 --by domain,site,type --csv\n"
               "  epu cost --since 7d --by account,user,partition --json\n\n"
               "Exit status: 0 table printed (warnings on standard error); 2 bad option, bad\n"
               "configuration, or the provisioner's store cannot be read here.")
    p.add_argument("--since", metavar="WHEN", help="start: ISO 8601 (UTC) or a duration ago (24h, 7d); default: "
                                                   "the first record")
    p.add_argument("--until", metavar="WHEN", help="end (default: now)")
    p.add_argument("--by", default="account", help=f"dimensions, comma-separated: {', '.join(DIMENSIONS)} "
                                                    "(default: account)")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="one JSON object: rows, total (complete: no unpriced "
                                                          "time), warnings, period")
    fmt.add_argument("--csv", action="store_true", help="CSV with a TOTAL row")
    add_config_arg(p)
    p.set_defaults(func=cmd_cost)
