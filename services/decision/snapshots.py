"""The newest snapshot of each domain as the engine keeps it: admitted in its sensor's order,
digested once on arrival, aged by when the engine received it.

Why a module of its own: an engine iterates every few seconds on the snapshot its sensor sent up
to a minute ago. What a snapshot says that no iteration changes — its queued shapes
(``JobDigest``), its node index, its free workers, the circuit breaker's snapshot-only verdict —
is worked out once, when it arrives, and kept here beside it; ``forget`` drops it all when the
broker connection goes (another engine may act on the domain now). Which snapshot is newer and
how far the sensor's clock is off are ``snaporder``'s rules; this keeper applies them."""

from __future__ import annotations

import operator
from dataclasses import dataclass

from epu.common.messages import NodeInfo, SensorSnapshot
from epu.services.decision.snaporder import ClockSkew, SnapshotOrder
from epu.services.decision.view import JobDigest, NodeIndex


@dataclass
class Latest:
    """The newest snapshot of a domain, digested once on arrival (not at every iteration)."""

    snapshot: SensorSnapshot
    digest: JobDigest
    nodes: NodeIndex
    received_at: float
    free: list[NodeInfo] | None = None
    """The snapshot's free workers (``DomainView.free_workers``), listed once per snapshot."""
    jobs_verdict: str | None = None
    """The circuit breaker's snapshot-only question (``breaker.jobs_verdict``), asked once."""

    def free_workers(self) -> list[NodeInfo]:
        """``free``, listed now if it was not on arrival."""
        if self.free is None:
            self.free = [n for n in self.nodes.by_name.values() if n.state == "free" and n.cores_used < n.cores]
        return self.free


class Snapshots:
    """Per domain, the newest snapshot (``latest``), with the order and clock-skew bookkeeping
    that decide which one that is and when it was taken in the engine's clock."""

    def __init__(self) -> None:
        self.latest: dict[str, Latest] = {}
        self.order = SnapshotOrder()
        """Which snapshot of a domain is newer, by its sensor's count (snaporder.py)."""
        self.skew = ClockSkew()
        """How far each domain's sensor clock is off: its ``taken_at`` in the engine's clock."""

    def admit(self, snap: SensorSnapshot, now: float) -> bool:
        """Keep ``snap`` if it is the domain's newest (received ``now``); True when its queued
        demand differs from the one before (the caller may then iterate at once)."""
        prev = self.latest.get(snap.domain)
        if not self.order.admit(snap):
            return False  # an older snapshot arriving late says nothing new (by its sensor's count)
        self.skew.observe(snap.domain, snap.taken_at, now)
        digest = JobDigest.of_snapshot(snap)
        nodes = NodeIndex(snap.nodes if snap.available else [], before=prev.nodes if prev is not None else None)
        latest = self.latest[snap.domain] = Latest(snap, digest, nodes, now, free=nodes.free)
        if prev is not None and prev.jobs_verdict is not None and _same_jobs_question(prev.snapshot, snap):
            latest.jobs_verdict = prev.jobs_verdict  # the same question: the same answer
        return prev is None or prev.digest.shapes != digest.shapes

    def get(self, domain: str) -> Latest | None:
        return self.latest.get(domain)

    def fresh(self, domain: str, now: float, window: float) -> bool:
        """A snapshot of ``domain`` received at most ``window`` seconds before ``now``."""
        latest = self.latest.get(domain)
        return latest is not None and now - latest.received_at <= window

    def snapshot(self, domain: str) -> SensorSnapshot | None:
        latest = self.latest.get(domain)
        return latest.snapshot if latest is not None else None

    def taken(self, domain: str) -> float | None:
        """When the newest snapshot of ``domain`` was taken, in this engine's clock (None: none)."""
        latest = self.latest.get(domain)
        if latest is None:
            return None
        return self.skew.engine_time(domain, latest.snapshot.taken_at, latest.received_at)

    def forget(self) -> None:
        """Drop every domain's snapshot (the order and the skew estimate stay: they are about the
        sensors, not about who acts)."""
        self.latest.clear()


def _same_jobs_question(before: SensorSnapshot, snap: SensorSnapshot) -> bool:
    """``breaker.jobs_verdict`` asks ``snap`` what it asked ``before``: a function of ``available``,
    ``running_jobs`` and the node list alone, and these are equal — the very node objects
    (frozen), as most snapshots of a quiet cluster repeat them (its pass over every job on every
    node was made again per snapshot)."""
    a, b = before.nodes, snap.nodes
    return (before.available == snap.available and before.running_jobs == snap.running_jobs
            and len(a) == len(b) and all(map(operator.is_, a, b)))
