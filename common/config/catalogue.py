"""Instance-type catalogues: what a site can launch, and which types a domain's partitions may use.

A site offers one or more *instance types*, each with cores, memory, GPUs, the node features it
provides, a price per hour, spot or on-demand, a per-type quota and an image::

    [sites.ec2-east.types.c5-xlarge]          # the type's name (what domains refer to)
    size = "c5.xlarge"                        # the provider's size id (default: the name)
    cores = 4
    memory_mb = 8192
    price_per_hour = 0.17

    [sites.ec2-east.types.p3-2xlarge]
    size = "p3.2xlarge"
    cores = 8
    memory_mb = 62464
    gpus = 1
    features = ["gpu", "v100"]
    price_per_hour = 3.06
    quota = 4

Types can also come from the driver: ``discover = ["c5.*", "r5.*"]`` offers the provider's sizes
(libcloud ``list_sizes()``) whose id matches one of the patterns, with what the driver reports (EC2
sizes carry vCPUs, RAM, GPUs and an on-demand price); a ``[types]`` entry whose ``size`` is a
discovered id overrides what the driver said, key by key (``type_from_size``).

A site with no ``types`` table is today's single-type site: its ``size``, ``cores`` and
``price_per_hour`` make a one-type catalogue (``site_types``), so every existing config keeps its
meaning.

A domain maps partitions to the types allowed to serve them, and gives the batch-system node
names for each type (``DomainConfig.partitions`` / ``type_nodes``)::

    [domains.alpha]
    default_partition = "cpu"                 # what a job naming no partition means
    [domains.alpha.partitions]
    cpu = ["c5-xlarge"]
    bigmem = ["r5-4xlarge"]
    gpu = ["ec2-east/p3-2xlarge"]             # site/type: only that site's offer
    [domains.alpha.type_nodes.r5-4xlarge]
    names = ["bigmem[01-04]"]                 # Slurm CLOUD slots (hostlist expressions)

Memory 0 means *unknown* (not a constraint) for a type, as it does for a node: a catalogue that
does not state memory keeps today's behaviour of matching on cores only.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from typing import Any

from epu.common.config.base import Section
from pydantic import Field, field_validator, model_validator

TYPE_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
"""Type names: provider size ids are often dotted (``c5.xlarge``), so dots are allowed."""


class InstanceTypeConfig(Section):
    """One instance type of a site (``[sites.NAME.types.TYPE]``). Unset keys come from the
    driver's size listing when the site discovers types, else from the defaults below."""

    size: str | None = None
    """The provider's size id (default: the type's name)."""
    cores: int | None = Field(None, ge=1)
    """Cores a worker of this type gives the batch system (required unless discovered)."""
    memory_mb: int | None = Field(None, ge=0)
    """Memory for jobs, MB (0 or unset = unknown: memory requests are not checked)."""
    gpus: int | None = Field(None, ge=0)
    features: list[str] | None = None
    """Node features/properties a worker of this type advertises (Slurm ``Features=``)."""
    price_per_hour: float | None = Field(None, ge=0)
    spot: bool = False
    """A spot/preemptible offer (used only by domains with ``allow_spot``)."""
    quota: int | None = Field(None, ge=0)
    """Instances of this type at this site at most (default: the site's quota)."""
    image: str | None = None
    """Image for this type (default: the site's image; GPU types often need their own)."""


class TypeNodes(Section):
    """Batch-system node names for workers of one type (``[domains.NAME.type_nodes.TYPE]``)."""

    names: list[str] = Field(default_factory=list)
    """Pre-declared names, first free first; Slurm hostlist expressions expand
    (``bigmem[01-04,07]``)."""
    pattern: str | None = None
    """A name made from the launch: ``{domain}``, ``{type}`` and ``{id}`` (the launch id's
    first 16 characters, ``planner.NAME_ID_CHARS``) are replaced, e.g. ``"{domain}-gpu-{id}"``. Used when ``names`` is empty."""

    @field_validator("names")
    @classmethod
    def _expand(cls, value: list[str]) -> list[str]:
        out: list[str] = []
        for expr in value:
            out += expand_hostlist(expr)
        if len(set(out)) != len(out):
            raise ValueError("a node name is listed twice")
        return out

    @field_validator("pattern")
    @classmethod
    def _pattern(cls, value: str | None) -> str | None:
        if value is None:
            return value
        try:
            name = value.format(domain="d", type="t", id="0123abcd4567ef89")  # planner.NAME_ID_CHARS long
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"pattern may use only {{domain}}, {{type}} and {{id}} ({exc})") from None
        if "{id}" not in value:
            raise ValueError("pattern must contain {id} (names must differ per launch)")
        if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*$", name):
            raise ValueError(f"pattern makes an invalid host name ({name!r})")
        return value


