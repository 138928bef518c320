"""The simulated provisioner's reports (``ReportEvents``: the event made from the very same record
object handed out again) equal the reports the service builds from nothing, over random launches,
state changes, endings, records forgotten, a clock stepping back across the horizon, and the memo
pruned on the way. A memoized report that missed a change would let the simulator judge a report
the service never sends."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from epu.common.clock import ManualClock
from epu.common.messages import InstanceReport
from epu.services.provisioner.app import publish_reports
from epu.services.provisioner.store import InstanceRecord

from epu.sim import report_memo
from epu.sim.report_memo import ReportEvents


class Records:
    """A store that hands out its record objects as they are (a change is a new object, as the
    simulator's in-memory store does) and leaves the odd old ended record for the horizon."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.records: list[InstanceRecord] = []

    def list(self, *, live_or_updated_since: float | None = None) -> list[InstanceRecord]:
        since = live_or_updated_since
        return [r for r in self.records if since is None or r.state not in ("terminated", "failed")
                or r.updated_at >= since or self.rng.random() < 0.05]


class Sender:
    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.sent: list[InstanceReport] = []

    def publish(self, message: InstanceReport) -> None:
        self.sent.append(message)


def _step(rng: random.Random, clock: ManualClock, records: list[InstanceRecord], i: int, domains: str) -> None:
    op, now = rng.random(), clock.now()
    if op < 0.2:
        records.append(InstanceRecord(f"i{i}", rng.choice(domains), "s", f"w{i}", 4, "requested", 1,
                                      None, None, "", None, now, now))
    elif op < 0.5 and records:
        k = rng.randrange(len(records))
        r = records[k]
        state = rng.choice(("pending", "started", "joined", "terminated", "failed"))
        records[k] = replace(r, state=state, seq=r.seq + 1, updated_at=now, ip=rng.choice((None, "10.0.0.1")))
    elif op < 0.55 and records:
        records.pop(rng.randrange(len(records)))
    elif op < 0.58:
        clock.advance(-rng.choice((30.0, 200.0)))
    else:
        clock.advance(rng.choice((0.0, 10.0, 60.0, 250.0)))


@pytest.mark.parametrize("domains", ["ab", "a"])  # several domains, and the one-domain shortcut
@pytest.mark.parametrize("seed", range(6))
def test_memoized_reports_are_the_reports_built_from_nothing(seed: int, domains: str, monkeypatch) -> None:
    monkeypatch.setattr(report_memo, "MIN_PRUNE", 8)  # prune often
    rng = random.Random(seed)
    clock = ManualClock(10_000.0)
    store, memo = Records(rng), ReportEvents()
    hits, reused, previous = 0, 0, []
    for i in range(400):
        _step(rng, clock, store.records, i, domains)
        state = rng.getstate()
        memoized, plain = Sender(clock), Sender(clock)
        publish_reports(memoized, store, 300.0, events=memo)  # type: ignore[arg-type]
        rng.setstate(state)  # the same listing for both
        publish_reports(plain, store, 300.0)  # type: ignore[arg-type]
        assert memoized.sent == plain.sent
        hits += sum(a is b for m, p in zip(memoized.sent, plain.sent, strict=True)
                    for a, b in zip(m.instances, p.instances, strict=True))
        kept = {id(e) for m in previous for e in m.instances}  # ``previous`` holds them: ids unique
        reused += sum(id(e) in kept for m in memoized.sent for e in m.instances)
        previous = memoized.sent
    assert hits == 0  # the plain path makes its own events: the comparison above is not of one object
    assert reused > 100  # ... and the memo did hand out kept events
    assert memo.reused > 10  # ... and whole answers again


def test_the_memo_hands_out_the_event_while_the_record_is_the_same_object() -> None:
    rec = InstanceRecord("i1", "a", "s", "w1", 4, "started", 3, "c1", "10.0.0.1", "", None, 1.0, 2.0)
    memo = ReportEvents()
    (first,) = memo([rec], 0.0)["a"]
    assert memo([rec], 0.0)["a"][0] is first and memo.made == 1
    changed = replace(rec, seq=4, state="joined")
    (again,) = memo([changed], 0.0)["a"]
    assert again is not first and again.state == "joined"
    assert memo([replace(changed)], 0.0) == memo([changed], 0.0)  # an equal new object: made again, equal
    assert memo.made == 3


def test_a_record_no_entry_can_be_made_of_is_left_out_by_the_memo_as_by_the_service() -> None:
    """Issue 33: the service leaves such a record out of its report (``event_of``); the memo too,
    made or handed out again."""
    from epu.services.provisioner.app import report_events

    records = [InstanceRecord("ok-1", "a", "s", "w1", 1, "started", 2, "c1", None, "", None, 5.0, 5.0),
               InstanceRecord("bad id", "a", "s", "w2", 1, "started", 2, "c2", None, "", None, 5.0, 5.0),
               InstanceRecord("bad-2", "a", "s", "w3", 1, "bogus", 2, "c3", None, "", None, 5.0, 5.0),
               InstanceRecord("ok-2", "a", "", "w4", 1, "terminated", 3, None, None, "", None, 5.0, 6.0)]
    memo = ReportEvents()
    expected = report_events(records, 0.0)
    assert {d: [e.instance_id for e in es] for d, es in expected.items()} == {"a": ["ok-1", "ok-2"]}
    assert memo(records, 0.0) == expected and memo(records, 0.0) == expected  # made, then handed out again
    assert memo(records, 5.5) == report_events(records, 5.5)


def test_the_memo_keeps_no_record_the_store_no_longer_lists(monkeypatch) -> None:
    """A live instance changing state makes a new record at every transition: the memo keeps
    about the records listed now, not every superseded one (the NASA month held 127,522)."""
    from epu.services.provisioner.app import report_events

    monkeypatch.setattr(report_memo, "MIN_PRUNE", 8)
    memo = ReportEvents()
    live = [InstanceRecord(f"i{k}", "a", "s", f"w{k}", 4, "started", 3, f"c{k}", None, "", None, 1.0, 2.0)
            for k in range(4)]
    for seq in range(4, 2000):
        live[seq % 4] = replace(live[seq % 4], seq=seq, updated_at=float(seq))
        assert memo(list(live), 0.0) == report_events(live, 0.0)
        assert len(memo._made) <= 2 * max(8, len(live)) + 1
    assert memo.made == 4 + 1995  # the first listing's four, then one per new record object: none made twice
