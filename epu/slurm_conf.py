"""slurm.conf for native mode, written from EPU's own config (``epu slurm conf``, issue 35).

In native mode Slurm's power saving picks the node for a pending job among ``State=CLOUD`` nodes
and calls ``ResumeProgram`` with its name; EPU launches an instance of that node's type there.
So the CLOUD nodes must say exactly what each instance type gives (CPUs, RealMemory, Gres,
Features), their names must tell EPU which type to launch, and the power-saving timeouts must
leave EPU room to do better than Slurm alone (replace a stalled boot before ``ResumeTimeout``).
This module derives all of it from the engine's config — the domain's sites, their instance-type
catalogues, the partitions mapping — and from the boot times the engine measured; it is pure
(``render``) but for ``measured_boot_seconds``, which reads the engine's store.

What it writes, per domain:

* one ``NodeName`` line per *node set*: an instance type of the domain's sites. A type offered by
  several sites with the same shape is one node set (EPU places each resumed node at a site, with
  its placement and failover order); a type name two sites define with different shapes is one
  node set per site. Nodes are ``type_nodes.TYPE.names`` when the domain lists them, else
  ``DOMAIN-TYPE-[1-N]`` with N the most the domain may run of it (``max_nodes`` and the sites'
  quotas). ``Features`` = the type's own features, the type's name (what the engine launches for
  a resumed node: ``services/decision/slurm_native.type_of``) and ``site_SITE`` per site that may
  serve it (one site named pins the node there; several leave it to placement); ``Weight`` ranks cheaper types first (Slurm fills the lowest weight first);
  ``State=CLOUD``.
* a ``NodeSet`` per node set (named ``DOMAIN_TYPE``), and a ``PartitionName`` per partition of
  ``[domains.D.partitions]`` over the node sets of its types (or one partition over all of them).
* the power-saving parameters (see ``PowerSaving``).

Slurm runs ``ResumeProgram`` (``SuspendProgram``, ``ResumeFailProgram``) as an absolute path,
with the hostlist as its only argument and an environment of ``SLURM_CONF`` alone
(``power_save.c``, ``_run_prog``), and refuses a program that is group- or world-writable. So
the programs are three small Python scripts (``program_text``: no shell) that run ``epu slurm
resume|suspend|resume-fail -c CONFIG HOSTLIST`` with this interpreter.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from epu.common.config.catalogue import InstanceType, site_types
from epu.common.hostlist import HostlistError, compress

PROGRAMS = {"ResumeProgram": "resume", "SuspendProgram": "suspend", "ResumeFailProgram": "resume-fail"}
"""slurm.conf key → the ``epu slurm`` command it runs."""
PROGRAM_FILES = {verb: f"epu-slurm-{verb}" for verb in PROGRAMS.values()}

DEFAULT_BOOT_SECONDS = 300.0
"""Boot time (launch → the node registered) assumed for a domain whose sites have no measurement."""
MIN_SAMPLES = 3
"""Joined instances a site needs before its measured boot time is used."""
SAMPLES = 50
"""The most recent joined instances per site that the measurement reads."""
MARGIN_SECONDS = 60.0
"""Added to ``ResumeTimeout`` beyond stall + boot: the engine's iteration, the launch call, slack."""
DEFAULT_SUSPEND_SECONDS = 300
DEFAULT_SUSPEND_TIMEOUT = 120
DEFAULT_STALL_SECONDS = 600.0


class SlurmConfError(ValueError):
    """A config ``epu slurm conf`` cannot turn into slurm.conf; the message names the key."""


