"""What a scenario is: a deployment, a workload, faults, and how long to run. Pure data.

A scenario names one situation (``partial-listing``, ``engine-failover``...) and is run for
many seeds; the seed draws everything the scenario leaves open (when each fault strikes,
job sizes and arrival times, boot times, message delays). ``scenarios.py`` is the catalogue.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from epu.sim.bus import MessageFaults
from epu.sim.cloud import CloudFaults

if TYPE_CHECKING:
    from epu.sim.simulation import Simulation


@dataclass
class SiteSpec:
    name: str
    quota: int = 40
    """EPU's quota for the site ([sites.NAME] quota)."""
    account_quota: int | None = None
    """The cloud account's own limit (InstanceLimitExceeded); None = unlimited."""
    price: float = 0.1
    cores: int = 4
    boot_seconds: tuple[float, float] = (60.0, 180.0)
    faults: CloudFaults = field(default_factory=CloudFaults)
    api_latency: tuple[float, float] = (0.2, 2.0)
    """Seconds before a queued cloud task runs (the API's latency, in virtual time)."""
    types: dict[str, dict[str, Any]] = field(default_factory=dict)
    """An instance-type catalogue (``[sites.NAME.types]``); empty: one type of ``cores``."""
    budget_per_hour: float | None = None
    """The site's spend cap ([sites.NAME] budget_per_hour)."""
    discover: list[str] = field(default_factory=list)
    """``[sites.NAME] discover``: the provisioner offers the driver's ``sizes`` matching these."""
    sizes: dict[str, dict[str, Any]] = field(default_factory=dict)
    """What the cloud's ``list_sizes()`` answers: size id → cores, memory_mb, gpus and ``price``
    (None: the driver gives no price, as libcloud does for many providers)."""

    def price_of(self, instance_type: str) -> float | None:
        """$/h of one instance of ``instance_type`` here ("": the site's price); None when nobody
        priced it — a ``types`` entry without ``price_per_hour``, a listed size without ``price`` —
        which is the truth the checks must see, never 0."""
        t = self.types.get(instance_type)
        if t is not None and t.get("price_per_hour") is not None:
            return float(t["price_per_hour"])
        size = self.sizes.get(str(t.get("size", instance_type)) if t is not None else instance_type)
        if size is not None:
            return None if size.get("price") is None else float(size["price"])
        if t is not None:
            return None
        return self.price


@dataclass
class DomainSpec:
    name: str = "alpha"
    policy: str = "queue-demand"
    params: dict[str, Any] = field(default_factory=dict)
    min_nodes: int = 0
    max_nodes: int = 50
    cores_per_node: int = 4
    node_names: list[str] = field(default_factory=list)
    """A Slurm CLOUD pool of pre-declared names (empty: generated names)."""
    flavor: str = "slurm"
    """slurm, torque or htcondor (see ``batch.py``)."""
    report_identity: bool = True
    """The backend reports NodeInfo.instance_id (False: names only)."""
    condor_drain: str = "peaceful"
    """HTCondor only: how ``offline`` drains — ``peaceful`` (EPU's backend: a peaceful startd
    shutdown, never evicts) or ``graceful`` (``condor_drain -graceful``: evicts once
    ``retirement_seconds`` are spent)."""
    retirement_seconds: float = 0.0
    """HTCondor's MaxJobRetirementTime (its default: 0)."""
    partitions: dict[str, list[str]] = field(default_factory=dict)
    """Partition → instance types (``[domains.NAME.partitions]``)."""
    default_partition: str = ""
    allow_spot: bool = False
    """Spot types of the catalogue may be launched (``allow_spot``)."""
    budget_per_hour: float | None = None
    """The domain's spend cap ([domains.NAME] budget_per_hour)."""
    mode: str = "act"
    """``act`` or ``observe`` (shadow mode)."""
    power: Any = None
    """Slurm-native mode (``epu.sim.power.PowerSpec``): Slurm's power saving picks the nodes and
    calls ``epu slurm resume|suspend|resume-fail``; the domain runs ``native = "slurm"``. None: off."""


@dataclass
class ProvisionerSpec:
    name: str = "prov-1"
    deployment: str | None = None
    """``[provisioner] deployment``; ``None`` leaves it unset (the default)."""
    store: str = "prov"
    """Name of its store database: two provisioners with the same store share it."""
    sites: list[str] | None = None
    """Sites it holds credentials for (None: all)."""
    managed: bool = True
    """Consumes this deployment's work queue (False: another deployment's provisioner, idle here)."""


@dataclass
class Workload:
    arrivals_per_hour: float = 40.0
    burst_per_hour: float = 0.5
    burst_jobs: tuple[int, int] = (10, 60)
    cores: tuple[int, ...] = (1, 1, 2, 4)
    nodes: tuple[int, ...] = (1, 1, 1, 1, 2)
    duration: tuple[float, float] = (120.0, 1800.0)


@dataclass
class Timing:
    iteration_seconds: float = 10.0
    sensor_poll_seconds: float = 60.0
    provisioner_poll_seconds: float = 30.0
    reconcile_seconds: float = 300.0
    orphan_grace_seconds: float = 600.0
    outbox_seconds: float = 60.0
    stall_seconds: float = 600.0
    resend_seconds: float = 30.0
    active_window_seconds: float = 180.0


Fault = Callable[["Simulation"], None]
"""Schedules one kind of fault over the fault phase, drawing from the world's streams."""


@dataclass
class Scenario:
    name: str
    summary: str
    hours: float = 4.0
    """Length of the fault phase (the workload runs during it too)."""
    domain: DomainSpec = field(default_factory=DomainSpec)
    sites: list[SiteSpec] = field(default_factory=lambda: [SiteSpec("cloud-a")])
    engines: int = 1
    provisioners: list[ProvisionerSpec] = field(default_factory=lambda: [ProvisionerSpec()])
    workload: Workload = field(default_factory=Workload)
    timing: Timing = field(default_factory=Timing)
    messages: MessageFaults = field(default_factory=MessageFaults)
    faults: list[Fault] = field(default_factory=list)
    stresses: str = ""
    """The issue bullet or fault this scenario exists for."""
    seeds_in_ci: int = 8
    """How many seeds ``make test`` runs (seeds 1..N; tests/sim/test_scenarios.py). Eight for a run
    of about half a CPU second; never fewer than four, also for the scenarios that cost several
    times that (provisioner stores on SQLite, typed catalogues) — a regression on a scenario's seed 6
    once landed because CI ran only its seed 1. Fresh seeds are the sweep's (docs/simulation.md)."""
    setup: Callable[[Simulation], None] | None = None
    """Extra wiring (a second deployment's nodes, a backup to restore...)."""
    context: Any = None
    """``epu.sim.context.ContextFaults``: put the context broker, its agents and an adversary in
    the world (invariant 9); None: no broker."""
    id_prefix_bits: int = 0
    """A small launch-id space (``World.id_prefix_bits``): generated node names collide (0: full ids)."""

    def quiet_seconds(self) -> float:
        """The convergence bound: after the faults stop, everything must be settled within this
        (the longest job, three stall periods, an orphan grace and two reconciliations)."""
        t = self.timing
        return (self.workload.duration[1] + 3 * t.stall_seconds + t.orphan_grace_seconds
                + 2 * t.reconcile_seconds + float(self.domain.params.get("idle_seconds", 0.0))
                + float(self.domain.params.get("idle_for_time_s", 0.0)))
