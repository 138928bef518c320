"""What the provisioner remembers, as values: records, launches, transitions, misses, sightings,
destroys and its identity. Pure, no I/O, no SQL.

Why a module of its own: ``reconcile`` (the pure judgement of a listing), ``unstarted`` and the
state machine work on these values and must be importable, and testable, without a database
library; the SQL store (``store``) and the simulator's in-memory store
(``epu.sim.provisioner_memstore``) both hand them out. ``tests/provisioner/test_layers.py``
checks that importing ``reconcile`` imports no SQLAlchemy.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from epu.common.messages import InstanceEvent
from epu.services.provisioner.states import is_terminal

#: The site an event names for a record that has none yet (the terminate of an instance this
#: store never launched, its node still to be found): ``InstanceEvent.site`` must be a name.
UNKNOWN_SITE = "unknown"


@dataclass(frozen=True)
class InstanceRecord:
    instance_id: str
    domain: str
    site: str
    node_name: str
    cores: int
    state: str
    seq: int
    cloud_id: str | None
    ip: str | None
    reason: str
    error_kind: str | None
    created_at: float
    updated_at: float
    presumed_gone_at: float | None = None
    """Set while the cloud has stopped listing the node (see ``reconcile``): a presumption,
    never a reason to destroy or close the record."""
    instance_type: str = ""
    """The catalogue type it was launched as ("" = the site's single type; NULL in rows written
    before the column existed)."""
    price_per_hour: float | None = None
    """What one hour of it costs, as the provisioner's catalogue priced its type when the launch
    was recorded (None: unpriced, adopted, or recorded before the column existed). Kept with the
    record so a bill for last month does not change when the catalogue does (``epu cost``)."""
    ended_at: float | None = None
    """When it became ``terminated`` or ``failed`` (None: live, or reopened): with ``created_at``,
    the span it is billed for (``lives``)."""
    reopened_seq: int | None = None
    """The ``seq`` of the transition that reopened this record after ``failed`` (its node was
    found alive, ``Store.reopen``): every event and report entry after it says so, so a consumer
    that holds the instance ``failed`` tells a reopened record from a stale one."""
    end_proof: str | None = None
    """The proof (``common.retire.Proof``) of the terminate that moved it to ``terminating``: a
    destroy carried out later (re-driven after a crash, after a create in flight) is made under
    it. ``None`` before (or in rows written before the column existed)."""

    @property
    def terminal(self) -> bool:
        return is_terminal(self.state)

    @property
    def presumed_gone(self) -> bool:
        return self.presumed_gone_at is not None

    def event(self, *, previous: str | None = None, at: float | None = None) -> InstanceEvent:
        """The record as an ``InstanceEvent`` — its transition's (``previous``, ``at``) or, as a
        report's entry, its latest: then ``previous`` is ``failed`` while the reopening is its
        latest move (what the reopen event said), and ``at`` is when it last changed. An event of
        the reopening or after it carries ``reopened_seq`` (an older one republished by the
        outbox does not: it is from before)."""
        if previous is None and self.reopened_seq is not None and self.reopened_seq == self.seq:
            previous = "failed"
        return InstanceEvent(
            instance_id=self.instance_id, domain=self.domain, site=self.site or UNKNOWN_SITE,
            state=self.state, previous=previous, seq=self.seq, node_name=self.node_name,  # type: ignore[arg-type]
            ip=self.ip, cloud_id=self.cloud_id, cores=self.cores, reason=self.reason,
            error_kind=self.error_kind, at=self.updated_at if at is None else at,  # type: ignore[arg-type]
            presumed_gone=self.presumed_gone, instance_type=self.instance_type,
            reopened_seq=self.reopened_seq if self.reopened_seq is not None and self.seq >= self.reopened_seq else None)



def ended_at(rec: InstanceRecord, new_state: str, now: float) -> float | None:
    """A record's ``ended_at`` once it moves to ``new_state`` at ``now`` (set once, at its end)."""
    if rec.ended_at is not None:
        return rec.ended_at
    return now if is_terminal(new_state) else None

@dataclass(frozen=True)
class LaunchRecord:
    launch_id: str
    domain: str
    site: str
    node_name: str
    cores: int
    attributes: dict[str, str]
    requested_at: float
    cloud_attempts: int


@dataclass(frozen=True)
class Transition:
    """One stored state change, and the event that announces it."""

    id: int
    record: InstanceRecord
    previous: str | None
    at: float

    def event(self) -> InstanceEvent:
        return self.record.event(previous=self.previous, at=self.at)


@dataclass(frozen=True)
class Identity:
    """Who this store's instances belong to: the ``epu-deployment`` and ``epu-store`` tags."""

    deployment: str
    store_id: str


class IdentityError(ValueError):
    """The configured deployment disagrees with the store's (the message names the key)."""


@dataclass(frozen=True)
class Miss:
    """One record's run of consecutive listings that did not show its node (poll and
    reconciliation share it)."""

    instance_id: str
    site: str
    count: int
    first_at: float
    """When the first listing of the run was taken."""
    last_at: float
    """When the latest listing of the run was taken (an older listing arriving late is not another miss)."""


@dataclass(frozen=True)
class Sighting:
    """A listed node this store has no live launch for, and when the store first saw it.

    ``kind``: ``orphan`` (ours, launch unknown: swept after the grace), ``foreign`` (our
    deployment but another store: never touched) or ``reappeared`` (a node of a record closed
    on absence: never touched)."""

    site: str
    cloud_id: str
    launch_id: str
    kind: str
    first_seen: float
    last_seen: float


@dataclass(frozen=True)
class DestroyRecord:
    """One destroy call, recorded before it is made (``terminations``): the ledger an operator
    reads to learn why each node was destroyed, the orphan sweep's included (which has no record)."""

    at: float
    site: str
    cloud_id: str
    instance_id: str
    """The launch id it belongs to ("" when none is known)."""
    proof: str
    """``common.retire.Proof``: what made the destroy safe."""
    why: str


def new_identity_value() -> str:
    return uuid.uuid4().hex


def cloud_field_values(*, cloud_id: str | None, ip: str | None, site: str | None,
                       now: float | None) -> dict[str, Any]:
    """The columns ``set_cloud_fields`` writes, one definition for every store: only what the
    cloud told us, and ``updated_at`` only when something is written."""
    values: dict[str, Any] = {k: v for k, v in (("cloud_id", cloud_id), ("ip", ip), ("site", site))
                              if v is not None}
    if values and now is not None:
        values["updated_at"] = now
    return values


__all__ = ["UNKNOWN_SITE", "DestroyRecord", "Identity", "IdentityError", "InstanceRecord", "LaunchRecord", "Miss",
           "Sighting", "Transition", "cloud_field_values", "new_identity_value"]
