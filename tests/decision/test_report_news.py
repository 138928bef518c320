"""The engine's partial reading of an anti-entropy report is exact: after a report that changed
nothing, the next one is read only at the entries that are new objects and at those whose
instance was stored since (``Engine._report_news``). Over random instance events (heard or
lost), reports that replace a few entries, reorder, grow or shrink the last one, and time, an
engine doing so answers every report, sends every message and ends with every instance as an
engine that reads every report in full.

A partial reading that missed a news entry would leave an instance wrong in the table."""

from __future__ import annotations

import random

import pytest
from epu.common.clock import ManualClock
from epu.common.messages import InstanceEvent, InstanceReport
from epu.services.decision.engine import Engine
from epu.services.decision.memstore import MemoryDecisionDatabase, MemoryStore

from tests.decision.helpers import Bus, config, jobs, snapshot

T0 = 1_700_000_000.0
STATES = ("requested", "pending", "started", "terminating", "terminated", "failed")


class Unstamped(MemoryStore):
    """The reference: no ``report_stamp``, so every report is read in full."""

    report_stamp = None  # type: ignore[assignment]


def run(store_cls: type[MemoryStore], seed: int, moving: bool = False) -> tuple[list[int], list[str], list[str], int]:
    """``moving``: reports mostly grow, shrink or move their entries (found by instance then)."""
    rng = random.Random(seed)
    clock = ManualClock(T0)
    bus = Bus()
    store = store_cls(MemoryDecisionDatabase())
    e = Engine(config(domains={"d": {"max_nodes": 12, "sites": ["s1"]}},
                      sites={"s1": {"driver": "epu-sim", "quota": 20}}), store, bus, clock)
    e.on_snapshot(snapshot(queued=jobs(10), at=clock.now()))
    e.iterate()
    launches = bus.of("instance.launch")
    assert len(launches) > 4
    life = {la.launch_id: [("requested", 1)] for la in launches}
    answers: list[int] = []
    entries: list[InstanceEvent] = []
    partial = 0
    news = e._report_news

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal partial
        got = news(*args, **kwargs)
        partial += got is not None
        return got

    e._report_news = counted  # type: ignore[method-assign]

    def ev(la, point: tuple[str, int]) -> InstanceEvent:  # type: ignore[no-untyped-def]
        return InstanceEvent(instance_id=la.launch_id, domain=rng.choice(("d", "d", "d", "d", "d", "other")),
                             site=la.site, state=point[0], seq=point[1], node_name=la.node_name, ip="10.0.0.1",
                             cores=la.cores, at=clock.now())

    def point(la) -> tuple[str, int]:  # type: ignore[no-untyped-def]
        steps = life[la.launch_id]
        return steps[-1] if rng.random() < 0.6 else rng.choice(steps)

    for _ in range(3000):
        op = rng.random()
        la = rng.choice(launches)
        steps = life[la.launch_id]
        if op < 0.3:
            state, seq = steps[-1]
            if state not in ("terminated", "failed"):
                steps.append((rng.choice(STATES[STATES.index(state) + 1:][:2]), seq + 1))
                if rng.random() < 0.8:
                    e.on_instance_event(ev(la, steps[-1]))
        elif op < 0.85:
            r = rng.random()
            if moving and r >= 0.05:  # fewer replacements, more reports that grew, shrank or moved
                r = rng.choice((0.1, 0.42, 0.47, 0.52, 0.52, 0.6, 0.9))
            if not entries or r < 0.05:
                entries = [ev(x, point(x)) for x in rng.sample(launches, rng.randint(0, len(launches)))]
            elif r < 0.4:  # a few entries replaced by new objects of the same instance
                for k in rng.sample(range(len(entries)), rng.randint(1, min(3, len(entries)))):
                    x = next(la for la in launches if la.launch_id == entries[k].instance_id)
                    entries[k] = ev(x, point(x))
            elif r < 0.45:
                rng.shuffle(entries)
            elif r < 0.5 and len(entries) > 1:
                entries.pop(rng.randrange(len(entries)))
            elif r < 0.55:
                entries.append(ev(la, point(la)))  # may list an instance twice
            elif r < 0.65 and len(entries) > 1:  # two entries trade places (the same objects)
                i, j = rng.sample(range(len(entries)), 2)
                entries[i], entries[j] = entries[j], entries[i]
            answers.append(e.on_instance_report(InstanceReport(domain="d", as_of=clock.now(), horizon_seconds=3600,
                                                               instances=list(entries))))
        else:
            clock.advance(rng.choice((1.0, 10.0, 60.0)))

    def named(text: str) -> str:  # launch ids are random: each named by its launch's place
        for i, la in enumerate(launches):
            text = text.replace(la.launch_id, f"<{i}>").replace(la.node_name, f"<node {i}>")
        return text

    sent = [named(repr((m.TYPE, getattr(m, "instance_id", None), getattr(m, "action", None),
                        getattr(m, "reason", None)))) for m in bus.sent]
    instances = sorted(named(repr(i)) for i in store.instances(None, live_only=False))
    return answers, sent, instances, partial