@dataclass(frozen=True)
class NodeSet:
    """Nodes of one instance type (at one or more sites) as slurm.conf declares them."""

    name: str
    type: str
    sites: tuple[str, ...]
    names: tuple[str, ...]
    cores: int
    memory_mb: int
    gpus: int
    features: tuple[str, ...]
    weight: int

    @property
    def hostlist(self) -> str:
        return compress(self.names)

    def node_line(self, extra: str = "") -> str:
        parts = [f"NodeName={self.hostlist}", f"CPUs={self.cores}"]
        if self.memory_mb:
            parts.append(f"RealMemory={self.memory_mb}")
        if self.gpus:
            parts.append(f"Gres=gpu:{self.gpus}")
        parts += [f"Features={','.join(self.features)}", f"Weight={self.weight}", "State=CLOUD"]
        if extra:
            parts.append(extra)
        return " ".join(parts)


@dataclass(frozen=True)
class PowerSaving:
    """The power-saving parameters, each with why it has its value (written as comments)."""

    resume_timeout: int
    suspend_time: int
    suspend_timeout: int
    boot_seconds: float
    boot_source: str
    stall_seconds: float
    dns: bool = False
    why: list[str] = field(default_factory=list)

    def lines(self, programs: dict[str, str]) -> list[str]:
        params = "cloud_dns" if self.dns else "cloud_reg_addrs"
        out = [f"# boot time {self.boot_seconds:.0f} s ({self.boot_source}); stall replacement after "
               f"{self.stall_seconds:.0f} s;",
               f"# ResumeTimeout = stall + one more boot + {MARGIN_SECONDS:.0f} s: EPU replaces a node that "
               "has not registered",
               "# under the same name before Slurm would mark it DOWN and requeue its job."]
        out += [f"# {w}" for w in self.why]
        out += [f"{key}={programs[key]}" for key in PROGRAMS]
        out += [f"ResumeTimeout={self.resume_timeout}",
                f"SuspendTime={self.suspend_time}",
                f"SuspendTimeout={self.suspend_timeout}",
                "# 0: no rate limit in Slurm; each site's own (rate_limit_per_second, max_in_flight) applies,",
                "# and one ResumeProgram call per scheduling pass becomes one batch of launches",
                "ResumeRate=0",
                "SuspendRate=0",
                ("# node names are in DNS: slurmctld resolves them" if self.dns else
                 "# a node's address is learned when its slurmd registers (no DNS for cloud nodes),"),
                *([] if self.dns else ["# so slurmctld talks to each node directly (no fan-out through peers)",
                                       "TreeWidth=65533"]),
                "# idle_on_node_suspend: a node EPU powers down (given back, failed) is schedulable again",
                f"SlurmctldParameters={params},idle_on_node_suspend",
                "# powered-down CLOUD nodes are listed by sinfo and scontrol (EPU's sensor reads them)",
                "PrivateData=cloud"]
        return out


def _feature(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "-", text)


def _node_word(text: str) -> str:
    return re.sub(r"[^a-z0-9-]", "-", text.lower()).strip("-") or "node"


