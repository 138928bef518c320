"""``epu ctx``: administer contexts and run the node agent.

The admin commands talk HTTPS to a running broker with its admin token. Where the broker is,
its token and the certificate to trust default to the ``[ctxbroker]`` section of the
config, so on the broker host ``epu ctx list -c /etc/epu/epu.toml`` just works.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

RAW = argparse.RawDescriptionHelpFormatter

CTX_DESCRIPTION = """\
Administer contexts of the EPU context broker, and run the agent on a node.

A context is one cluster's shared view: an ordered list of joins and leaves (ids 1, 2, ...).
Nodes join with their host name, FQDN, IP and SSH host key; every node's agent applies the
list in order with the administrator's scripts (hosts, ssh_known_hosts, MPI hostfile).

Admin commands need the broker URL, the admin token and the certificate to trust. They
default to the [ctxbroker] section of the config (-c FILE): public_url (or https://host:port),
admin_token_file and cert_file. Override with --url, --token-file, --ca-file.
"""

CTX_EPILOG = """\
Examples:
  epu ctx create alpha --secret-file /etc/epu/contexts/alpha.secret   # for [workers.alpha]
  epu ctx create mycluster --json > ctx.json     # id, uri, key, secret (secret shown once)
  epu ctx list
  epu ctx nodes 3f2a9c1e0b7d4e21
  epu ctx credential 3f2a9c1e0b7d4e21 head --env > /etc/epu/context.env   # the head node's own
  epu ctx remove-node 3f2a9c1e0b7d4e21 wn-7
  epu ctx delete 3f2a9c1e0b7d4e21
  epu ctx agent --env /etc/epu/context.env

Exit status: 0 success; 1 the broker refused or could not be reached (the message says
which, e.g. "401: missing or wrong admin token", "404: unknown context"); 2 bad usage.
"""

AGENT_DESCRIPTION = """\
Run the context agent on this node until SIGTERM/SIGINT.

The agent reads the context URI, key and secret from cloud-init userdata (default
/var/lib/cloud/instance/user-data.txt: #cloud-config with an epu_context: mapping, JSON, or
EPU_CTX_URI= / EPU_CTX_KEY= / EPU_CTX_SECRET= lines) and/or from --config FILE (JSON or
TOML with the same keys plus local settings). It then:

  1. runs SCRIPTS/init.d/* once (first start only);
  2. joins the context with this node's short host name, FQDN, IP and SSH host key
     (detected, or set in the config: hostname, fqdn, ip, ssh_host_key, data, instance_id);
  3. long-polls the broker and applies each new entry in order: SCRIPTS/add-node.d/* for a
     join, SCRIPTS/delete-node.d/* for a leave, with the node's fields as EPU_NODE_*
     environment variables (never through a shell); then SCRIPTS/restart.d/* once per batch.
     A new agent gets the current members as one snapshot instead of the whole history;
  4. records the last applied id in STATE/state.json after every entry, so a restart
     re-applies nothing; retries with backoff while the broker is unreachable;
  5. leaves the context on shutdown.
"""

AGENT_EPILOG = """\
Config keys (file or flags): uri, key, secret, ca_file | ca_pem_b64, insecure, scripts_dir
(/etc/epu/ctx-scripts), state_dir (/var/lib/epu-ctx), root (/), change_log
(ROOT/var/log/epu-ctx.log), long_poll (true), wait (30), poll_interval (120, when long_poll
is false), script_timeout, hostname, fqdn, ip, ssh_host_key | ssh_host_key_file, data,
instance_id. With a node credential (key node/HOSTNAME/INSTANCE_ID, as the provisioner
renders into userdata) hostname and instance_id default to the ones it names.

Examples:
  epu ctx agent --userdata /var/lib/cloud/instance/user-data.txt \\
      --scripts-dir /etc/epu/ctx-scripts --state-dir /var/lib/epu-ctx
  epu-ctx-agent --env /etc/epu/context.env --ca-file /etc/epu/tls/ctxbroker.crt --daemon

Files: STATE/state.json (last applied entry), STATE/members.json, STATE/agent.log (--daemon),
ROOT/var/log/epu-ctx.log (every change applied). The environment of each script: EPU_NODE_*.
Exit status: 0 stopped by SIGTERM/SIGINT (after leaving the context); 2 bad configuration
(no context URI, key or secret found, an unreadable file).
"""


ADMIN_EXIT = """
Files and environment: the broker, its admin token and the certificate to trust come from
[ctxbroker] public_url, admin_token_file and cert_file of the config (-c FILE, $EPU_CONFIG,
/etc/epu/epu.toml), or --url, --token-file and --ca-file (then no config is needed).
Exit status: 0 success; 1 the broker refused or could not be reached (the message says which,
e.g. "401: missing or wrong admin token", "404: unknown context"); 2 bad usage, configuration
or an unreadable token file."""


def _admin_epilog(*examples: str) -> str:
    """The man-page tail of an admin command: its examples, then where its settings come from and
    its exit status (the same for every admin command)."""
    return "Examples:\n" + "\n".join(f"  {e}" for e in examples) + "\n" + ADMIN_EXIT


def _admin(args: argparse.Namespace) -> Any:
    from epu.common.cliargs import load_or_exit
    from epu.services.ctxbroker.client import AdminClient

    # with --url and --token-file the broker is fully named: no config needed
    config = load_or_exit(args.config, required=not (args.url and args.token_file))
    c = config.ctxbroker
    url = args.url or c.public_url or f"https://{'localhost' if c.host in ('0.0.0.0', '::') else c.host}:{c.port}"
    token_file = args.token_file or c.admin_token_file or "epu-ctxbroker.admin-token"
    token = read_token(token_file)
    ca = args.ca_file or c.cert_file
    if ca is None and Path(token_file).parent.joinpath("epu-ctxbroker-tls", "cert.pem").exists():
        ca = str(Path(token_file).parent / "epu-ctxbroker-tls" / "cert.pem")
    return AdminClient(url, token, ca_file=ca, insecure=args.insecure)


#: What an admin token may hold: one word of printable ASCII (the broker writes URL-safe base64),
#: i.e. what an HTTP header value can carry.
TOKEN_CHARS = frozenset(chr(c) for c in range(0x21, 0x7f))


def read_token(token_file: str) -> str:
    """The admin token in ``token_file``, or exit 2 saying what is wrong with the file — never
    what it holds. Why: a wrong file (a passwords file, a config) once went out as the HTTP
    header, and the client's "Illegal header value" error printed it whole."""
    try:
        token = Path(token_file).read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not text"
        print(f"epu ctx: cannot read admin token file {token_file}: {why}", file=sys.stderr)
        raise SystemExit(2) from None
    if not token or not set(token) <= TOKEN_CHARS:
        what = "is empty" if not token else (
            f"holds {len(token.splitlines())} lines" if "\n" in token else "holds characters a token never has")
        print(f"epu ctx: {token_file} is not an admin token file: it {what} (give the file [ctxbroker] "
              "admin_token_file names, one line written by the context broker)", file=sys.stderr)
        raise SystemExit(2)
    return token


def _run(args: argparse.Namespace, fn: Any) -> int:
    from epu.services.ctxbroker.client import BrokerError

    client = _admin(args)
    try:
        return int(fn(client) or 0)
    except BrokerError as exc:
        token = str(client.http.headers.get("Authorization", "")).removeprefix("Bearer ")
        text = str(exc).replace(token, "***") if token else str(exc)
        print(f"epu ctx: {text}", file=sys.stderr)
        return 1
    finally:
        client.close()


def write_secret(path: str, secret: str) -> None:
    """Write a secret to a new file only its owner can read (never over an existing one)."""
    import os

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")


def cmd_create(args: argparse.Namespace) -> int:
    if args.secret_file and Path(args.secret_file).exists():
        print(f"epu ctx: {args.secret_file} exists; give a new file for the secret", file=sys.stderr)
        return 2

    def go(client: Any) -> int:
        same = [c for c in client.list() if c["name"] == args.name]
        if same:  # a second context of one name splits a cluster's nodes between two lists
            print(f"epu ctx: a context named {args.name!r} exists already (id {same[0]['id']}, {same[0]['nodes']} "
                  f"node(s)): use it, or `epu ctx delete {same[0]['id']}` first; nothing created", file=sys.stderr)
            return 1
        ctx = client.create(args.name, args.domain)
        if args.secret_file:
            write_secret(args.secret_file, ctx["secret"])
            shown = {**ctx, "secret": f"(written to {args.secret_file})"}
        else:
            shown = ctx
        if args.json:
            print(json.dumps(shown if args.secret_file else ctx, indent=2))
        else:
            print(f"id:     {ctx['id']}\nname:   {ctx['name']}\nuri:    {ctx['uri']}\n"
                  f"key:    {ctx['key']}\nsecret: {shown['secret']}\n"
                  "(the broker keeps only a digest of the secret; give it to the provisioner:\n"
                  f" [workers.DOMAIN] context_uri = \"{ctx['uri']}\", context_secret_file = ...)")
        return 0

    return _run(args, go)


def cmd_credential(args: argparse.Namespace) -> int:
    def go(client: Any) -> None:
        cred = client.credential(args.id, args.hostname, args.instance_id)
        if args.env:
            print(f"EPU_CONTEXT_URI={cred['uri']}\nEPU_CONTEXT_KEY={cred['key']}\nEPU_CONTEXT_SECRET={cred['secret']}")
        elif args.json:
            print(json.dumps(cred, indent=2))
        else:
            print(f"uri:    {cred['uri']}\nkey:    {cred['key']}\nsecret: {cred['secret']}\n"
                  f"(joins and leaves only as {args.hostname}; keep it on that machine only)")

    return _run(args, go)


def cmd_remove_node(args: argparse.Namespace) -> int:
    def go(client: Any) -> None:
        res = client.remove_node(args.id, args.hostname)
        print(f"removed {args.hostname} (entry {res['entry_id']})" if res["changed"]
              else f"{args.hostname} is not a member")

    return _run(args, go)


def cmd_list(args: argparse.Namespace) -> int:
    def go(client: Any) -> None:
        items = client.list()
        if args.json:
            print(json.dumps(items, indent=2))
            return
        print(f"{'ID':<18} {'NAME':<20} {'NODES':>5} {'LAST':>6}  URI")
        for c in items:
            print(f"{c['id']:<18} {c['name']:<20} {c['nodes']:>5} {c['last_id']:>6}  {c['uri']}")

    return _run(args, go)


def cmd_show(args: argparse.Namespace) -> int:
    def go(client: Any) -> None:
        c = client.show(args.id)
        if args.json:
            print(json.dumps(c, indent=2))
        else:
            for k in ("id", "name", "uri", "key", "created_at", "last_id", "nodes", "domain"):
                print(f"{k + ':':<11} {c.get(k, '')}")

    return _run(args, go)


def cmd_nodes(args: argparse.Namespace) -> int:
    def go(client: Any) -> None:
        nodes = client.nodes(args.id)
        if args.json:
            print(json.dumps(nodes, indent=2))
            return
        print(f"{'HOSTNAME':<20} {'IP':<16} {'FQDN':<32} INSTANCE")
        for n in nodes:
            print(f"{n['hostname']:<20} {n['ip']:<16} {n['fqdn']:<32} {n.get('instance_id') or '-'}")

    return _run(args, go)


def cmd_delete(args: argparse.Namespace) -> int:
    def go(client: Any) -> None:
        client.delete(args.id)
        print(f"deleted {args.id}")

    return _run(args, go)


def cmd_agent(args: argparse.Namespace) -> int:
    import signal

    from epu.common.logs import setup_logging
    from epu.services.ctxbroker.agent.agent import Agent
    from epu.services.ctxbroker.agent.config import load_agent_config
    from epu.services.ctxbroker.agent.node import node_fields
    from pydantic import ValidationError

    overrides = {"scripts_dir": args.scripts_dir, "state_dir": args.state_dir, "root": args.root,
                 "ca_file": args.ca_file, "hostname": args.hostname, "ip": args.ip,
                 "insecure": True if args.insecure else None,
                 "long_poll": False if args.no_long_poll else None}
    try:
        cfg = load_agent_config(args.config, args.userdata, overrides, env_file=args.env)
        node = node_fields(cfg)
    except ValidationError as exc:  # key and problem only: the values may be the context's secret
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(file)'}: {e['msg']}" for e in exc.errors())
        print(f"epu ctx agent: bad configuration: {problems}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"epu ctx agent: bad configuration: {exc.filename or ''}: {exc.strerror}", file=sys.stderr)
        return 2
    except ValueError as exc:  # not JSON/TOML (the parsers name a line and column, not the text)
        print(f"epu ctx agent: bad configuration: {exc}", file=sys.stderr)
        return 2
    log_stream = None
    if args.daemon:
        log_stream = _daemonize(Path(cfg.state_dir) / "agent.log")
    setup_logging(args.log_level, stream=log_stream)
    agent = Agent(cfg, node)
    signal.signal(signal.SIGTERM, lambda *_: agent.stop())
    signal.signal(signal.SIGINT, lambda *_: agent.stop())
    agent.run()
    return 0


def _daemonize(log_path: Path) -> Any:
    """Detach (double fork, new session) so cloud-init's runcmd returns; log to ``log_path``."""
    import os

    if os.fork() > 0:
        os._exit(0)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    stream = open(log_path, "a", buffering=1)  # noqa: SIM115 (lives as long as the process)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull if fd == 0 else stream.fileno(), fd)
    return stream


def add_agent_args(a: argparse.ArgumentParser) -> None:
    a.add_argument("-c", "--config", metavar="FILE", help="agent config (JSON or TOML; not the services' epu.toml)")
    a.add_argument("--userdata", metavar="FILE",
                   help="cloud-init userdata to read the context from (default /var/lib/cloud/instance/user-data.txt)")
    a.add_argument("--env", metavar="FILE",
                   help="KEY=VALUE file with EPU_CONTEXT_URI/KEY/SECRET (as /etc/epu/context.env from cloud-init)")
    a.add_argument("--scripts-dir", metavar="DIR", help="directory holding init.d, add-node.d, delete-node.d, restart.d")
    a.add_argument("--state-dir", metavar="DIR", help="where state.json and members.json live")
    a.add_argument("--root", metavar="DIR", help="prefix the default scripts write under (default /)")
    a.add_argument("--ca-file", metavar="PEM", help="certificate/CA to verify the broker with")
    a.add_argument("--insecure", action="store_true", help="do not verify the broker's certificate (testing only)")
    a.add_argument("--hostname", help="short host name to register (default: detected)")
    a.add_argument("--ip", help="IP address to register (default: source address of the default route)")
    a.add_argument("--no-long-poll", action="store_true", help="plain polling every poll_interval seconds")
    a.add_argument("--daemon", action="store_true", help="detach and log to STATE/agent.log (for cloud-init runcmd)")
    a.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                   help="JSON log lines on stderr from this level up (default info)")
    a.set_defaults(func=cmd_agent)


def _admin_args(p: argparse.ArgumentParser) -> None:
    from epu.common.cliargs import add_config_arg

    add_config_arg(p, optional_note="not needed with --url and --token-file")
    p.add_argument("--url", help="broker base URL (default: [ctxbroker] public_url or https://host:port)")
    p.add_argument("--token-file", metavar="FILE", help="admin token file (default: [ctxbroker] admin_token_file)")
    p.add_argument("--ca-file", metavar="PEM", help="certificate/CA to trust (default: [ctxbroker] cert_file)")
    p.add_argument("--insecure", action="store_true", help="do not verify the broker's certificate (testing only)")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ctx", help="context broker: create/list/show/nodes/delete contexts; run the agent",
                       description=CTX_DESCRIPTION, epilog=CTX_EPILOG, formatter_class=RAW)
    csub = p.add_subparsers(dest="ctx_command", metavar="ACTION")

    c = csub.add_parser("create", help="create a context; print id, uri, key and secret", formatter_class=RAW,
                        description="Create a context named NAME. Prints its id, URI, key and secret.\n"
                                    "The secret is random (256 bits) and shown only once: the broker\n"
                                    "stores its SHA-256 digest and a signing key derived from it. Give the URI\n"
                                    "and the secret to the provisioner ([workers.DOMAIN] context_uri and\n"
                                    "context_secret_file): it derives each instance's own node credential\n"
                                    "for its userdata. The secret itself never goes into userdata.",
                        epilog=_admin_epilog("epu ctx create alpha --secret-file /etc/epu/contexts/alpha.secret",
                                             "epu ctx create mycluster --json | jq -r .uri")
                        + "\nAn existing --secret-file is never overwritten (exit 2). A name already taken by a\n"
                          "context is refused (exit 1, naming its id): one cluster, one context.")
    c.add_argument("name", metavar="NAME", help="lowercase letters, digits, '-', '_' (at most 63)")
    c.add_argument("--json", action="store_true", help="print one JSON object: id, name, uri, key, secret")
    c.add_argument("--domain", metavar="DOMAIN",
                   help="DNS domain of the cluster's names (e.g. cluster.example.org): a member may then "
                        "publish as its fqdn only its host name under it")
    c.add_argument("--secret-file", metavar="FILE",
                   help="write the secret to FILE (new, mode 0600) instead of printing it: what "
                        "[workers.DOMAIN] context_secret_file names for the provisioner")
    _admin_args(c)
    c.set_defaults(func=cmd_create)

    c = csub.add_parser("credential", help="issue a node's own credential (for the head node, static nodes)",
                        formatter_class=RAW,
                        description="Issue a credential that joins and leaves context ID only as HOSTNAME (and,\n"
                                    "with --instance-id, only as that instance). The provisioner derives one\n"
                                    "for every instance it launches; use this for machines EPU does not launch,\n"
                                    "such as the batch head node, whose agent must see the workers.",
                        epilog=_admin_epilog("epu ctx credential 3f2a9c1e0b7d4e21 head --env > /etc/epu/context.env",
                                             "epu-ctx-agent --env /etc/epu/context.env   # on that node",
                                             "epu ctx credential 3f2a9c1e0b7d4e21 login1 --json"))
    c.add_argument("id", metavar="ID", help="the context's id (as printed by epu ctx create and epu ctx list)")
    c.add_argument("hostname", metavar="HOSTNAME", help="the short host name the node joins as")
    c.add_argument("--instance-id",
                   help="bind the credential to this instance id too: only for an instance EPU's provisioner "
                        "launched (its node may then publish only the address the provisioner reports for it, "
                        "and its join waits until one is reported); omit for any other machine")
    c.add_argument("--json", action="store_true", help="print a JSON object: uri, key, secret")
    c.add_argument("--env", action="store_true",
                   help="print EPU_CONTEXT_URI/KEY/SECRET lines for the agent's --env file")
    _admin_args(c)
    c.set_defaults(func=cmd_credential)

    c = csub.add_parser("remove-node", help="remove a node from a context (admin)", formatter_class=RAW,
                        description="Append a leave for HOSTNAME in context ID (a node that is gone and whose\n"
                                    "instance EPU does not manage). Every agent applies it. Instances EPU\n"
                                    "launched leave by themselves when terminated.",
                        epilog=_admin_epilog("epu ctx remove-node 3f2a9c1e0b7d4e21 wn-7"))
    c.add_argument("id", metavar="ID", help="the context's id (as printed by epu ctx create and epu ctx list)")
    c.add_argument("hostname", metavar="HOSTNAME", help="the member to remove")
    _admin_args(c)
    c.set_defaults(func=cmd_remove_node)

    c = csub.add_parser("list", help="list contexts", formatter_class=RAW,
                        description="List every context: id, name, current node count, newest entry id, URI.",
                        epilog=_admin_epilog("epu ctx list -c /etc/epu/epu.toml",
                                             "epu ctx list --json | jq -r '.[] | select(.name == \"alpha\") | .uri'"))
    c.add_argument("--json", action="store_true", help="print a JSON array")
    _admin_args(c)
    c.set_defaults(func=cmd_list)

    c = csub.add_parser("show", help="show one context", formatter_class=RAW,
                        description="Show one context: id, name, URI, key, node count, newest entry id (never\n"
                                    "its secret, which the broker does not keep).",
                        epilog=_admin_epilog("epu ctx show 3f2a9c1e0b7d4e21", "epu ctx show 3f2a9c1e0b7d4e21 --json"))
    c.add_argument("id", metavar="ID", help="the context's id (as printed by epu ctx create and epu ctx list)")
    c.add_argument("--json", action="store_true", help="print a JSON object")
    _admin_args(c)
    c.set_defaults(func=cmd_show)

    c = csub.add_parser("nodes", help="list a context's current members", formatter_class=RAW,
                        description="List the nodes currently in context ID (the ordered list folded:\n"
                                    "every join not followed by a leave of the same host name): host name,\n"
                                    "FQDN, IP and when it joined.",
                        epilog=_admin_epilog("epu ctx nodes 3f2a9c1e0b7d4e21",
                                             "epu ctx nodes 3f2a9c1e0b7d4e21 --json | jq -r '.[].ip'"))
    c.add_argument("id", metavar="ID", help="the context's id (as printed by epu ctx create and epu ctx list)")
    c.add_argument("--json", action="store_true", help="print a JSON array")
    _admin_args(c)
    c.set_defaults(func=cmd_nodes)

    c = csub.add_parser("delete", help="delete a context and its list", formatter_class=RAW,
                        description="Delete context ID with its list and members. Agents polling it get\n"
                                    "404 and keep retrying with backoff until stopped. Irreversible: workers\n"
                                    "launched with its credentials can no longer join.",
                        epilog=_admin_epilog("epu ctx delete 3f2a9c1e0b7d4e21"))
    c.add_argument("id", metavar="ID", help="the context's id (as printed by epu ctx create and epu ctx list)")
    _admin_args(c)
    c.set_defaults(func=cmd_delete)

    a = csub.add_parser("agent", help="run the node agent (register, long-poll, apply scripts)",
                        description=AGENT_DESCRIPTION, epilog=AGENT_EPILOG, formatter_class=RAW)
    add_agent_args(a)

    def _help(_args: argparse.Namespace) -> int:
        p.print_help()
        return 2

    p.set_defaults(func=_help)
