"""``epu instances``: what the provisioner knows about instances, and terminating one.

``list`` reads the provisioner's store directly where this host and user can (read-only; works
while the service runs, SQLite WAL or PostgreSQL), the decision engine's retained status over
the broker elsewhere (``common.storeaccess``). ``terminate`` does not touch a cloud. Without
``--force`` it asks the decision engine to take the instance out the way the engine takes out
any worker — drain it, wait for its jobs, remove its node from the batch system, then terminate
— by sending a ``PolicyChange`` with ``retire=[ID]`` to the engine's control queue. With
``--force`` it sends a ``TerminateRequest`` to the provisioners' work queue: the instance goes at
once, jobs or not. Either way it waits for the answer (``common.answers``) and exits non-zero on
a refusal or none; an id neither the store nor the engine knows is never sent.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from epu.common.cliargs import add_config_arg, load_or_exit, nonneg_float
from epu.common.messages import (
    INSTANCE_STATE_ORDER,
    TERMINAL_INSTANCE_STATES,
    EngineStatus,
    InstanceEvent,
    InstanceStatus,
    Message,
    PolicyChange,
    TerminateRequest,
    new_id,
)
from epu.common.retire import Proof, RetireReason

RAW = argparse.RawDescriptionHelpFormatter

LIST_DESCRIPTION = """\
List the instances in the provisioner's store (provisioner.store_url), oldest first, with
whether each has joined the batch system, from the decision engine's retained status (the
queue epu.status.DOMAIN, read and left in place; the operator's read access suffices).

Columns: INSTANCE (= launch id), DOMAIN, SITE, STATE, BATCH, NODE (batch node name), IP,
CLOUD_ID, AGE (since the launch was requested, on every row; "-" where an older engine's
status does not say) and REASON (why it last changed state).

States, in the order they move (never backwards): requested, pending, started, joined,
draining, terminating, terminated; failed is terminal. The provisioner sets the cloud states
(requested, pending, started, terminating, terminated, failed); joined and draining are the
decision engine's, and STATE shows the furthest of the two. BATCH: "yes (STATE)" when the
instance's node is in the batch system (with the node's state in the newest snapshot), "no"
when it is not, "-" when the engine does not list the instance (ended, or not seen yet), "?"
when the engine's status could not be read (the reason is printed on standard error).

On a host without the provisioner's store (an operator's workstation: the SQLite file named by
provisioner.store_url does not exist, or this install has no SQL layer) or where this user may
not read it (/var/lib/epu-provisioner is closed to a non-root operator), it lists the engine's
live instances from its status alone, says why on standard error, and creates nothing.
"""

LIST_EPILOG = """\
examples:
  epu instances list -c /etc/epu/epu.toml
  epu instances list --domain alpha --active
  epu instances list --json | jq '.[] | select(.in_batch == false and .state == "started")'
  epu instances list --json | jq '.[] | select(.state == "failed") | .reason'
  epu instances list --no-engine        # the store only, no broker access

files and environment: the configuration (-c, $EPU_CONFIG, /etc/epu/epu.toml) names the store
(provisioner.store_url) and the broker; EPU_SECTION__KEY variables override it.

exit status: 0 on success (also when the engine's status cannot be read: BATCH shows "?"),
2 on a bad configuration, or with --no-engine where the store does not exist.
"""

TERMINATE_DESCRIPTION = """\
Take instance ID out of service.

Without --force (the safe way, what the engine does for any worker): the decision engine
drains the node (no new job lands there), waits until no job runs on it, removes it from the
batch system and only then terminates the instance; a replacement is launched if the policy
still wants one. The request goes to the engine's control queue (an operator needs no more
than decision.control permission) and is answered like `epu policy set`.

With --force: a TerminateRequest goes straight to the provisioners — the instance is
terminated at once, killing whatever runs there; its batch node is removed afterwards. Once a
provisioner has answered, the decision engine is told, for the record: the forced terminate
shows in `epu policy history` (a warning says so when the engine does not answer; the
terminate stands either way).