def node_sets(config: Any, domain_name: str) -> list[NodeSet]:
    """The domain's node sets (module docstring). Raises ``SlurmConfError`` naming the key."""
    domain = config.domains[domain_name]
    site_names = list(domain.sites) or list(config.sites)
    for s in site_names:
        if s not in config.sites:
            raise SlurmConfError(f"domains.{domain_name}.sites: no site {s!r} (sites: "
                                 f"{', '.join(sorted(config.sites)) or 'none'})")
    by_shape: dict[tuple[str, int, int, int, tuple[str, ...]], list[InstanceType]] = {}
    for s in site_names:
        site = config.sites[s]
        if site.discover and not site.types:
            raise SlurmConfError(f"sites.{s}.discover: slurm.conf needs each type's shape ahead of time; "
                                 f"declare the types in [sites.{s}.types.NAME] (cores, memory_mb, gpus)")
        for t in site_types(s, site):
            if t.legacy:
                raise SlurmConfError(f"sites.{s}: no [sites.{s}.types] table: native mode needs each instance "
                                     "type's cores, memory_mb (and gpus, features) declared")
            if not t.memory_mb:
                raise SlurmConfError(f"sites.{s}.types.{t.name}.memory_mb: required for slurm.conf's RealMemory")
            by_shape.setdefault((t.name, t.cores, t.memory_mb, t.gpus, t.features), []).append(t)
    if not by_shape:
        raise SlurmConfError(f"domains.{domain_name}.sites: its sites offer no instance type")
    names_of_type: dict[str, int] = {}
    for key in by_shape:
        names_of_type[key[0]] = names_of_type.get(key[0], 0) + 1
    ranked = sorted(by_shape.items(), key=lambda kv: (min(t.price_per_hour for t in kv[1]), kv[0][0]))
    out: list[NodeSet] = []
    used: dict[str, str] = {}
    for weight, ((tname, cores, mem, gpus, feats), offers) in enumerate(ranked, start=1):
        sites = tuple(t.site for t in offers)
        split = names_of_type[tname] > 1
        base = f"{_node_word(domain_name)}-{_node_word(sites[0]) + '-' if split else ''}{_node_word(tname)}"
        listed = domain.type_nodes.get(tname)
        if listed is not None and listed.names:
            if split:
                raise SlurmConfError(f"domains.{domain_name}.type_nodes.{tname}: sites "
                                     f"{', '.join(t.site for ts in by_shape.values() for t in ts if t.name == tname)} "
                                     "define this type with different shapes; one list of names cannot serve both")
            names = tuple(listed.names)
        else:
            room = sum(min(t.quota, config.sites[t.site].quota) for t in offers)
            count = min(domain.max_nodes, room)
            if count < 1:
                continue
            names = tuple(f"{base}-{i}" for i in range(1, count + 1))
        for n in names:
            if n in used:
                raise SlurmConfError(f"domains.{domain_name}.type_nodes: node {n!r} is listed for {used[n]} and "
                                     f"{tname}")
            used[n] = tname
        features = tuple(dict.fromkeys([*(_feature(f) for f in feats), _feature(tname),
                                        *(f"site_{_feature(s)}" for s in sites)]))
        set_name = f"{domain_name}_{sites[0]}_{tname}" if split else f"{domain_name}_{tname}"
        out.append(NodeSet(_feature(set_name).replace("-", "_"), tname, sites, names, cores, mem, gpus,
                           features, weight))
    return out


def partition_lines(config: Any, domain_name: str, sets: list[NodeSet], partition: str | None = None) -> list[str]:
    """``PartitionName`` lines: one per ``[domains.D.partitions]`` entry over the node sets of its
    types, else one (``partition``, default the domain's name) over all."""
    domain = config.domains[domain_name]
    lines = []
    if domain.partitions:
        for part, refs in domain.partitions.items():
            chosen = []
            for ref in refs:
                site, _, tname = ref.rpartition("/")
                hit = [s.name for s in sets if s.type == tname and (not site or site in s.sites)]
                if not hit:
                    raise SlurmConfError(f"domains.{domain_name}.partitions.{part}: no node set for {ref!r}")
                chosen += [h for h in hit if h not in chosen]
            default = "YES" if part == domain.default_partition else "NO"
            lines.append(f"PartitionName={part} Nodes={','.join(chosen)} Default={default} MaxTime=INFINITE State=UP")
    else:
        name = partition or domain_name
        lines.append(f"PartitionName={name} Nodes={','.join(s.name for s in sets)} Default=YES MaxTime=INFINITE "
                     "State=UP")
    return lines


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (no interpolation: a real sample)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def boot_from_instances(instances: list[Any], sites: list[str]) -> dict[str, list[float]]:
    """Per site, launch → joined seconds of its most recent ``SAMPLES`` joined instances."""
    out: dict[str, list[tuple[float, float]]] = {}
    for i in instances:
        if i.site in sites and i.joined_at is not None and i.joined_at >= i.launched_at:
            out.setdefault(i.site, []).append((i.launched_at, i.joined_at - i.launched_at))
    return {s: [b for _at, b in sorted(v)[-SAMPLES:]] for s, v in out.items()}


