"""``epu instances``: what the provisioner knows about instances, and terminating one.

``list`` reads the provisioner's store directly (read-only; works while the service runs,
SQLite WAL or PostgreSQL). ``terminate`` does not touch a cloud: it sends a
``TerminateRequest`` to the provisioners' work queue, so the one path that records intent,
retries and reports is also the operator's.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from common.cli_core import add_config_arg, load_or_exit
from common.messages import TerminateRequest, new_id

RAW = argparse.RawDescriptionHelpFormatter

LIST_DESCRIPTION = """\
List the instances in the provisioner's store (provisioner.store_url), oldest first.

Columns: INSTANCE (= launch id), DOMAIN, SITE, STATE, NODE (batch node name), IP, CLOUD_ID,
AGE (since the launch was requested) and REASON (why it last changed state).

States, in the order they move (never backwards): requested, pending, started, joined,
draining, terminating, terminated; failed is terminal. The provisioner sets the cloud states
(requested, pending, started, terminating, terminated, failed); joined and draining are
tracked by the decision engine.
"""

LIST_EPILOG = """\
examples:
  epu instances list -c /etc/epu/epu.toml
  epu instances list --domain alpha --active
  epu instances list --json | jq '.[] | select(.state == "failed") | .reason'

exit status: 0 on success, 2 on a bad configuration.
"""

TERMINATE_DESCRIPTION = """\
Ask the provisioners to terminate instance ID (send a TerminateRequest to their work queue).

Terminate is idempotent: asking twice is harmless, and an instance already terminated
stays so. The request is recorded before the cloud call; watch it with
`epu tap 'instance.state.#'` or `epu instances list`. An ID the store does not know is
recorded as terminated (so a late launch with that id never starts).
"""

TERMINATE_EPILOG = """\
examples:
  epu instances terminate launch-7f3a -c /etc/epu/epu.toml --reason "stuck booting"
  epu instances terminate 4b1c --domain alpha

exit status: 0 when the request was accepted by the broker, 1 if it could not be sent,
2 on a bad configuration or when the domain cannot be determined.
"""


def _store(config):  # noqa: ANN001, ANN202 - small helper, typed at the call sites
    from services.provisioner.store import Store

    return Store(config.provisioner.store_url)


def cmd_list(args: argparse.Namespace) -> int:
    config = load_or_exit(args.config)
    store = _store(config)
    try:
        records = store.list(domain=args.domain, active_only=args.active)
    finally:
        store.close()
    if args.json:
        print(json.dumps([r.__dict__ for r in records], indent=2))
        return 0
    now = time.time()
    header = ("INSTANCE", "DOMAIN", "SITE", "STATE", "NODE", "IP", "CLOUD_ID", "AGE", "REASON")
    rows = [header] + [
        (r.instance_id, r.domain, r.site, r.state, r.node_name, r.ip or "-", r.cloud_id or "-",
         _age(now - r.created_at), r.reason[:60]) for r in records]
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


def cmd_terminate(args: argparse.Namespace) -> int:
    config = load_or_exit(args.config)
    domain = args.domain
    if domain is None:
        store = _store(config)
        try:
            rec = store.get(args.instance_id)
        finally:
            store.close()
        if rec is None:
            print(f"epu: instance {args.instance_id} is not in the store; give --domain", file=sys.stderr)
            return 2
        domain = rec.domain
    from common.broker import Publisher

    req = TerminateRequest(request_id=new_id(), instance_id=args.instance_id, domain=domain,
                           reason=args.reason, force=args.force)
    publisher = Publisher(config.broker_obj(), source="epu-cli")
    try:
        publisher.publish(req)
    except Exception as exc:
        print(f"epu: could not send the request: {exc}", file=sys.stderr)
        return 1
    finally:
        publisher.close()
    print(f"terminate requested: instance={req.instance_id} domain={domain} request_id={req.request_id}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("instances", help="list instances, terminate one", formatter_class=RAW,
                       description="Instances known to the provisioner: list them, or terminate one.")
    isub = p.add_subparsers(dest="instances_command", metavar="ACTION")
    p.set_defaults(func=lambda args: p.print_help() or 2)

    lp = isub.add_parser("list", help="list instances (table or JSON)", description=LIST_DESCRIPTION,
                         epilog=LIST_EPILOG, formatter_class=RAW)
    add_config_arg(lp)
    lp.add_argument("--domain", metavar="D", help="only instances of domain D")
    lp.add_argument("--active", action="store_true", help="hide terminated and failed instances")
    lp.add_argument("--json", action="store_true", help="print a JSON array (one object per instance)")
    lp.set_defaults(func=cmd_list)

    tp = isub.add_parser("terminate", help="terminate instance ID (idempotent)",
                         description=TERMINATE_DESCRIPTION, epilog=TERMINATE_EPILOG, formatter_class=RAW)
    add_config_arg(tp)
    tp.add_argument("instance_id", metavar="ID", help="the instance id (= its launch id)")
    tp.add_argument("--domain", metavar="D", help="the instance's domain (default: looked up in the store)")
    tp.add_argument("--reason", default="terminated by an operator", help="recorded with the transition")
    tp.add_argument("--force", action="store_true",
                    help="mark the request forced (the engine's drain-first rule does not apply)")
    tp.set_defaults(func=cmd_terminate)
