"""The provisioner's port to its durable memory: what ``Provisioner``, its app and its CLI ask
of a store.

Two implementations sit behind it and must behave alike — ``store.Store`` (SQLAlchemy Core on
SQLite or PostgreSQL: what production runs) and the simulator's in-memory one
(``epu.sim.provisioner_memstore``). The provisioner is typed with this Protocol and never asks an
implementation whether it has a method (no ``getattr`` probe), so the simulator runs the
provisioner code production runs. ``tests/conformance`` runs every implementation through the
same cases, the compare-and-set races included.

Every method is required. None is optional today; should one become so, it is marked as
cluster-autoscaler's ``NodeGroup`` marks its own — "Implementation optional": still declared by
every implementation, raising ``NotImplementedError``, with the caller's fallback where it
catches that.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from epu.common.messages import LaunchRequest
    from epu.services.provisioner.records import (
        DestroyRecord,
        Identity,
        InstanceRecord,
        LaunchRecord,
        Miss,
        Sighting,
        Transition,
    )


class ProvisionerStore(Protocol):
    """Launches, instance records and their transitions (forward only, compare-and-set on each
    record's ``seq``), the outbox of unpublished transitions, the destroy ledger, misses, sightings
    and the deployment identity."""

    def close(self) -> None:
        ...

    # ---------------------------------------------------------------- launches
    def record_launch(self, req: LaunchRequest, now: float,
                      price: float | None = None) -> tuple[InstanceRecord, Transition | None]:
        """Store the intent before any cloud call, with its type's price per hour now (None:
        unknown): the record and its first transition, or ``(existing, None)`` for a duplicate
        request."""
        ...

    def get_with_launch(self, instance_id: str) -> tuple[InstanceRecord | None, LaunchRecord | None]:
        ...

    def begin_attempt(self, instance_id: str, now: float) -> tuple[InstanceRecord | None, LaunchRecord | None]:
        """Read instance and launch and, if the instance is still ``requested``, count an attempt."""
        ...

    def get_launch(self, launch_id: str) -> LaunchRecord | None:
        ...

    def launch_ids(self, ids: list[str]) -> set[str]:
        """Those of ``ids`` that are launches this store made."""
        ...

    def note_cloud_attempt(self, launch_id: str, now: float) -> None:
        """Count a create call before it is made (after a crash, > 0: look in the cloud first)."""
        ...

    # ---------------------------------------------------------------- records
    def get(self, instance_id: str) -> InstanceRecord | None:
        ...

    def list(self, *, domain: str | None = None, site: str | None = None,
             states: tuple[str, ...] | list[str] | None = None, active_only: bool = False,
             live_or_updated_since: float | None = None) -> list[InstanceRecord]:
        ...

    def advance(self, instance_id: str, new_state: str, now: float, *, reason: str = "",
                error_kind: str | None = None, cloud_id: str | None = None,
                ip: str | None = None, expect: InstanceRecord | None = None,
                proof: str | None = None) -> Transition | None:
        """Move a record forward, or do nothing (None) when the move is not allowed or the
        record is no longer ``expect``. ``proof``: kept as the record's ``end_proof``."""
        ...

    def note_presence(self, instance_id: str, presumed_gone: bool, now: float, reason: str) -> Transition | None:
        """Set or clear the presumed-gone flag of a live record, as a transition of its own."""
        ...

    def records_for(self, site: str, launch_ids: Iterable[str]) -> dict[str, InstanceRecord]:
        """The site's live records and every record of ``launch_ids`` (what a listing is compared with)."""
        ...

    def reopen(self, instance_id: str, state: str, now: float, reason: str, *, cloud_id: str,
               ip: str | None = None) -> Transition | None:
        """The one move backwards: a ``failed`` record whose node the cloud lists alive, reopened
        in the state the cloud shows with the next ``seq``, kept as its ``reopened_seq``
        (``None``: not ``failed`` any more)."""
        ...

    def set_cloud_fields(self, instance_id: str, *, cloud_id: str | None = None, ip: str | None = None,
                         now: float | None = None, site: str | None = None) -> None:
        ...

    def touch(self, instance_id: str, now: float, reason: str) -> None:
        """Note something about a record without a transition."""
        ...

    def record_found(self, instance_id: str, domain: str, state: str, now: float, reason: str, *,
                     site: str = "", node_name: str = "", cloud_id: str | None = None,
                     ip: str | None = None, proof: str | None = None) -> tuple[InstanceRecord, Transition | None]:
        """A record for an instance this store never launched (adopted; ``proof``: its ``end_proof``)."""
        ...

    def lives(self, since: float, until: float) -> list[InstanceRecord]:
        """Records whose billed span (``created_at`` to ``ended_at``, open while live) overlaps
        [since, until), oldest first (``epu cost``)."""
        ...

    def active_count(self, site: str, instance_type: str | None = None) -> int:
        """Instances at ``site`` that are not terminal (what a quota counts)."""
        ...

    def counts(self) -> dict[str, int]:
        ...

    def history(self, instance_id: str) -> list[dict[str, Any]]:
        ...

    # ---------------------------------------------------------------- the destroy ledger
    def record_destroy(self, d: DestroyRecord) -> None:
        """Keep one destroy call (``terminations``: written before the call is made)."""
        ...

    def destroys(self, *, instance_id: str | None = None, cloud_id: str | None = None,
                 limit: int = 100) -> list[DestroyRecord]:
        """The latest ``limit`` destroy calls (of one instance or one node), oldest first."""
        ...

    # ---------------------------------------------------------------- identity, misses, sightings
    def claim_identity(self, configured: str | None = None,
                       new_id: Callable[[], str] = ...) -> Identity:
        """This store's deployment identity and store id, made at first start and kept."""
        ...

    def misses(self, site: str) -> dict[str, Miss]:
        ...

    def save_misses(self, put: list[Miss], clear: list[str]) -> None:
        ...

    def sightings(self, site: str) -> dict[str, Sighting]:
        ...

    def save_sightings(self, site: str, put: list[Sighting], forget: list[str]) -> None:
        ...

    # ---------------------------------------------------------------- the outbox
    def mark_published(self, transition_ids: list[int]) -> None:
        """Note transitions as published (the mark rides along with the next write)."""
        ...

    def flush_marks(self) -> None:
        ...

    def unpublished(self, older_than: float, limit: int = 500) -> list[Transition]:
        """Transitions stored but never announced (their publisher crashed), oldest first."""
        ...