def measured_boot_seconds(config: Any, domain_name: str) -> tuple[dict[str, list[float]], str | None]:
    """Boot times the engine measured (its store's instances: ``launched_at`` → ``joined_at``) for
    the domain's sites, or why none could be read."""
    from epu.common.storeaccess import read_store

    domain = config.domains[domain_name]
    sites = list(domain.sites) or list(config.sites)

    def read() -> dict[str, list[float]]:
        from epu.services.decision.store import Store

        store = Store(config.decision.store_url)
        try:
            return boot_from_instances(store.instances(domain_name, live_only=False), sites)
        finally:
            store.engine.dispose()

    found, why = read_store(config.decision.store_url, "decision.store_url", read)
    return found or {}, why


def power_saving(config: Any, domain_name: str, measured: dict[str, list[float]], *,
                 boot_default: float = DEFAULT_BOOT_SECONDS, suspend_time: int | None = None,
                 suspend_timeout: int = DEFAULT_SUSPEND_TIMEOUT, dns: bool = False,
                 unread: str | None = None) -> PowerSaving:
    """The domain's power-saving parameters: ``ResumeTimeout`` from the slowest site's p95 boot
    time (the default where too few were measured) and the policy's ``stall_seconds``."""
    from epu.services.decision.policies import PolicyError, validate_params

    domain = config.domains[domain_name]
    try:
        params = validate_params(domain.policy, domain.params)
    except PolicyError as exc:
        raise SlurmConfError(f"domains.{domain_name}.params: {exc}") from None
    stall = float(getattr(params, "stall_seconds", DEFAULT_STALL_SECONDS))
    why: list[str] = []
    per_site = {s: percentile(v, 0.95) for s, v in measured.items() if len(v) >= MIN_SAMPLES}
    if per_site:
        site, boot = max(per_site.items(), key=lambda kv: kv[1])
        source = (f"measured: p95 of the last {len(measured[site])} joined instances at {site}, the slowest of "
                  f"{', '.join(sorted(per_site))}")
    else:
        boot = boot_default
        source = f"assumed, --boot-seconds: fewer than {MIN_SAMPLES} boots measured"
        source += f"; {unread}" if unread else ""
    if boot > stall:
        why.append(f"WARNING: boot time {boot:.0f} s is above stall_seconds {stall:.0f} s: EPU would replace "
                   f"healthy slow boots; raise domains.{domain_name}.params.stall_seconds")
    idle = getattr(params, "idle_seconds", None)
    if suspend_time is None:
        suspend_time = int(math.ceil(idle)) if idle else DEFAULT_SUSPEND_SECONDS
        why.append(f"SuspendTime: {'the policy idle_seconds' if idle else 'default'}")
    return PowerSaving(resume_timeout=int(math.ceil(stall + boot + MARGIN_SECONDS)), suspend_time=max(1, suspend_time),
                       suspend_timeout=suspend_timeout, boot_seconds=boot, boot_source=source, stall_seconds=stall,
                       dns=dns, why=why)


def native_warnings(config: Any, domain_name: str, power: PowerSaving) -> list[str]:
    """What the engine's config must also say for native mode, where it does not yet."""
    domain = config.domains[domain_name]
    out = []
    if getattr(domain, "native", "") != "slurm":
        out.append(f'domains.{domain_name}.native: set it to "slurm" (else the engine ignores Slurm\'s calls and '
                   "drives the cluster itself)")
    horizon = getattr(domain, "native_resume_seconds", None)
    if horizon is not None and abs(float(horizon) - power.resume_timeout) > 1:
        out.append(f"domains.{domain_name}.native_resume_seconds: {horizon:g}; set it to ResumeTimeout "
                   f"({power.resume_timeout})")
    opts = getattr(getattr(config, "sensor", None), "options", None) or {}
    if getattr(config.sensor, "domain", None) == domain_name:
        if not opts.get("native"):
            out.append("sensor.options.native: set it to true (removed nodes are held until released; give-backs work)")
        if not opts.get("include_powered_down") and not all(
                t in domain.type_nodes and domain.type_nodes[t].names for t in {s.type for s in node_sets(config,
                                                                                                          domain_name)}):
            out.append("sensor.options.include_powered_down: set it to true (the engine types a resumed node by "
                       "its features in the snapshot; a powered-down node is missing from it otherwise)")
    return out


