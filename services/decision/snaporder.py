"""Which snapshot is newer, and how far a sensor's clock is off — never by the sensor's clock.

Why: snapshots used to be ordered and aged by ``taken_at``, the head node's wall clock. One
snapshot taken while that clock ran an hour fast made the engine drop every later one until the
clock caught up (a domain frozen: jobs queued, no launch), and a steady skew beyond the active
window made every snapshot look stale on arrival. Clocks step (NTP corrections both ways) and
drift; a count does not.

* **Order** (``SnapshotOrder.admit``): a snapshot carries its sensor's ``incarnation`` (random
  at the sensor's start) and ``sequence`` (1, 2, … within it). Within an incarnation a higher
  sequence is newer; a new incarnation supersedes the one before (a restarted sensor counts
  from 1 again and is not "older"), and a snapshot of an incarnation already superseded is
  refused (one left in flight from before the restart). A snapshot without an incarnation
  (a sender older than schema 1.1) is ordered by ``taken_at`` as before.
* **Age**: the engine judges freshness by when *it* received a snapshot (``Engine.is_active``);
  a snapshot left in the queue while no engine ran expires there by the broker's clock (the
  sensor publishes it with a message TTL of the active window, ``Publisher.expire_after``).
  Only a snapshot without an incarnation is still aged by its ``taken_at`` on arrival
  (``stale_on_arrival``).
* **Skew** (``ClockSkew``): ``taken_at - received_at`` of each snapshot is the sensor clock's
  offset less the message's transit; the largest of the last few (the quickest transit) is the
  estimate, reported as a metric and in ``epu status``, and used to translate a snapshot's
  ``taken_at`` into the engine's clock where it is compared with the engine's own times (a
  drain sent before or after the snapshot was taken).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from epu.common.messages import SensorSnapshot

#: Incarnations remembered as superseded per domain (a sensor restarting this often in flight is
#: not a case to plan for; older ones are forgotten).
RETIRED_KEPT = 16
#: Snapshots the skew estimate looks back over.
SKEW_WINDOW = 8
#: Seconds of measured skew below which ``taken_at`` is used as it is (transit, not a clock off).
SKEW_TOLERANCE = 2.0


@dataclass
class _Seen:
    incarnation: str = ""
    sequence: int = 0
    taken_at: float | None = None
    retired: deque[str] = field(default_factory=lambda: deque(maxlen=RETIRED_KEPT))


class SnapshotOrder:
    """Per domain: the newest snapshot's place in its sensor's count."""

    def __init__(self) -> None:
        self._seen: dict[str, _Seen] = {}

    def why_not_newer(self, snap: SensorSnapshot) -> str | None:
        """Why ``snap`` is not newer than the last one admitted for its domain, or None."""
        seen = self._seen.get(snap.domain)
        if seen is None:
            return None
        if not snap.incarnation:
            if not seen.incarnation and seen.taken_at is not None and seen.taken_at > snap.taken_at:
                return "taken before the newest (no sensor incarnation: ordered by taken_at)"
            return None
        if snap.incarnation in seen.retired:
            return f"from sensor incarnation {snap.incarnation!r}, superseded by {seen.incarnation!r}"
        if snap.incarnation == seen.incarnation and snap.sequence <= seen.sequence:
            return f"sequence {snap.sequence} is not after {seen.sequence} (incarnation {snap.incarnation!r})"
        return None

    def admit(self, snap: SensorSnapshot) -> bool:
        """Record ``snap`` as its domain's newest if it is newer; False (recording nothing) if not."""
        if self.why_not_newer(snap) is not None:
            return False
        seen = self._seen.setdefault(snap.domain, _Seen())
        if snap.incarnation and seen.incarnation and snap.incarnation != seen.incarnation:
            seen.retired.append(seen.incarnation)
        if snap.incarnation or not seen.incarnation:
            seen.incarnation, seen.sequence = snap.incarnation, snap.sequence
        seen.taken_at = snap.taken_at
        return True


class ClockSkew:
    """Per domain: how far the sensor's clock is ahead of the engine's (see the module)."""

    def __init__(self) -> None:
        self._offsets: dict[str, deque[float]] = {}

    def observe(self, domain: str, taken_at: float, received_at: float) -> None:
        self._offsets.setdefault(domain, deque(maxlen=SKEW_WINDOW)).append(taken_at - received_at)

    def skew(self, domain: str) -> float | None:
        offsets = self._offsets.get(domain)
        return max(offsets) if offsets else None

    def engine_time(self, domain: str, taken_at: float, received_at: float) -> float:
        """``taken_at`` in the engine's clock: never later than the snapshot was received. A skew
        within ``SKEW_TOLERANCE`` is taken for transit and left alone (the estimate errs late by
        the quickest transit: with clocks in step, ``taken_at`` itself is the better answer)."""
        skew = self.skew(domain)
        if skew is None or abs(skew) < SKEW_TOLERANCE:
            return min(received_at, taken_at)
        return min(received_at, taken_at - skew)


def stale_on_arrival(snap: SensorSnapshot, now: float, window: float) -> float | None:
    """The age of a snapshot too old to act on when it arrives, or None. Only a snapshot without
    an incarnation is aged by its own clock here; the others expire in the queue (broker TTL)."""
    if snap.incarnation:
        return None
    age = now - snap.taken_at
    return age if age > window else None
