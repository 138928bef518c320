"""The anti-entropy report is the events of the records the store lists, per domain in listing
order, less the ended ones older than the horizon — over random launches, state changes, endings
and time, including a clock that steps back across the horizon. The engine repairs its instance
table from these reports: one that missed a change or kept an old ended record would be a safety
bug."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from epu.common.clock import ManualClock
from epu.common.messages import InstanceEvent, InstanceReport
from epu.services.provisioner.app import publish_reports
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


def _random_step(rng: random.Random, clock: ManualClock, records: list[InstanceRecord], i: int, domain: str,
                 odds: tuple[float, float, float, float]) -> None:
    """One random change: below ``odds[0]`` a launch (in ``domain``), then a state change, a
    record forgotten, a clock stepped back across the horizon; else time moves on."""
    op = rng.random()
    now = clock.now()
    new, change, forget, back = odds
    if op < new:
        records.append(InstanceRecord(f"i{i}", domain, "s", f"w{i}", 4, "requested", 1,
                                      None, None, "", None, now, now))
    elif op < change and records:
        k = rng.randrange(len(records))
        r = records[k]
        state = rng.choice(("pending", "started", "joined", "terminated", "failed"))
        records[k] = replace(r, state=state, seq=r.seq + 1, updated_at=now)
    elif op < forget and records:
        records.pop(rng.randrange(len(records)))
    elif op < back:
        clock.advance(-rng.choice((30.0, 200.0)))
    else:
        clock.advance(rng.choice((0.0, 10.0, 60.0, 60.0, 250.0)))


class HorizonRecords(Records):
    """A store that leaves out ended records older than the horizon itself (as ``MemoryStore`` and
    ``Store`` do), in random order now and then."""

    def __init__(self, rng: random.Random) -> None:
        super().__init__()
        self.rng = rng
        self.last: list[InstanceRecord] = []
        """The last answer (what the report must be made of)."""

    def list(self, *, live_or_updated_since: float | None = None) -> list[InstanceRecord]:
        since = live_or_updated_since
        out = [r for r in self.records
               if since is None or r.state not in ("terminated", "failed") or r.updated_at >= since
               or self.rng.random() < 0.05]  # ... but for the odd one the report must leave out
        if self.rng.random() < 0.1:
            self.rng.shuffle(out)
        self.last = out
        return list(out)


def _expected(records: list[InstanceRecord], cutoff: float) -> dict[str, list[InstanceEvent]]:
    """The report's events, per domain in listing order, from nothing."""
    out: dict[str, list[InstanceEvent]] = {}
    for r in records:
        if r.state in ("terminated", "failed") and r.updated_at < cutoff:
            continue
        out.setdefault(r.domain, []).append(InstanceEvent(
            instance_id=r.instance_id, domain=r.domain, site=r.site, state=r.state, seq=r.seq,
            node_name=r.node_name, ip=r.ip, cloud_id=r.cloud_id, cores=r.cores, reason=r.reason,
            error_kind=r.error_kind, at=r.updated_at))
    return out


@pytest.mark.parametrize("seed", range(8))
def test_reports_from_a_filtering_store_are_the_events_of_its_records(seed: int) -> None:
    """For a store that filters by the horizon itself: mostly one domain, records changing, ending,
    leaving, listed in another order, and the odd old ended record the report must leave out."""
    rng = random.Random(100 + seed)
    clock = ManualClock(10_000.0)
    store = HorizonRecords(rng)
    horizon = 300.0
    for i in range(400):
        _random_step(rng, clock, store.records, i, "b" if rng.random() < 0.05 else "a", (0.2, 0.5, 0.55, 0.58))
        sender = Sender(clock)
        publish_reports(sender, store, horizon)  # type: ignore[arg-type]
        expected = _expected(store.last, clock.now() - horizon)
        assert {m.domain: m.instances for m in sender.sent} == expected
        assert [m.domain for m in sender.sent] == list(expected)
