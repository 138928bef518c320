"""The simulated provisioner's anti-entropy report, made without rebuilding unchanged entries.

The provisioner reports every live or recently ended instance every ``report_seconds``; in a
simulated month that is millions of ``InstanceEvent``s, nearly all made from records that did
not change since the last report. The service builds each one afresh (``report_events``: the SQL
store hands out new record objects at every read, so nothing could be reused there); the
simulator's in-memory store hands out the very same frozen record object until the record
changes, so ``ReportEvents`` — passed to ``publish_reports`` as its ``events`` — hands out the
event it already made from that very object, and looks them up for a whole listing at once.

What it skips: only the construction of an event equal to one made before, and the per-record
work of finding it. An event is a pure function of its record's fields, records and events are
frozen (a change to a record is a new object, which misses the memo and gets a new event), the
horizon's filter and the grouping by domain are ``report_events``' own rules applied to the same
records in the same order, and everything else — which records the store lists, the horizon, the
domains, the publishing — runs the service's own code. So every report the simulator sends is
equal to the one the service would build from the same store; it cannot hide a fault of the
report. The whole answer is handed out again while the store lists the very same record objects
and no ended one crossed the horizon (NaN times, a clock stepping back: the comparisons are the
filter's own, so they answer as it does). ``tests/sim/test_report_memo.py`` compares the two over random changes.
"""

from __future__ import annotations

import math
import operator

from epu.common.messages import TERMINAL_INSTANCE_STATES, InstanceEvent
from epu.services.provisioner.app import event_of
from epu.services.provisioner.records import InstanceRecord

#: The memo is pruned to the records of the current listing once it holds more than this many
#: entries, or twice as many as after the last pruning.
MIN_PRUNE = 1024

_Made = tuple[InstanceRecord, InstanceEvent | None, str, float | None]
"""A record, its event (``None``: none can be made of it, ``event_of``), its domain, and its
``updated_at`` if it is ended (else ``None``)."""


class ReportEvents:
    """``publish_reports``' ``events`` for the simulator: ``report_events(records, cutoff)``,
    with the event of each record taken again while the record is the very object it was made
    from. One per provisioner boot (a restart starts empty, as the service's would)."""

    def __init__(self) -> None:
        self._made: dict[int, _Made] = {}
        """By ``id(record)`` (the entry holds the record, so its id is not reused meanwhile)."""
        self._limit = MIN_PRUNE
        self._last: tuple[list[InstanceRecord], float, float, dict[str, list[InstanceEvent]]] | None = None
        """The last call's records, the earliest ``updated_at`` of the ended ones kept, the latest
        of those left out, and its answer: the same answer again while the store lists the very
        same records and no ended one crossed the horizon (two comparisons, not one per record)."""
        self.made = 0
        """Events made (a test checks that the memo is used)."""
        self.reused = 0
        """Answers handed out again whole (a test checks that it happens)."""

    def __call__(self, records: list[InstanceRecord], cutoff: float) -> dict[str, list[InstanceEvent]]:
        last = self._last
        if (last is not None and len(last[0]) == len(records) and all(map(operator.is_, last[0], records))
                and not last[1] < cutoff and last[2] < cutoff):
            # The very same records, and no ended one crossed the horizon: every kept one is
            # still at or after the cutoff (the earliest is) and every left-out one before it.
            self.reused += 1
            return {d: list(events) for d, events in last[3].items()}
        hits: list[_Made | None] = list(map(self._made.get, map(id, records)))
        if not all(hits):  # an entry (a tuple) is always true: only a miss (None) is false
            for k, r in enumerate(records):
                if hits[k] is None:
                    hits[k] = self._make(r)
        made: list[_Made] = hits  # type: ignore[assignment]
        if len(self._made) > self._limit:
            self._prune(made)
        # ``report_events``' filter: an ended record older than ``cutoff`` is left out.
        kept = [m for m in made if (m[3] is None or not m[3] < cutoff) and m[1] is not None]
        ended_kept = [t for m in kept if (t := m[3]) is not None and t == t]  # a NaN is kept at any cutoff
        ended_out = [m[3] for m in made if m[3] is not None and m[3] < cutoff]
        domains = {m[2] for m in kept}
        by_domain: dict[str, list[InstanceEvent]] = {}
        if len(domains) == 1:
            by_domain[domains.pop()] = [m[1] for m in kept]  # type: ignore[misc]
        else:
            for m in kept:
                by_domain.setdefault(m[2], []).append(m[1])  # type: ignore[arg-type]
        self._last = (list(records), min(ended_kept, default=math.inf), max(ended_out, default=-math.inf),
                      by_domain)
        return {d: list(events) for d, events in by_domain.items()}

    def _make(self, record: InstanceRecord) -> _Made:
        ended = record.updated_at if record.state in TERMINAL_INSTANCE_STATES else None
        entry = (record, event_of(record), record.domain, ended)
        self.made += 1
        self._made[id(record)] = entry
        return entry

    def _prune(self, listed: list[_Made]) -> None:
        """Keep only the entries of the records listed now. A record the store no longer lists
        never comes back as the same object: a changed record is a new object (each transition
        of an instance makes one), and one that is listed again later (a reopening) is a new
        object too. Pruning only the ended records, as before, kept every superseded record of a
        live instance and its event for the whole run: 127,522 events and their records at the
        end of the NASA month, ~0.25 GB of its peak RSS."""
        self._made = {id(m[0]): m for m in listed}
        self._limit = max(MIN_PRUNE, 2 * len(self._made))


__all__ = ["ReportEvents"]