class DomainCatalogue(Section):
    """The catalogue keys of a domain (mixed into ``DomainConfig``)."""

    partitions: dict[str, list[str]] = Field(default_factory=dict)
    """Partition (queue, pool) → instance types allowed to serve it: ``TYPE`` (at every site of
    the domain that offers it) or ``SITE/TYPE``. Empty: every type serves every partition."""
    default_partition: str = ""
    """The partition of a job that names none (Slurm's ``Default=YES`` partition)."""
    allow_spot: bool = False
    """Spot/preemptible types may be launched for this domain."""
    type_nodes: dict[str, TypeNodes] = Field(default_factory=dict)
    """Type → batch node names for its workers (Slurm CLOUD slots declared with that type's
    ``Features=``/``Gres=``)."""

    @model_validator(mode="after")
    def _catalogue(self) -> DomainCatalogue:
        for part, types in self.partitions.items():
            if not types:
                raise ValueError(f"partitions.{part}: list at least one instance type")
            for ref in types:
                site, _, name = ref.rpartition("/")
                if not re.match(TYPE_NAME, name) or (site and "/" in site):
                    raise ValueError(f"partitions.{part}: {ref!r} is not TYPE or SITE/TYPE")
        if self.default_partition and self.partitions and self.default_partition not in self.partitions:
            raise ValueError(f"default_partition: {self.default_partition!r} is not one of the "
                             f"partitions ({', '.join(sorted(self.partitions))})")
        return self


@dataclass(frozen=True)
class InstanceType:
    """One offer of one site: what the packer reasons about. Pure data."""

    site: str
    name: str
    size: str
    cores: int
    memory_mb: int = 0
    """0 = unknown."""
    gpus: int = 0
    features: tuple[str, ...] = ()
    price_per_hour: float = 0.0
    spot: bool = False
    quota: int = 20
    image: str = ""
    legacy: bool = False
    """Made of a site's single-type keys (``size``, ``cores``, ``price_per_hour``) rather than a
    ``[types]`` table: the domain's ``cores_per_node`` has always applied to it."""
    priced: bool = True
    """False when nobody said what it costs (no ``price_per_hour`` in the config, a driver size
    with ``price=None``). ``price_per_hour`` is then 0.0, which only the packer's order reads (an
    unpriced type sorts as if free, as before): a spend cap never admits it and ``epu cost`` never
    bills it as 0 (``services/decision/budget.py``, ``epu/cost.py``)."""

    @property
    def price(self) -> float | None:
        """$/h of one instance, or None when the type is unpriced."""
        return self.price_per_hour if self.priced else None

    @property
    def ref(self) -> str:
        return f"{self.site}/{self.name}"


def site_types(site_name: str, site: Any, discovered: list[Any] | None = None) -> list[InstanceType]:
    """The catalogue of one site (``site`` is a ``SiteConfig``): its ``[types]``, the sizes the
    driver ``discovered`` that match the site's ``discover`` patterns (overridden by a ``[types]``
    entry of the same size), or — with neither — the single type of a legacy site."""
    types: dict[str, InstanceTypeConfig] = dict(site.types)
    by_size = {(t.size or name): name for name, t in types.items()}
    out: dict[str, InstanceType] = {}
    for size in discovered or []:
        sid = str(size.id)
        if not any(fnmatch.fnmatchcase(sid, p) for p in site.discover) and sid not in by_size:
            continue
        name = by_size.get(sid, _type_name(sid))
        t = type_from_size(site_name, size, types.get(name), name=name, quota=site.quota, image=site.image)
        if t is not None:
            out[name] = t
    for name, t_cfg in types.items():
        if name in out:
            continue
        if t_cfg.cores is None:
            continue  # discovery did not report it (validated at load when nothing is discovered)
        out[name] = _from_config(site_name, name, t_cfg, quota=site.quota, image=site.image)
    if not types and not site.discover:
        name = _type_name(site.size) if site.size else "default"
        out[name] = InstanceType(site_name, name, site.size, site.cores, price_per_hour=site.price_per_hour or 0.0,
                                 quota=site.quota, image=site.image, legacy=True,
                                 priced=site.price_per_hour is not None)
    return sorted(out.values(), key=lambda t: (t.price_per_hour, t.name))