Either way the command waits for the answer (--timeout) and prints it: the engine's acceptance or
its reason for refusing; with --force, the instance's move to terminating reported by a
provisioner. The instance must be one this host can see — in the provisioner's store, or among
the engine's live instances (its retained status, over the broker) — so a mistyped id sends
nothing. ID may be the first characters of the id, as `epu status` shows it, or the batch node
name of a live instance, when they name one instance only. Asking twice is harmless, and an instance already terminated stays so. Watch it
with `epu tap 'instance.state.#'` or `epu instances list`.
"""

TERMINATE_EPILOG = """\
examples:
  epu instances terminate launch-7f3a -c /etc/epu/epu.toml --reason "stuck booting"
  epu instances terminate 4b1c --domain alpha --force      # now, even with jobs running

exit status: 0 when the engine accepted the request (with --force: a provisioner reported the
instance terminating), or the instance is already gone; 1 when the engine refused (its reason is
printed), no answer came within --timeout, no instance has that id (nothing is sent), or the
broker refused or cannot be reached; 2 on a bad configuration, an id prefix that matches
several instances, or an unknown --domain (not in the configuration's [domains], or not in the
decision engine's store where this host can read it).
"""


def _store(config):  # noqa: ANN001, ANN202 - small helper, typed at the call sites
    from epu.services.provisioner.store import Store

    return Store(config.provisioner.store_url)


@dataclass
class EngineView:
    """What the decision engine's retained statuses say about instances."""

    entries: dict[str, InstanceStatus] | None
    """Instance id → the engine's entry; None when the statuses could not be read at all."""
    domain_of: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def engine_view(config: Any, domains: list[str]) -> EngineView:
    """The engine's entries over the retained statuses of ``domains``; domains without a status,
    or a broker that cannot be read, are named in the notes."""
    from epu.common.retained import engine_statuses

    try:
        found, why = engine_statuses(config.broker_obj(), domains)
    except Exception as exc:
        return EngineView(None, notes=[f"the engine's status could not be read ({type(exc).__name__}: {exc}); "
                                       "BATCH is ?"])
    statuses = {d: m for d, m in found.items() if isinstance(m, EngineStatus)}
    return EngineView({i.instance_id: i for m in statuses.values() for i in m.instances},
                      {i.instance_id: d for d, m in statuses.items() for i in m.instances},
                      [f"domain {d}: {reason}; BATCH is -" for d, reason in sorted(why.items())])


def engine_only(view: EngineView, domain: str | None) -> list[Any]:
    """Rows for a host without the provisioner's store: the engine's live instances, shaped like
    store records (no cloud id). ``created_at`` is when the launch was asked for, as in the
    store's rows (None where an older engine's status does not say: AGE shows "-"), so AGE means
    one thing on every row (issue 34: it was the time in the current state here)."""
    out = []
    for iid, e in sorted((view.entries or {}).items(),
                         key=lambda kv: (kv[1].launched_at if kv[1].launched_at is not None else kv[1].since, kv[0])):
        if domain is None or view.domain_of[iid] == domain:
            out.append(SimpleNamespace(instance_id=iid, domain=view.domain_of[iid], site=e.site, node_name=e.node_name,
                                       cores=0, state=e.state, seq=e.seq, cloud_id=None, ip=e.ip, reason=e.retire,
                                       error_kind=None, created_at=e.launched_at, updated_at=e.since,
                                       presumed_gone_at=None))
    return out


def merged(record: Any, engine: dict[str, InstanceStatus] | None) -> dict[str, Any]:
    """A store record with the engine's view: ``state`` the furthest of the two (the engine's
    joined and draining are never stored by the provisioner), ``in_batch`` (None: unknown),
    ``node_state``, ``engine_state``."""
    doc = dict(record.__dict__)
    entry = engine.get(record.instance_id) if engine is not None else None
    doc["engine_state"] = entry.state if entry is not None else None
    doc["in_batch"] = None if engine is None else bool(entry is not None and entry.in_batch)
    doc["node_state"] = entry.node_state if entry is not None else None
    if (entry is not None and record.state not in TERMINAL_INSTANCE_STATES
            and INSTANCE_STATE_ORDER[entry.state] > INSTANCE_STATE_ORDER[record.state]):
        doc["state"] = entry.state
    return doc


def _batch(doc: dict[str, Any], engine: dict[str, InstanceStatus] | None) -> str:
    if engine is None:
        return "?"
    if doc["engine_state"] is None:
        return "-"
    return f"yes ({doc['node_state'] or 'not listed'})" if doc["in_batch"] else "no"


def _read_records(config: Any, domain: str | None = None, active: bool = False) -> tuple[list[Any], str | None]:
    """The provisioner store's records, or why this host cannot read them (see common.storeaccess)."""
    from epu.common.storeaccess import read_store

    def read() -> list[Any]:
        store = _store(config)
        try:
            return store.list(domain=domain, active_only=active)
        finally:
            store.close()

    records, why = read_store(config.provisioner.store_url, "provisioner.store_url", read)
    return records or [], why


def cmd_list(args: argparse.Namespace) -> int:
    config = load_or_exit(args.config)
    records, why = _read_records(config, args.domain, args.active)
    if why is not None and args.no_engine:
        print(f"epu instances list: {why}: run it where the provisioner's store is, or without --no-engine for "
              "the decision engine's view", file=sys.stderr)
        return 2
    engine: dict[str, InstanceStatus] | None = {}
    if not args.no_engine:
        domains = sorted({args.domain} if args.domain else set(config.domains) | {r.domain for r in records})
        view = engine_view(config, domains)
        engine = view.entries
        notes = view.notes
        if why is not None:
            records = engine_only(view, args.domain)
            notes = [f"{why}: the decision engine's live instances only (no cloud ids, nothing ended)", *notes]
        for note in notes:
            print(f"epu instances list: {note}", file=sys.stderr)
    docs = [merged(r, None if args.no_engine else engine) for r in records]
    if args.json:
        print(json.dumps(docs, indent=2))
        return 0
    now = time.time()
    header = ("INSTANCE", "DOMAIN", "SITE", "TYPE", "STATE", "BATCH", "NODE", "IP", "CLOUD_ID", "AGE", "REASON")
    rows = [header] + [
        (d["instance_id"], d["domain"], d["site"], d.get("instance_type") or "-", d["state"],
         "-" if args.no_engine else _batch(d, engine), d["node_name"], d["ip"] or "-", d["cloud_id"] or "-",
         "-" if d["created_at"] is None else _age(now - d["created_at"]), d["reason"][:60])
        for d in docs]
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(header) - 1)]
    for row in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + str(row[-1]))
    return 0


