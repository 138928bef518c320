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
from epu.common.messages import InstanceEvent, InstanceReport, LaunchRequest, TerminateRequest
from epu.services.provisioner.app import publish_reports
from epu.services.provisioner.cloud import TAG_DEPLOYMENT, TAG_LAUNCH, TAG_STORE
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


# ---------------------------------------------------------------------- issue 33: the safety net never stops


class _Publisher:
    """What ``publish_reports`` needs of a service: a clock and ``publish``."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.sent: list[InstanceReport] = []

    def publish(self, message: InstanceReport) -> None:
        self.sent.append(message)


def test_a_terminate_of_an_unknown_instance_does_not_stop_the_reports(make_provisioner, cloud, clock) -> None:
    """Issue 33: a terminate of an instance id no store knows made a record with ``site=""``, and
    every report tick raised a ValidationError building its entry — no report at all, for any
    domain, for ``report_horizon_seconds``. Now the entry names the site ``unknown`` (as the
    record's events do) and the live instance beside it is reported."""
    prov, _ = make_provisioner({"sim": cloud})
    prov.handle_launch(LaunchRequest(launch_id="launch-1", domain="alpha", site="sim", node_name="w-1"))
    prov.handle_terminate(TerminateRequest(request_id="t-1", instance_id="ghost-1", domain="alpha",
                                           reason="bookkeeping"))
    assert prov.wait_idle()
    assert prov.store.get("ghost-1").site == ""
    out = _Publisher(clock)
    assert publish_reports(out, prov.store, 3600.0) == 1  # type: ignore[arg-type]
    entries = {e.instance_id: e for e in out.sent[0].instances}
    assert entries["launch-1"].state == "pending"
    assert (entries["ghost-1"].state, entries["ghost-1"].site) == ("terminated", "unknown")


def test_a_record_no_entry_can_be_made_of_is_left_out_and_the_rest_reported(clock) -> None:
    """Whatever a bad record holds, it costs its own entry only (logged), never the report."""
    store = Records()
    store.records = [InstanceRecord("good-1", "a", "s", "w1", 1, "started", 2, "c1", None, "", None, 1.0, 1.0),
                     InstanceRecord("bad id", "a", "s", "w2", 1, "started", 2, "c2", None, "", None, 1.0, 1.0),
                     InstanceRecord("good-2", "b", "s", "w3", 1, "pending", 2, "c3", None, "", None, 1.0, 1.0)]
    out = _Publisher(ManualClock(10.0))
    assert publish_reports(out, store, 300.0) == 2  # type: ignore[arg-type]
    assert {m.domain: [e.instance_id for e in m.instances] for m in out.sent} == {"a": ["good-1"], "b": ["good-2"]}


def test_a_reopened_record_is_reported_as_reopened(make_provisioner, cloud, clock) -> None:
    """Issue 33 (high): a report that overtook the reopen event made the engine raise its
    ``failed`` row's seq, drop the reopen as stale and terminate the live node on every report.
    A report entry now says what the event said: ``previous: failed`` while the reopen is the
    record's latest move, and ``reopened_seq`` — the seq of the reopening — on every entry and
    event after it, so the engine tells a reopened record from a stale one."""
    prov, events = make_provisioner({"sim": cloud})
    cloud.inject("transient", 10)  # refused, every attempt: closed failed
    prov.handle_launch(LaunchRequest(launch_id="x1", domain="alpha", site="sim", node_name="w-x1"))
    assert prov.wait_idle() and prov.store.get("x1").state == "failed"
    cloud._injected["create"].clear()
    tags = {TAG_DEPLOYMENT: prov.identity.deployment, TAG_STORE: prov.identity.store_id, TAG_LAUNCH: "x1",
            "epu-domain": "alpha"}
    cloud.create_node("w-x1", cloud.list_sizes()[0], cloud.list_images()[0], ex_metadata=tags)  # it took effect
    prov.reconcile("sim")  # listed pending: reopened
    rec = prov.store.get("x1")
    assert rec.state == "pending"
    out = _Publisher(clock)
    publish_reports(out, prov.store, 3600.0)  # type: ignore[arg-type]
    entry = out.sent[-1].instances[0]
    assert (entry.state, entry.previous, entry.seq, entry.reopened_seq) == ("pending", "failed", rec.seq, rec.seq)
    reopened_at = rec.seq
    clock.advance(60)
    prov.poll("sim")  # booted: pending -> started, after the reopening
    rec = prov.store.get("x1")
    assert rec.state == "started" and rec.seq == reopened_at + 1
    publish_reports(out, prov.store, 3600.0)  # type: ignore[arg-type]
    entry = out.sent[-1].instances[0]
    assert (entry.state, entry.previous, entry.reopened_seq) == ("started", None, reopened_at)
    assert events.for_("x1")[-1].reopened_seq == reopened_at  # the live event says it too
