"""``epu slurm conf``: the slurm.conf fragment for native mode (``epu/slurm_conf.py``).

Registered under ``epu slurm`` whoever made that group first (``epu slurm resume|suspend|
resume-fail`` live with the sensor's side of native mode): this module only adds ``conf``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

RAW = argparse.RawDescriptionHelpFormatter

DESCRIPTION = """\
Write the slurm.conf lines that put a domain behind Slurm's own power saving (native mode):
one NodeName line per instance type of the domain's sites (CPUs, RealMemory, Gres, Features
naming the type and its sites (site_SITE), Weight by price, State=CLOUD), a NodeSet per type, a
PartitionName per partition of [domains.D.partitions], and the power-saving parameters:
ResumeProgram, SuspendProgram and ResumeFailProgram (three small programs written to
--programs-dir that run `epu slurm resume|suspend|resume-fail -c CONFIG HOSTLIST`: Slurm runs
an absolute path with the hostlist as its only argument), ResumeTimeout (stall_seconds + the
slowest site's p95 boot time measured by the engine, from decision.store_url, + 60 s; where
fewer than 3 boots were measured, --boot-seconds), SuspendTime (the policy's idle_seconds),
SuspendTimeout, ResumeRate/SuspendRate 0 (the sites' own rate limits apply), TreeWidth,
SlurmctldParameters and PrivateData=cloud. Include the output from slurm.conf
(docs/slurm-native.md)."""

EPILOG = """\
Examples:
  epu slurm conf -c /etc/epu/epu.toml -o /etc/slurm/epu-native.conf --programs-dir /usr/local/sbin
  epu slurm conf -c epu.toml --domain alpha --boot-seconds 120 --programs-dir /tmp/p   # to stdout

Exit status: 0 written; 2 bad option or a config that cannot become slurm.conf (the message
names the key)."""


def cmd_conf(args: argparse.Namespace) -> int:
    from epu.common.cliargs import config_path, load_or_exit
    from epu.slurm_conf import (
        SlurmConfError,
        measured_boot_seconds,
        native_warnings,
        power_saving,
        render,
        write_programs,
    )

    path = config_path(args.config)
    config = load_or_exit(path)
    try:
        domain = args.domain
        if domain is None:
            if len(config.domains) != 1:
                raise SlurmConfError(f"domains: {len(config.domains)} domains in the file; name one with --domain "
                                     f"({', '.join(sorted(config.domains)) or 'none'})")
            domain = next(iter(config.domains))
        if domain not in config.domains:
            raise SlurmConfError(f"--domain: no domain {domain!r} (domains: {', '.join(sorted(config.domains))})")
        if args.ports is not None and not 1024 <= args.ports <= 65535:
            raise SlurmConfError(f"--ports: {args.ports} is not a port from 1024 to 65535")
        measured, unread = ({}, "not read (--no-measure)") if args.no_measure else measured_boot_seconds(config,
                                                                                                          domain)
        power = power_saving(config, domain, measured, boot_default=args.boot_seconds,
                             suspend_time=args.suspend_time, suspend_timeout=args.suspend_timeout, dns=args.dns,
                             unread=unread)
        assert path is not None
        programs = write_programs(Path(args.programs_dir), sys.executable, str(Path(path).resolve()))
        text = render(config, domain, programs, power, source=str(path), partition=args.partition,
                      first_port=args.ports, node_addr=args.node_addr)
    except SlurmConfError as exc:
        print(f"epu slurm conf: {exc}", file=sys.stderr)
        return 2
    for warning in native_warnings(config, domain, power):
        print(f"epu slurm conf: warning: {warning}", file=sys.stderr)
    if args.out:
        out = Path(args.out)
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(text)
        tmp.replace(out)
        print(f"epu slurm conf: wrote {out} and the programs in {args.programs_dir}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _slurm_group(sub: argparse._SubParsersAction) -> argparse._SubParsersAction:
    """The ``epu slurm`` subcommands, made here if no other module made the group."""
    parser = sub.choices.get("slurm")
    if parser is None:
        parser = sub.add_parser("slurm", help="Slurm native mode (power saving): slurm.conf, Slurm's programs",
                                description="Slurm native mode: EPU behind Slurm's power saving "
                                            "(docs/slurm-native.md).")
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return parser.add_subparsers(dest="slurm_command", metavar="SUBCOMMAND")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: must be at least 1")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text}: must be above 0")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    from epu.common.cliargs import add_config_arg
    from epu.slurm_conf import DEFAULT_BOOT_SECONDS, DEFAULT_SUSPEND_TIMEOUT

    p = _slurm_group(sub).add_parser("conf", help="write slurm.conf's nodes, partitions and power saving for a domain",
                                     description=DESCRIPTION, epilog=EPILOG, formatter_class=RAW)
    p.add_argument("--domain", help="the domain (default: the file's only domain)")
    p.add_argument("-o", "--out", metavar="FILE", help="write the fragment here (default: standard output)")
    p.add_argument("--programs-dir", metavar="DIR", default="/usr/local/sbin",
                   help="where to write epu-slurm-resume, epu-slurm-suspend, epu-slurm-resume-fail (mode 0755; "
                        "default /usr/local/sbin)")
    p.add_argument("--boot-seconds", type=_positive_float, default=DEFAULT_BOOT_SECONDS,
                   help=f"boot time to assume where the engine measured fewer than 3 (default {DEFAULT_BOOT_SECONDS:g})")
    p.add_argument("--no-measure", action="store_true", help="do not read measured boot times from the engine's store")
    p.add_argument("--suspend-time", type=_positive_int, help="SuspendTime (default: the policy's idle_seconds, else 300)")
    p.add_argument("--suspend-timeout", type=_positive_int, default=DEFAULT_SUSPEND_TIMEOUT,
                   help=f"SuspendTimeout: drain, remove and terminate (default {DEFAULT_SUSPEND_TIMEOUT})")
    p.add_argument("--dns", action="store_true", help="cloud node names resolve in DNS (cloud_dns; else "
                                                      "cloud_reg_addrs and TreeWidth=65533)")
    p.add_argument("--partition", help="the one partition's name when the domain maps none (default: the domain)")
    p.add_argument("--ports", type=int, metavar="FIRST", help="give each node its own slurmd Port, from FIRST up "
                                                              "(several slurmd on one host: the process site)")
    p.add_argument("--node-addr", metavar="ADDR", help="every node's NodeAddr and NodeHostname (all nodes on one host: "
                                                       "the process site, with --ports)")
    add_config_arg(p)
    p.set_defaults(func=cmd_conf)