def _age(seconds: float) -> str:
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    return f"{s // 3600}h"


def terminate_message(instance_id: str, domain: str, reason: str, force: bool,
                      operator: str = "") -> Message:
    """What ``epu instances terminate`` sends (the simulator sends the same): forced, a
    TerminateRequest to the provisioners; otherwise a retire request to the decision engine,
    which drains, removes and then terminates (see the module docstring)."""
    if force:
        return TerminateRequest(request_id=new_id(), instance_id=instance_id, domain=domain, reason=reason,
                                force=True, retire=RetireReason.OPERATOR, proof=Proof.FORCED)
    return PolicyChange(change_id=new_id(), domain=domain, retire=[instance_id], operator=operator or reason)


def forced_record(instance_id: str, domain: str, operator: str) -> PolicyChange:
    """What ``epu instances terminate --force`` sends the decision engine once a provisioner has
    answered (the simulator sends the same): the record of the forced terminate, for the
    domain's history (``epu policy history``; issue 34: forced terminations were missing from it).
    The engine acts on nothing in it."""
    return PolicyChange(change_id=new_id(), domain=domain, forced_terminate=[instance_id], operator=operator)


@dataclass
class Known:
    """An instance as the operator's host can see it: from the provisioner's store, or the
    decision engine's retained status."""

    instance_id: str
    domain: str
    state: str
    node_name: str = ""