@pytest.mark.parametrize("seed", range(16))
def test_a_partly_read_report_is_answered_as_a_full_one(seed: int) -> None:
    a_answers, a_sent, a_instances, partial = run(MemoryStore, seed)
    b_answers, b_sent, b_instances, none = run(Unstamped, seed)
    assert none == 0 and partial > 20  # the partial reading was taken, and only where it may be
    assert a_answers == b_answers and sum(b_answers) > 0
    assert a_sent == b_sent
    assert a_instances == b_instances


@pytest.mark.parametrize("seed", range(16))
def test_a_report_that_grew_shrank_or_moved_is_answered_as_a_full_one(seed: int) -> None:
    """Reports that mostly change length or order: each entry is found by its instance in the last
    quiet report (``_report_news``'s second way), and the answers are still the full reading's."""
    a_answers, a_sent, a_instances, partial = run(MemoryStore, seed, moving=True)
    b_answers, b_sent, b_instances, none = run(Unstamped, seed, moving=True)
    assert none == 0 and partial > 20
    assert a_answers == b_answers and sum(b_answers) > 0
    assert a_sent == b_sent
    assert a_instances == b_instances


@pytest.mark.parametrize("store_cls", [MemoryStore, Unstamped])
def test_entries_that_trade_places_are_found_at_their_new_places(store_cls: type[MemoryStore]) -> None:
    """A quiet report whose entries traded places, then an instance ended here: the next report,
    the very same entries, tells the provisioner its record is stale (found at its new place)."""
    clock = ManualClock(T0)
    bus = Bus()
    e = Engine(config(domains={"d": {"max_nodes": 4, "sites": ["s1"]}},
                      sites={"s1": {"driver": "epu-sim", "quota": 20}}), store_cls(MemoryDecisionDatabase()), bus, clock)
    e.on_snapshot(snapshot(queued=jobs(2), at=clock.now()))
    e.iterate()
    a, b = bus.of("instance.launch")[:2]

    def ev(la, state: str, seq: int) -> InstanceEvent:  # type: ignore[no-untyped-def]
        return InstanceEvent(instance_id=la.launch_id, domain="d", site=la.site, state=state, seq=seq,
                             node_name=la.node_name, cores=la.cores, at=clock.now())

    ea, eb = ev(a, "started", 2), ev(b, "started", 2)
    for x in (ea, eb):
        e.on_instance_event(x)
    assert e.on_instance_report(InstanceReport(domain="d", as_of=clock.now(), instances=[ea, eb])) == 0
    assert e.on_instance_report(InstanceReport(domain="d", as_of=clock.now(), instances=[eb, ea])) == 0
    e.on_instance_event(ev(a, "terminated", 3))
    before = len(bus.of("instance.terminate"))
    assert e.on_instance_report(InstanceReport(domain="d", as_of=clock.now(), instances=[eb, ea])) == 0
    again = bus.of("instance.terminate")[before:]
    assert [m.instance_id for m in again] == [a.launch_id]