def _from_config(site_name: str, name: str, t: InstanceTypeConfig, *, quota: int, image: str) -> InstanceType:
    assert t.cores is not None
    return InstanceType(site_name, name, t.size or name, t.cores, t.memory_mb or 0, t.gpus or 0,
                        tuple(sorted(t.features or ())), t.price_per_hour or 0.0, t.spot,
                        quota if t.quota is None else t.quota, t.image or image, priced=t.price_per_hour is not None)


def _type_name(size_id: str) -> str:
    """A provider size id as a type name (``Standard_D4s_v3`` stays, ``a/b`` becomes ``a-b``)."""
    name = re.sub(r"[^A-Za-z0-9._-]", "-", size_id).strip("-._") or "size"
    return name[:63]


def type_from_size(site_name: str, size: Any, override: InstanceTypeConfig | None = None, *,
                   name: str | None = None, quota: int = 20, image: str = "") -> InstanceType | None:
    """Map a libcloud ``NodeSize`` to an instance type; keys set in ``override`` win.

    Cores come from what each driver reports: OpenStack ``size.vcpus``, EC2 ``extra["vcpu"]``,
    GCE ``extra["guestCpus"]``, Azure ``extra["numberOfCores"]``; GPUs from EC2 ``extra["gpu"]``
    or GCE ``extra["accelerators"]``; memory from ``size.ram`` (MB); the price from
    ``size.price`` (libcloud's on-demand price per hour, ``None`` when unknown: the type is then
    unpriced, ``priced=False``, unless the override gives one). Returns ``None``
    when the core count is unknown and not overridden (a type that cannot be packed)."""
    o = override or InstanceTypeConfig()
    extra = getattr(size, "extra", None) or {}
    cores = o.cores if o.cores is not None else _count(
        getattr(size, "vcpus", None), extra.get("vcpu"), extra.get("vcpus"), extra.get("guestCpus"),
        extra.get("numberOfCores"), extra.get("cpu"), extra.get("cpus"))
    if not cores:
        return None
    ram = _count(getattr(size, "ram", None))
    gpus = o.gpus if o.gpus is not None else (_count(extra.get("gpu"), extra.get("gpus"))
                                              or _gce_accelerators(extra.get("accelerators")))
    price = o.price_per_hour if o.price_per_hour is not None else _price(getattr(size, "price", None))
    return InstanceType(
        site_name, name or _type_name(str(size.id)), o.size or str(size.id), cores,
        o.memory_mb if o.memory_mb is not None else ram, gpus,
        tuple(sorted(o.features or ())), price or 0.0, o.spot, quota if o.quota is None else o.quota, o.image or image,
        priced=price is not None)


def _count(*values: Any) -> int:
    """The first value that reads as a positive whole number (drivers give ints, floats or strings)."""
    for v in values:
        if v is None or isinstance(v, bool):
            continue
        try:
            n = float(v)
        except (TypeError, ValueError):
            continue
        if n > 0:
            return int(n)
    return 0


def _gce_accelerators(value: Any) -> int:
    if not isinstance(value, list):
        return 0
    return sum(_count(a.get("guestAcceleratorCount")) for a in value if isinstance(a, dict))


def _price(value: Any) -> float | None:
    """A driver's price per hour, or None when it gives none (or nonsense): unknown, never 0."""
    if value is None or isinstance(value, bool):
        return None
    try:
        p = float(value)
    except (TypeError, ValueError):
        return None
    return p if p >= 0 and p == p and p != float("inf") else None