def find_instances(config: Any, domain: str | None) -> tuple[dict[str, Known], list[str]]:
    """Every instance this host can see (store first, then the engine's live ones), and notes on
    what could not be read."""
    known: dict[str, Known] = {}
    notes: list[str] = []
    records, why = _read_records(config, domain)
    if why is not None:
        notes.append(why)
    for r in records:
        known[r.instance_id] = Known(r.instance_id, r.domain, r.state, r.node_name or "")
    domains = sorted({domain} if domain else set(config.domains) | {r.domain for r in records})
    if domains:
        view = engine_view(config, domains)
        notes += view.notes
        for iid, entry in (view.entries or {}).items():
            rec = known.get(iid)
            if rec is None or (rec.state not in TERMINAL_INSTANCE_STATES
                               and INSTANCE_STATE_ORDER[entry.state] > INSTANCE_STATE_ORDER[rec.state]):
                known[iid] = Known(iid, view.domain_of[iid], entry.state, entry.node_name or (rec.node_name if rec else ""))
    elif why is not None:
        notes.append("the configuration names no domain: give --domain to ask the decision engine")
    return known, notes


def resolve(ident: str, known: dict[str, Known]) -> Known | list[str]:
    """The instance ``ident`` names, as ``epu status`` and ``epu instances list`` show it: its
    full id, a prefix of one id only (the board shows the first 12 characters), or the batch node
    name of one live instance only. The ids it could mean otherwise ([]: none)."""
    if ident in known:
        return known[ident]
    matches = sorted(i for i in known if i.startswith(ident))
    if not matches:
        matches = sorted(k.instance_id for k in known.values()
                         if k.node_name == ident and k.state not in TERMINAL_INSTANCE_STATES)
    return known[matches[0]] if len(matches) == 1 else matches


def _unknown_domain(config: Any, domain: str) -> str | None:
    """Why ``domain`` is no domain of this configuration (None: it is one, or the file names no
    domain — then the provisioner's store and the engine's answer tell). The decision CLI asks the
    engine's store too (``epu policy history``); this one stays within the provisioner's side."""
    if not config.domains or domain in config.domains:
        return None
    return f"unknown domain {domain!r} (the configuration's [domains]: {', '.join(sorted(config.domains))})"


