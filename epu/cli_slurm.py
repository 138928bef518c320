"""``epu slurm resume|suspend|resume-fail HOSTLIST``: Slurm's ResumeProgram, SuspendProgram and
ResumeFailProgram in native mode.

Why a thin program: slurmctld calls it with one argument, a hostlist, as the SlurmUser, and waits
for nothing but its exit (it kills nothing that runs long, but it counts ResumeTimeout from the
call). So it only parses the hostlist as Slurm does (``common.hostlist``, every name validated; no
shell anywhere), reads ``SLURM_RESUME_FILE`` for a resume, and hands one ``slurm.power`` batch to
the decision engine over the broker with the domain's sensor identity (the sensor's config and
broker user), confirmed and routed, within ``--timeout``. Everything else — which type, which
site, the caps, giving a node back — is the engine's (services/decision/slurm_native.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from typing import Any

ACTIONS = {"resume": "resume", "suspend": "suspend", "resume-fail": "resume_fail"}

DESCRIPTION = """\
Hand the nodes slurmctld's power saving names to the EPU decision engine of this cluster's
domain, as one batch (native mode, docs/slurm-native.md). Slurm runs ResumeProgram,
SuspendProgram and ResumeFailProgram as one absolute path without arguments (22.05), so
`epu slurm conf --programs-dir DIR` writes three small programs that run these commands and the
slurm.conf lines naming them:

  ResumeProgram=DIR/epu-slurm-resume      -> epu slurm resume -c CONFIG HOSTLIST
  SuspendProgram=DIR/epu-slurm-suspend    -> epu slurm suspend -c CONFIG HOSTLIST
  ResumeFailProgram=DIR/epu-slurm-resume-fail -> epu slurm resume-fail -c CONFIG HOSTLIST

