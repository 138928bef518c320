"""The anti-entropy report built from what ``publish_reports`` kept (``ReportCache``: the events
of unchanged records, the last listing's events while the store lists the very same records)
is the report built from nothing, over random launches, state changes, endings and time —
including a clock that steps back across the horizon. The engine repairs its instance table
from these reports: a kept one that missed a change would be a safety bug."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from epu.common.clock import ManualClock
from epu.common.messages import InstanceReport
from epu.services.provisioner.app import ReportCache, publish_reports
from epu.services.provisioner.store import InstanceRecord


class Records:
    """A store's ``list`` over records held as objects (a change is a new object, as in
    ``MemoryStore``); it lists every record and leaves the horizon to ``publish_reports``."""

    def __init__(self) -> None:
        self.records: list[InstanceRecord] = []

    def list(self, *, live_or_updated_since: float | None = None) -> list[InstanceRecord]:
        return list(self.records)


class Sender:
    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.sent: list[InstanceReport] = []

    def publish(self, message: InstanceReport) -> None:
        self.sent.append(message)


@pytest.mark.parametrize("seed", range(8))
def test_a_kept_report_is_the_report_built_from_nothing(seed: int) -> None:
    rng = random.Random(seed)
    clock = ManualClock(10_000.0)
    store, cache = Records(), ReportCache()
    horizon = 300.0
    for i in range(300):
        op = rng.random()
        now = clock.now()
        if op < 0.15:
            store.records.append(InstanceRecord(f"i{i}", rng.choice(("a", "b")), "s", f"w{i}", 4, "requested", 1,
                                                None, None, "", None, now, now))
        elif op < 0.4 and store.records:
            k = rng.randrange(len(store.records))
            r = store.records[k]
            state = rng.choice(("pending", "started", "joined", "terminated", "failed"))
            store.records[k] = replace(r, state=state, seq=r.seq + 1, updated_at=now)
        elif op < 0.45 and store.records:
            store.records.pop(rng.randrange(len(store.records)))
        elif op < 0.5:
            clock.advance(-rng.choice((30.0, 200.0)))  # a clock stepped back
        else:
            clock.advance(rng.choice((0.0, 10.0, 60.0, 60.0, 250.0)))
        kept, fresh = Sender(clock), Sender(clock)
        assert publish_reports(kept, store, horizon, cache=cache) == publish_reports(fresh, store, horizon)  # type: ignore[arg-type]
        assert kept.sent == fresh.sent
        if cache.listing is not None:
            assert cache.listing[0] == store.records