def program_text(python: str, config_path: str, verb: str) -> str:
    """A program Slurm can run (absolute path, the hostlist as its one argument): ``epu slurm VERB
    -c CONFIG HOSTLIST`` in this interpreter, without a shell."""
    return (f"#!{python}\n"
            f"# Written by `epu slurm conf`: Slurm's {'/'.join(k for k, v in PROGRAMS.items() if v == verb)} "
            "(the hostlist is argv[1]).\n"
            "import sys\n\n"
            "from epu.cli import main\n\n"
            f"sys.exit(main(['slurm', {verb!r}, '-c', {config_path!r}, *sys.argv[1:]]))\n")


def write_programs(directory: Path, python: str, config_path: str) -> dict[str, str]:
    """The three programs in ``directory`` (mode 0755); returns slurm.conf key → absolute path."""
    directory.mkdir(parents=True, exist_ok=True)
    out = {}
    for key, verb in PROGRAMS.items():
        path = (directory / PROGRAM_FILES[verb]).resolve()
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(program_text(python, config_path, verb))
        tmp.chmod(0o755)
        tmp.replace(path)
        out[key] = str(path)
    return out


def render(config: Any, domain_name: str, programs: dict[str, str], power: PowerSaving, *,
           source: str = "", partition: str | None = None, first_port: int | None = None,
           node_addr: str | None = None) -> str:
    """The whole fragment (for ``Include`` in slurm.conf). ``first_port``: each node its own slurmd
    port, counting up from it (several slurmd on one host: the process site, tests); ``node_addr``:
    every node's NodeAddr and NodeHostname (all on one host)."""
    if domain_name not in config.domains:
        raise SlurmConfError(f"domains.{domain_name}: no such domain (domains: "
                             f"{', '.join(sorted(config.domains)) or 'none'})")
    try:
        sets = node_sets(config, domain_name)
    except HostlistError as exc:
        raise SlurmConfError(f"domains.{domain_name}.type_nodes: {exc}") from None
    if not sets:
        raise SlurmConfError(f"domains.{domain_name}.max_nodes: no node to declare (max_nodes or quotas are 0)")
    lines = [f"# EPU native mode for domain {domain_name}: written by `epu slurm conf`"
             + (f" from {source}" if source else "") + ".",
             "# Include it from slurm.conf (Include /etc/slurm/epu-native.conf); docs/slurm-native.md.",
             "", "# --- power saving"]
    lines += power.lines(programs)
    if any(s.gpus for s in sets):
        lines += ["GresTypes=gpu"]
    lines += ["", "# --- nodes: one set per instance type (Features: the type's own, the type's name, site_SITE",
              "# per site that may serve it; Weight: cheaper types first)"]
    port = first_port
    total = sum(len(s.names) for s in sets)
    if port is not None and port + total - 1 > 65535:
        raise SlurmConfError(f"--ports: {total} nodes from {port} run past port 65535")
    for s in sets:
        extra = f"NodeAddr={node_addr} NodeHostname={node_addr}" if node_addr else ""
        if port is not None:
            last = port + len(s.names) - 1
            extra += (" " if extra else "") + (f"Port={port}" if last == port else f"Port=[{port}-{last}]")
            port = last + 1
        lines.append(s.node_line(extra))
    lines += [f"NodeSet={s.name} Nodes={s.hostlist}" for s in sets]
    lines += ["", "# --- partitions"]
    lines += partition_lines(config, domain_name, sets, partition)
    return "\n".join(lines) + "\n"