HOSTLIST is
Slurm's: n[01-04,07],gpu-a100-2 — expanded exactly as `scontrol show hostnames` does; a
malformed list or any name that is not a host name (shell metacharacters, spaces, slashes) is
refused whole and nothing is sent. No shell is used.

  resume       demand for exactly those nodes: the engine launches each as the instance type and
               site its features name, under that name; one it cannot serve (spend cap,
               max_nodes, every site failing) is powered down at once with a reason, so Slurm
               requeues its job instead of waiting for ResumeTimeout.
  suspend      Slurm no longer wants them: the engine ends each instance only once the sensor has
               proved the node idle and removed (no job on it, by Slurm's own job list).
  resume-fail  Slurm gave up on them (ResumeTimeout): the engine ends their instances as
               launches that failed and stops replacing them.

For a resume, slurmctld (Slurm >= 22.05) names a JSON file in SLURM_RESUME_FILE with each job's
allocated nodes, features and --extra; it is read and sent along (ParallelCluster >= 3.8 does the
same), so a job whose nodes cannot all be served is given back whole.

The message goes as the domain's sensor (its broker user, epu-sensor-DOMAIN, may publish only
that domain's keys), publish-confirmed and routed to the engine's input queue, within --timeout
seconds (default 10: well inside Slurm's ResumeTimeout and SuspendTimeout)."""

EPILOG = """\
JSON output (--json): one object
  {"ok": true|false, "action": "resume", "domain": "alpha", "batch_id": "...",
   "nodes": ["n01", ...], "jobs": N, "seconds": 0.012, "error": null|"why"}

Exit status: 0 the engine's queue has the batch (broker-confirmed); 1 it could not be delivered
within --timeout (broker unreachable, refused, no engine queue bound) — slurmctld logs the
failure and the nodes time out as they would without EPU; 2 bad usage, a bad hostlist or resume
file, or a bad configuration (nothing sent).

Examples:
  epu slurm resume 'cloud-c5-[001-004]' -c /etc/epu/epu.toml
  SLURM_RESUME_FILE=/tmp/r.json epu slurm resume cloud-c5-001 --json
  epu slurm suspend cloud-c5-[001-002],cloud-gpu-1
  epu slurm resume-fail cloud-c5-003

Files and environment: the sensor's configuration ([sensor] domain, [broker] url with the
sensor's user): -c FILE, else $EPU_CONFIG, else /etc/epu/epu.toml; EPU_<SECTION>__<KEY>
variables override its keys. SLURM_RESUME_FILE: see above (--resume-file overrides it)."""


def _result(ok: bool, action: str, domain: str, batch_id: str, nodes: list[str], jobs: int, seconds: float,
            error: str | None) -> dict[str, Any]:
    return {"ok": ok, "action": action, "domain": domain, "batch_id": batch_id, "nodes": nodes, "jobs": jobs,
            "seconds": round(seconds, 4), "error": error}


def _fail(args: argparse.Namespace, status: int, message: str) -> int:
    if args.json:
        print(json.dumps(_result(False, args.slurm_action, "", "", [], 0, 0.0, message)))
    print(f"epu slurm {args.slurm_action}: {message}", file=sys.stderr)
    return status


def deliver(broker: Any, message: Any, *, timeout: float, source: str) -> str | None:
    """Publish ``message`` (confirmed, mandatory) within ``timeout`` seconds: None when the broker
    took it, else why not. Why a thread and a deadline: the publisher reconnects with backoff,
    which is right for a service and wrong for a program slurmctld waits on."""
    from epu.common.broker import Publisher

    pub = Publisher(broker, source=source)
    outcome: list[str | None] = []

    def run() -> None:
        try:
            pub.publish(message)
            outcome.append(None)
        except Exception as exc:  # refused, unroutable, unreachable: said in one line
            outcome.append(f"{type(exc).__name__}: {exc}")

    t = threading.Thread(target=run, name="epu-slurm-publish", daemon=True)
    t.start()
    t.join(timeout)
    if not outcome:
        pub._closed.set()  # stop the publisher's retries; the thread is a daemon
        return f"not confirmed by the broker within {timeout:g}s"
    try:
        pub.close()
    except Exception:
        pass
    return outcome[0]


def cmd_power(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from epu.common.cliargs import config_path
    from epu.common.config import load_config
    from epu.common.hostlist import HostlistError, expand
    from epu.common.slurm_power import ResumeFileError, power_message, read_resume_file

    action = ACTIONS[args.slurm_action]
    try:
        expand(args.hostlist)  # before anything else: a bad list is refused whole, nothing read or sent
    except HostlistError as exc:
        return _fail(args, 2, str(exc))
    jobs = []
    resume_file = getattr(args, "resume_file", None) or os.environ.get("SLURM_RESUME_FILE")
    try:
        if action == "resume" and resume_file:
            jobs = read_resume_file(resume_file)
    except ResumeFileError as exc:
        return _fail(args, 2, str(exc))
    path = config_path(args.config)
    try:
        config = load_config(path)
    except (OSError, ValueError) as exc:
        return _fail(args, 2, f"configuration {path}: {exc}")
    domain = args.domain or config.sensor.domain
    try:
        msg = power_message(domain, action, args.hostlist, jobs=jobs)  # type: ignore[arg-type]
    except HostlistError as exc:
        return _fail(args, 2, str(exc))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        if first["loc"] and first["loc"][0] == "nodes":
            return _fail(args, 2, f"node name {first.get('input')!r} is not a host name (RFC 1123: letters, digits, "
                                  "'-' and dots): EPU names the node's instance by it")
        return _fail(args, 2, f"refused {where}: {first['msg']} (input {first.get('input')!r})")
    import dataclasses

    base = config.broker_obj()
    broker = dataclasses.replace(base, connect_timeout=min(base.connect_timeout, args.timeout),
                                 confirm_timeout=min(base.confirm_timeout, args.timeout))
    t0 = time.monotonic()
    error = deliver(broker, msg, timeout=args.timeout, source=f"slurm-{action}:{domain}")
    seconds = time.monotonic() - t0
    if args.json:
        print(json.dumps(_result(error is None, args.slurm_action, domain, msg.batch_id, msg.nodes, len(msg.jobs),
                                 seconds, error)))
    if error is not None:
        print(f"epu slurm {args.slurm_action}: {len(msg.nodes)} node(s) of domain {domain} not delivered: {error}",
              file=sys.stderr)
        return 1
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    from epu.common.cliargs import nonneg_float

    p = sub.add_parser("slurm", help="Slurm's power-saving programs in native mode (resume, suspend, resume-fail)",
                       description="Slurm native mode: slurmctld's power saving picks the nodes, EPU launches\n"
                                   "and ends their instances (docs/policies.md, \"Native mode\").",
                       epilog="Examples:\n  epu slurm resume 'cloud-c5-[001-004]'\n"
                              "  epu slurm suspend cloud-c5-001\n\n"
                              "Exit status: see each ACTION's --help; 2 when no ACTION is given.",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(func=lambda _args: (p.print_help(), 2)[1])
    ssub = p.add_subparsers(dest="slurm_command", metavar="ACTION")
    for name in ACTIONS:
        s = ssub.add_parser(name, help=f"Slurm's {name.replace('-', ' ')} program: hand HOSTLIST to the engine",
                            description=DESCRIPTION, epilog=EPILOG,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
        s.add_argument("hostlist", metavar="HOSTLIST", help="the nodes, as slurmctld passes them (n[01-04],m7)")
        s.add_argument("-c", "--config", metavar="FILE", help="TOML config file (the sensor's: [sensor] domain, [broker])")
        s.add_argument("--domain", help="the domain (default: [sensor] domain of the config)")
        s.add_argument("--timeout", type=nonneg_float, default=10.0, metavar="SECONDS",
                       help="give up delivering after this long (default 10)")
        s.add_argument("--json", action="store_true", help="print one JSON object (see below)")
        if name == "resume":
            s.add_argument("--resume-file", metavar="FILE",
                           help="slurmctld's job/node map (default: $SLURM_RESUME_FILE)")
        s.set_defaults(func=cmd_power, slurm_action=name)