def expand_hostlist(expr: str) -> list[str]:
    """Expand a Slurm hostlist expression: ``gpu[1-3,7]`` → gpu1, gpu2, gpu3, gpu7;
    ``n[01-02]-[0,1]`` → n01-0, n01-1, n02-0, n02-1; zero padding is kept. A plain name is
    itself. Raises ``ValueError`` on a malformed range (the config error names the key). The one
    parser of ``common.hostlist`` (as ``scontrol show hostnames``), so a config's names and
    Slurm's power-saving calls read alike."""
    from epu.common.hostlist import expand

    return expand(expr.strip())


def declared_type_names(site: Any) -> set[str] | None:
    """Type names a site offers, known from config alone (``None``: it discovers sizes, so any
    name may turn up)."""
    if site.discover:
        return None
    if site.types:
        return set(site.types)
    return {_type_name(site.size) if site.size else "default"}


def domain_type_errors(domain_name: str, domain: Any,
                       sites: dict[str, Any]) -> list[tuple[tuple[str, ...], str, Any]]:
    """Cross-section checks of a domain's catalogue keys against the sites it may use: every type
    a partition or ``type_nodes`` names must be offered by one of them. Returns (key path, message,
    the value at fault)."""
    errors: list[tuple[tuple[str, ...], str, Any]] = []
    names = list(domain.sites) or list(sites)
    offered: dict[str, set[str] | None] = {n: declared_type_names(sites[n]) for n in names if n in sites}

    def known(ref: str) -> bool:
        site, _, name = ref.rpartition("/")
        if site:
            return site in offered and (offered[site] is None or name in offered[site])  # type: ignore[operator]
        return any(o is None or name in o for o in offered.values())

    def listing() -> str:
        shown = sorted(f"{s}/{t}" for s, ts in offered.items() for t in (ts or ()))
        return ", ".join(shown) or "none"

    for part, refs in domain.partitions.items():
        for ref in refs:
            if not known(ref):
                errors.append((("domains", domain_name, "partitions", part),
                               f"instance type {ref!r} is offered by none of the domain's sites "
                               f"(offered: {listing()})", ref))
    for name in domain.type_nodes:
        if not known(name):
            errors.append((("domains", domain_name, "type_nodes", name),
                           f"instance type {name!r} is offered by none of the domain's sites (offered: {listing()})",
                           name))
    return errors


@dataclass(frozen=True)
class LaunchType:
    """What the provisioner creates for a launch of one type: the provider's size and image, and
    the type's quota at the site (``None``: only the site's quota applies)."""

    name: str
    size: str
    image: str
    quota: int | None = None


def launch_type(site_name: str, site: Any, instance_type: str) -> LaunchType:
    """The size and image a launch of ``instance_type`` at ``site`` (a ``SiteConfig``) creates.
    "" is the site's single type (its ``size`` and ``image``, as before catalogues). A site that
    discovers sizes also launches a size id matching its patterns with the site's image (what the
    engine was told by ``list_sizes()``). Raises ``ValueError`` naming the offered types for a
    type the site does not offer: a permanent error, never a guess."""
    if not instance_type:
        return LaunchType("", site.size, site.image)
    t = site.types.get(instance_type)
    if t is not None:
        return LaunchType(instance_type, t.size or instance_type, t.image or site.image, t.quota)
    by_size = {(cfg.size or name): name for name, cfg in site.types.items()}
    if instance_type in by_size:
        return launch_type(site_name, site, by_size[instance_type])
    if any(fnmatch.fnmatchcase(instance_type, p) for p in site.discover):
        return LaunchType(instance_type, instance_type, site.image)
    if not site.types and not site.discover and instance_type == (_type_name(site.size) if site.size else "default"):
        return LaunchType(instance_type, site.size, site.image)
    offered = sorted(declared_type_names(site) or ()) + [f"sizes matching {p}" for p in site.discover]
    raise ValueError(f"site {site_name} offers no instance type {instance_type!r} "
                     f"(offered: {', '.join(offered) or 'none'})")
