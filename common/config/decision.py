"""[decision] and [domains.NAME] — the decision engine and the domains it manages."""

from __future__ import annotations

from typing import Any, Literal

from epu.common.config.base import ServiceCommon
from epu.common.config.catalogue import DomainCatalogue
from pydantic import Field, model_validator


class DecisionConfig(ServiceCommon):
    iteration_seconds: float = Field(5.0, gt=0)
    store_url: str = "sqlite:///epu-decision.db"
    resend_seconds: float = Field(30.0, gt=0)
    """Re-send an action whose outcome has not been seen after this long."""
    active_window_seconds: float = Field(180.0, gt=0)
    """The engine acts on a domain only while it holds a snapshot younger than this. Snapshots
    reach only the active consumer of the single-active-consumer input queue, so a standby
    engine never acts; it should exceed the sensor's poll period (default 60 s)."""
    lease_seconds: float | None = Field(None, gt=0)
    """How long a domain's lease (fencing, one acting engine per domain) lasts without renewal.
    Default: three iterations, at least 2 s, at most ``active_window_seconds``. A standby takes
    over a dead engine's domains this long after its last renewal (at once after a clean stop
    or a lost broker connection, which release the leases)."""
    backoff_initial_seconds: float = Field(300.0, ge=0)
    """First pause of a failing site (doubles per consecutive failure)."""
    backoff_max_seconds: float = Field(1800.0, ge=0)
    """Longest pause of a failing site."""
    wake_min_seconds: float = Field(0.2, ge=0)
    """A snapshot whose queued demand changed runs an iteration at once instead of at the next
    tick, but never sooner than this after the last iteration (the rate limit of reacting early)."""
    pipeline_gap_seconds: float = Field(150.0, gt=0)
    """No fresh available snapshot, or a launch/terminate unanswered by the provisioner, for this
    long means our own pipeline is down: stall and loss clocks restart when it is back, so a site
    is never blamed for our outage."""
    breaker_missing_share: float = Field(0.45, gt=0, le=1)
    """Circuit breaker: more than this share of a domain's joined nodes missing from one snapshot
    (or that many running jobs on no listed node) is implausible: scale-down and lost-node
    handling freeze until a healthy snapshot or an operator releases it (cluster-autoscaler's
    max-total-unready-percentage)."""
    breaker_ok_count: int = Field(3, ge=0)
    """... but this many missing nodes never trip it (cluster-autoscaler's ok-total-unready-count)."""
    capacity_cooldown_seconds: float = Field(180.0, ge=0)
    """An instance type at a site that answered a capacity error (stockout, quota) is left out for
    this long (Karpenter: 3 minutes); the packer fails over at once to the next cheapest offer.
    Only that offering is out, not the site."""
    spot_fallback_failures: int = Field(3, ge=1)
    """After this many capacity errors of spot offerings in a row (no spot instance started in
    between), a domain launches on-demand types only ..."""
    spot_fallback_seconds: float = Field(1800.0, ge=0)
    """... for this long, then tries spot again."""


    def lease_ttl(self) -> float:
        return self.lease_seconds or min(self.active_window_seconds, max(3 * self.iteration_seconds, 2.0))


class DomainConfig(DomainCatalogue):
    """One batch cluster plus the cloud sites it may use (and, from ``DomainCatalogue``, which
    instance types serve which partition)."""

    policy: str = "queue-demand"
    params: dict[str, Any] = Field(default_factory=dict)
    min_nodes: int = Field(0, ge=0)
    max_nodes: int = Field(10, ge=0)
    sites: list[str] = Field(default_factory=list)
    """Sites in rank order (empty: every configured site, in file order)."""
    placement: Literal["rank", "cheapest", "spread"] = "rank"
    cores_per_node: int = Field(1, ge=1)
    paused: bool = False
    max_nodes_ceiling: int | None = Field(None, ge=0)
    """The most ``max_nodes`` (and ``min_nodes``) this domain may have, in the file and by a
    run-time policy change alike (``services.decision.changes.nodes_ceiling``). Default: the sum
    of the quotas of the domain's sites. A file whose ``max_nodes`` is above it is refused at
    start (``epu config check``, ``epu run decision``) with the key and the bound — a bound the
    clouds can never give is a misreading of capacity, and the file's number must not become the
    ceiling, or one mistyped ``max_nodes`` would let run-time changes plan a million launches.
    To allow more than the quotas (quotas about to be raised), set this explicitly. A change
    beyond it is rejected with the reason."""
    node_names: list[str] = Field(default_factory=list)
    """Names for new workers, first free one first: the batch system's pre-declared slots
    (e.g. Slurm ``NodeName=... State=CLOUD`` lines). Empty: ``<domain>-<launch id>``. A name
    is free again once its instance is terminated or failed; launches beyond the list wait."""
    budget_per_hour: float | None = Field(None, gt=0)
    """Spend cap: the most the domain's live instances may cost per hour together (prices from the
    sites' catalogues). A launch that would take the domain's spend rate above it is held
    (``services/decision/budget.py``); scale-down is never held. None: no cap."""
    mode: Literal["act", "observe"] = "act"
    """``observe`` (shadow mode): every iteration runs and its decision record lists what it would
    have done (``shadow``), but nothing is stored as intent or sent."""
    native: Literal["", "slurm"] = ""
    """``slurm``: Slurm-native mode (docs/policies.md, "Native mode"). Slurm's own power saving
    picks the nodes (``epu slurm resume|suspend|resume-fail`` as its programs): a resumed node is
    launched under its name, as the type its features (or ``type_nodes``) name; a resume EPU
    cannot serve is given back to Slurm at once; Slurm's suspend ends a node only with its removal
    proved. The policy's own launches and scale-down are off. "": EPU drives the cluster."""
    native_resume_seconds: float = Field(1800.0, gt=0)
    """Native mode: how long a resume call stays demand with no sign of it in Slurm's snapshots
    (set it to slurm.conf's ResumeTimeout; later Slurm has given up on the node anyway)."""

    @model_validator(mode="after")
    def _bounds(self) -> DomainConfig:
        if self.min_nodes > self.max_nodes:
            raise ValueError(f"min_nodes ({self.min_nodes}) is greater than max_nodes ({self.max_nodes})")
        if self.max_nodes_ceiling is not None and self.max_nodes > self.max_nodes_ceiling:
            raise ValueError(f"max_nodes ({self.max_nodes}) is above max_nodes_ceiling ({self.max_nodes_ceiling})")
        return self
