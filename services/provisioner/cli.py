"""``epu instances``: what the provisioner knows about instances, and terminating one.

``list`` reads the provisioner's store directly (read-only; works while the service runs,
SQLite WAL or PostgreSQL). ``terminate`` does not touch a cloud. Without ``--force`` it asks
the decision engine to take the instance out the way the engine takes out any worker — drain
it, wait for its jobs, remove its node from the batch system, then terminate — by sending a
``PolicyChange`` with ``retire=[ID]`` to the engine's control queue. With ``--force`` it sends a
``TerminateRequest`` to the provisioners' work queue: the instance goes at once, jobs or not.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from epu.common.cliargs import add_config_arg, load_or_exit
from epu.common.messages import Message, PolicyChange, TerminateRequest, new_id

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
Take instance ID out of service.

Without --force (the safe way, what the engine does for any worker): the decision engine
drains the node (no new job lands there), waits until no job runs on it, removes it from the
batch system and only then terminates the instance; a replacement is launched if the policy
still wants one. The request goes to the engine's control queue (an operator needs no more
than decision.control permission) and is answered like `epu policy set`.

With --force: a TerminateRequest goes straight to the provisioners — the instance is
terminated at once, killing whatever runs there; its batch node is removed afterwards.

Either way the request is idempotent: asking twice is harmless, and an instance already
terminated stays so. Watch it with `epu tap 'instance.state.#'` or `epu instances list`.
"""

TERMINATE_EPILOG = """\
examples:
  epu instances terminate launch-7f3a -c /etc/epu/epu.toml --reason "stuck booting"
  epu instances terminate 4b1c --domain alpha --force      # now, even with jobs running

exit status: 0 when the request was accepted by the broker, 1 if it could not be sent,
2 on a bad configuration or when the domain cannot be determined.
"""


def _store(config):  # noqa: ANN001, ANN202 - small helper, typed at the call sites
    from epu.services.provisioner.store import Store

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
    header = ("INSTANCE", "DOMAIN", "SITE", "TYPE", "STATE", "NODE", "IP", "CLOUD_ID", "AGE", "REASON")
    rows = [header] + [
        (r.instance_id, r.domain, r.site, r.instance_type or "-", r.state, r.node_name, r.ip or "-",
         r.cloud_id or "-", _age(now - r.created_at), r.reason[:60]) for r in records]
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
                                force=True)
    return PolicyChange(change_id=new_id(), domain=domain, retire=[instance_id], operator=operator or reason)


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
    import getpass

    from epu.common.broker import Publisher

    req = terminate_message(args.instance_id, domain, args.reason, args.force,
                            operator=f"{getpass.getuser()} ({args.reason})")
    publisher = Publisher(config.broker_obj(), source="epu-cli")
    try:
        publisher.publish(req)
    except Exception as exc:
        print(f"epu: could not send the request: {exc}", file=sys.stderr)
        return 1
    finally:
        publisher.close()
    if isinstance(req, TerminateRequest):
        print(f"forced terminate requested: instance={req.instance_id} domain={domain} "
              f"request_id={req.request_id}")
    else:
        print(f"drain and terminate requested from the decision engine: instance={args.instance_id} "
              f"domain={domain} change_id={req.change_id}")
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
                    help="terminate at once through the provisioners, even with jobs running "
                         "(default: the engine drains, removes, then terminates)")
    tp.set_defaults(func=cmd_terminate)