def cmd_terminate(args: argparse.Namespace) -> int:
    import getpass

    from epu.common.answers import request

    config = load_or_exit(args.config)
    if args.domain is not None:
        from epu.common.topology import check_name

        try:
            check_name(args.domain)
        except ValueError as exc:
            print(f"epu instances terminate: {exc}", file=sys.stderr)
            return 2
        problem = _unknown_domain(config, args.domain)  # before the broker, whose answer is a bare 403
        if problem is not None:
            print(f"epu instances terminate: {problem}; nothing sent", file=sys.stderr)
            return 2
    known, notes = find_instances(config, args.domain)
    found = resolve(args.instance_id, known)
    if isinstance(found, list):
        where = f" in domain {args.domain}" if args.domain else ""
        if found:
            print(f"epu instances terminate: {args.instance_id!r} could be any of {', '.join(found[:10])}: give more "
                  "of the id", file=sys.stderr)
            return 2
        print(f"epu instances terminate: no instance {args.instance_id}{where} (neither the provisioner's store nor "
              f"the decision engine's status lists it); nothing sent" + "".join(f"; {n}" for n in notes),
              file=sys.stderr)
        return 1
    if args.domain is not None and found.domain != args.domain:
        print(f"epu instances terminate: instance {found.instance_id} is in domain {found.domain}, not "
              f"{args.domain}; nothing sent", file=sys.stderr)
        return 1
    iid, domain = found.instance_id, found.domain
    if args.force and found.state in (*TERMINAL_INSTANCE_STATES, "terminating"):
        print(f"instance {iid} (domain {domain}) is already {found.state}: nothing to do")
        return 0
    req = terminate_message(iid, domain, args.reason, args.force, operator=f"{getpass.getuser()} ({args.reason})")
    if isinstance(req, TerminateRequest):
        answer = request(config.broker_obj(), req, f"instance.state.{domain}.*",
                         lambda m: (isinstance(m, InstanceEvent) and m.instance_id == iid
                                    and m.state in ("terminating", "terminated", "failed")),
                         timeout=args.timeout, source="epu-cli")
        if answer is None:
            print(f"epu instances terminate: no answer from a provisioner within {args.timeout:.0f}s (is one "
                  f"running?); the request {req.request_id} stays queued", file=sys.stderr)
            return 1
        print(f"forced terminate: instance={iid} domain={domain} is {answer.state}"
              f"{f' ({answer.reason})' if answer.reason else ''}")
        record = forced_record(iid, domain, f"{getpass.getuser()} ({args.reason})")
        noted = request(config.broker_obj(), record, f"policy.outcome.{domain}",
                        lambda m: getattr(m, "change_id", None) == record.change_id,
                        timeout=min(args.timeout, 15.0), source=f"cli:{getpass.getuser()}")
        if noted is None or not noted.applied:
            why = "no answer from the decision engine" if noted is None else f"the engine refused: {noted.reason}"
            print(f"epu instances terminate: not recorded in `epu policy history` ({why}); the terminate "
                  "itself stands", file=sys.stderr)
        return 0
    outcome = request(config.broker_obj(), req, f"policy.outcome.{domain}",
                      lambda m: getattr(m, "change_id", None) == req.change_id,
                      timeout=args.timeout, source=f"cli:{getpass.getuser()}")
    if outcome is None:
        print(f"epu instances terminate: no answer from the decision engine within {args.timeout:.0f}s (is it "
              f"running for {domain}?); the request {req.change_id} stays queued", file=sys.stderr)
        return 1
    if not outcome.applied:
        print(f"epu instances terminate: the decision engine refused: {outcome.reason}", file=sys.stderr)
        return 1
    print(f"drain and terminate accepted by the decision engine: instance={iid} domain={domain} "
          f"change_id={req.change_id}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("instances", help="list instances, terminate one", formatter_class=RAW,
                       description="Instances known to the provisioner: list them (with the decision engine's\n"
                                   "view: joined to the batch system or not), or take one out of service.",
                       epilog="Examples:\n  epu instances list --active\n"
                              "  epu instances terminate launch-7f3a --reason 'stuck booting'\n\n"
                              "Exit status: see each ACTION's --help; 2 when no ACTION is given.")
    isub = p.add_subparsers(dest="instances_command", metavar="ACTION")
    p.set_defaults(func=lambda args: p.print_help() or 2)

    lp = isub.add_parser("list", help="list instances (table or JSON)", description=LIST_DESCRIPTION,
                         epilog=LIST_EPILOG, formatter_class=RAW)
    add_config_arg(lp)
    lp.add_argument("--domain", metavar="D", help="only instances of domain D")
    lp.add_argument("--active", action="store_true", help="hide terminated and failed instances")
    lp.add_argument("--json", action="store_true",
                    help="print a JSON array, one object per instance: the store's fields plus engine_state, "
                         "in_batch (true, false, or null when unknown) and node_state")
    lp.add_argument("--no-engine", action="store_true",
                    help="do not read the engine's status (no broker access): the store's states only")
    lp.set_defaults(func=cmd_list)

    tp = isub.add_parser("terminate", help="terminate instance ID (idempotent)",
                         description=TERMINATE_DESCRIPTION, epilog=TERMINATE_EPILOG, formatter_class=RAW)
    add_config_arg(tp)
    tp.add_argument("instance_id", metavar="ID",
                    help="the instance id (= its launch id), its first characters as `epu status` shows them, "
                         "or its batch node name")
    tp.add_argument("--domain", metavar="D", help="the instance's domain (default: looked up in the store or the engine's status)")
    tp.add_argument("--reason", default="terminated by an operator", help="recorded with the transition")
    tp.add_argument("--timeout", type=nonneg_float, default=30.0,
                    help="seconds to wait for the answer of the engine (or, with --force, a provisioner); default 30")
    tp.add_argument("--force", action="store_true",
                    help="terminate at once through the provisioners, even with jobs running "
                         "(default: the engine drains, removes, then terminates)")
    tp.set_defaults(func=cmd_terminate)
