"""The simulated provisioner's anti-entropy report, made without rebuilding unchanged entries.

The provisioner reports every live or recently ended instance every ``report_seconds``; in a
simulated month that is hundreds of thousands of ``InstanceEvent``s, nearly all made from
records that did not change since the last report. The service builds each one afresh (the SQL
store hands out new record objects at every read, so nothing could be reused there); the
simulator's in-memory store hands out the very same frozen record object until the record
changes, so ``EventMemo`` — passed to ``publish_reports`` as its ``make`` — hands out the event
it already made from that very object.

What it skips: only the construction of an event equal to one made before. An event is a pure
function of its record's fields, records and events are frozen (a change to a record is a new
object, which misses the memo and gets a new event), and everything else — which records the
store lists, the horizon, the domains, the publishing — runs the service's own code. So every
report the simulator sends is equal to the one the service would build from the same store;
it cannot hide a fault of the report. ``tests/sim/test_report_memo.py`` compares the two over
random changes.
"""

from __future__ import annotations

from epu.common.messages import TERMINAL_INSTANCE_STATES, InstanceEvent
from epu.services.provisioner.app import event_of
from epu.services.provisioner.store import InstanceRecord

#: The memo is pruned of ended records once it holds more than this many entries, or twice as
#: many as after the last pruning (ended records are the only ones that leave the reports).
MIN_PRUNE = 1024


class EventMemo:
    """``publish_reports``' ``make`` for the simulator: ``event_of(record)``, taken again while
    the record is the very object the event was made from. One per provisioner boot (a restart
    starts empty, as the service's would)."""

    def __init__(self) -> None:
        self._made: dict[str, tuple[InstanceRecord, InstanceEvent]] = {}
        """By instance id: the record an event was last made from, and that event."""
        self._limit = MIN_PRUNE

    def __call__(self, record: InstanceRecord) -> InstanceEvent:
        hit = self._made.get(record.instance_id)
        if hit is not None and hit[0] is record:
            return hit[1]
        event = event_of(record)
        self._made[record.instance_id] = (record, event)
        if len(self._made) > self._limit:
            self._prune()
        return event

    def _prune(self) -> None:
        """Forget the ended records' events (an ended record that is still reported costs one
        event again); the live ones are in every report."""
        self._made = {k: v for k, v in self._made.items() if v[0].state not in TERMINAL_INSTANCE_STATES}
        self._limit = max(MIN_PRUNE, 2 * len(self._made))
