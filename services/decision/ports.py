"""The decision engine's ports: what it asks of its durable store and of its leases.

Two implementations sit behind each port and must behave alike — the SQL ones (``store.Store``
and ``lease.Leases``, SQLite or PostgreSQL: what production runs) and the simulator's in-memory
ones (``epu.sim.decision_memstore``). The engine is typed with these Protocols, never with a
concrete class, and never asks an implementation whether it has a method (no ``getattr``
probe): a method listed here is called, so the simulator runs exactly the engine code
production runs. ``tests/conformance`` runs every implementation through the same cases.

Every method is required. None is optional today; should one become so, it is marked as
cluster-autoscaler's ``NodeGroup`` marks its own — "Implementation optional": the method is
still declared by every implementation and raises ``NotImplementedError``, and the caller
names its fallback where it catches that.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from epu.common.config.decision import DomainConfig
    from epu.common.messages import Message
    from epu.services.decision.occupancy import JobSpan
    from epu.services.decision.placement import SiteHealth
    from epu.services.decision.planner import Plan
    from epu.services.decision.store import PlanWrite
    from epu.services.decision.view import Instance

Fence = Callable[[Any], None]
"""A lease check run inside a plan's transaction (``DecisionLeases.fence``); raises ``Fenced``."""


class DecisionStore(Protocol):
    """The engine's durable state: configs, the instance table, the intent log of actions, site
    health and policy memory. Reads may be served from a cached working set; ``sync`` and
    ``invalidate`` say when that cache may be stale (another engine wrote the shared store)."""

    # ---------------------------------------------------------------- the working set
    def create(self) -> DecisionStore:
        """Make the schema when missing; returns the store."""
        ...

    def invalidate(self) -> None:
        """Forget any cached working set: the next read loads it again."""
        ...

    def sync(self) -> None:
        """Drop the cached working set if another engine wrote since this one last looked."""
        ...

    # ---------------------------------------------------------------- configs and changes
    def current_config(self, domain: str) -> tuple[int, DomainConfig] | None:
        """(version, config) of the domain's current config."""
        ...

    def config_history(self, domain: str) -> list[dict[str, Any]]:
        ...

    def domains(self) -> list[str]:
        ...

    def put_config(self, domain: str, cfg: DomainConfig, *, source: str, now: float,
                   change_id: str | None = None, conn: Any = None) -> int:
        ...

    def seed_config(self, domain: str, cfg: DomainConfig, now: float) -> int:
        """Make the file's config current, key by key, without undoing an operator's change."""
        ...

    def change_outcome(self, change_id: str) -> dict[str, Any] | None:
        """The stored outcome of a policy change (a re-delivered change is answered again)."""
        ...

    def change_history(self, domain: str, limit: int = 50) -> list[dict[str, Any]]:
        """The domain's newest ``limit`` policy changes, oldest first (applied or refused, why, who)."""
        ...

    def record_change(self, change_id: str, domain: str, applied: bool, reason: str, now: float,
                      cfg: DomainConfig | None = None, retire: Iterable[Instance] = (), *,
                      operator: str = "", request: str = "") -> int | None:
        ...

    # ---------------------------------------------------------------- instances
    def instances(self, domain: str | None = None, live_only: bool = True) -> list[Instance]:
        """Instances of ``domain`` (all domains: None), oldest launch first."""
        ...

    def terminating(self, domain: str) -> list[Instance]:
        """The domain's live instances in ``terminating``."""
        ...

    def domain_stamp(self, domain: str) -> int:
        """Equal stamps: the same live instance set of the domain (no instance stored since)."""
        ...

    def cleanup(self, domain: str) -> list[Instance]:
        """Ended instances whose batch node is not confirmed removed."""
        ...

    def known(self, instance_ids: list[str]) -> Mapping[str, Instance | None]:
        """Each of ``instance_ids`` that is stored, live or ended, to its instance as stored now;
        an unknown id is absent or maps to ``None`` (an anti-entropy report compares its entries
        with them: their ``seq`` and state)."""
        ...

    def instance(self, instance_id: str) -> Instance | None:
        ...

    def save_instances(self, items: Iterable[Instance], conn: Any = None) -> None:
        ...

    def live_per_site(self) -> tuple[dict[str, int], dict[str, int]]:
        """(live instances per site, launched-but-not-joined per site), over every domain."""
        ...

    def live_per_type(self) -> dict[tuple[str, str], int]:
        """Live instances per (site, instance type), over every domain."""
        ...

    def record_instance_event(self, inst: Instance, kinds: tuple[str, ...], outcome: str) -> None:
        """An instance event's effect in one transaction: the row and its open actions closed."""
        ...

    # ---------------------------------------------------------------- sites and policy memory
    def site_health(self) -> dict[str, SiteHealth]:
        ...

    def save_sites(self, items: Iterable[SiteHealth], conn: Any = None) -> None:
        ...

    def memory(self, domain: str) -> tuple[dict[str, Any], int]:
        """(policy memory, iteration count) of the domain."""
        ...

    # ---------------------------------------------------------------- plans and the intent log
    def commit_plan(self, domain: str, plan: Plan, now: float, memory: dict[str, Any] | None,
                    iteration: int, refreshed: Iterable[Instance] = (), fence: Fence | None = None) -> None:
        """Store an iteration's effects and actions in one transaction, before any is sent;
        ``fence`` refuses the whole transaction when the domain's lease is lost."""
        ...

    def commit_plans(self, writes: list[PlanWrite]) -> dict[str, Exception]:
        """Several domains' plans in one transaction, each as ``commit_plan`` would; returns
        the domains whose plan was not stored, with why."""
        ...

    def store_actions(self, domain: str, plan: Plan, now: float, fence: Fence | None = None) -> None:
        """Out-of-iteration actions with their instance rows (``fence`` as in ``commit_plan``)."""
        ...

    def mark_sent(self, action_ids: list[str], now: float) -> None:
        ...

    def unsent_or_due(self, domains: list[str], now: float, resend_seconds: float) -> list[Message]:
        """Open actions never sent, or sent longer than ``resend_seconds`` ago, oldest first."""
        ...

    def overdue(self, domain: str, sent_before: float) -> bool:
        """Is a launch or terminate of ``domain`` first sent before ``sent_before`` unanswered?"""
        ...

    def first_unanswered(self, domain: str) -> float | None:
        """Creation time of the oldest sent, still open launch or terminate of ``domain`` (None:
        none): when ``overdue`` may turn (``Engine.next_deadlines``)."""
        ...

    def in_flight(self, domain: str) -> set[tuple[str, str]]:
        ...

    def open_sent_at(self, domain: str) -> list[float | None]:
        ...

    def complete(self, *, action_id: str | None = None, target: str | None = None,
                 kinds: tuple[str, ...] = (), outcome: str, conn: Any = None) -> int:
        """Close open actions (by id, or by target and kind); returns how many were open."""
        ...

    def record_node_result(self, action_id: str, outcome: str, inst: Instance | None) -> None:
        """A node command's answer and the instance row it changes, in one transaction (a
        compare-and-set: ``StaleWrite`` when another engine wrote since this one read)."""
        ...

    # ---------------------------------------------------------------- job spans (epu cost)
    def open_jobs(self, domain: str) -> dict[int, JobSpan]:
        """The domain's job spans still open, by row (``occupancy``)."""
        ...

    def note_jobs(self, domain: str, at: float, opened: list[JobSpan], closed: list[tuple[int, float]]) -> list[int]:
        """One snapshot's effect on the domain's spans (close, see, open) in one transaction;
        the new rows' ids. Outside the working set: the generation does not move."""
        ...

    def job_spans(self, since: float, until: float, domain: str | None = None) -> list[JobSpan]:
        """Spans started before ``until`` and open or ended after ``since``, oldest first."""
        ...

    def action(self, action_id: str) -> dict[str, Any] | None:
        ...

    def actions(self, domain: str | None = None, kind: str | None = None) -> list[dict[str, Any]]:
        ...


class DecisionLeases(Protocol):
    """Fencing across engine processes: one lease per domain in the shared store (``lease``)."""

    def create(self) -> DecisionLeases:
        ...

    def hold(self, domain: str, now: float) -> bool:
        """Take or renew the lease of ``domain``; True if this engine holds it now."""
        ...

    def renew_many(self, domains: list[str], now: float) -> set[str]:
        """Renew at once the leases of ``domains`` this engine holds; returns those renewed (the
        others are ``hold``'s, one by one)."""
        ...

    def fence(self, domain: str, now: float) -> Fence:
        """A check for a plan's transaction: extends the lease if still ours, else ``Fenced``."""
        ...

    def release(self, domain: str | None = None) -> None:
        ...

    def row(self, domain: str) -> tuple[str, int, float] | None:
        """(holder, epoch, expires_at) of the shared lease of ``domain``."""
        ...

    def state(self, domain: str, active: bool) -> str:
        """``active``, ``standby`` or ``fenced``."""
        ...
