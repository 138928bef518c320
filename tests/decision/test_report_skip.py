"""The engine's skip of a repeated quiet anti-entropy report is exact: over random instance
events, reports that repeat the last one (the very same frozen entries) or differ, and time, an
engine on a store that offers ``report_stamp`` answers every report, sends every message and ends
with every instance as an engine that handles every report in full.

A report is how the engine learns of events it lost and of instances a restored store still
holds: a skip that hid a news entry would leave an instance wrong in the table (and a node
billed, or a job's node torn down on a stale state)."""

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
    """The reference: no ``report_stamp``, so every report is handled in full."""

    report_stamp = None  # type: ignore[assignment]


def run(store_cls: type[MemoryStore], seed: int) -> tuple[list[int], list[str], list[str], int]:
    rng = random.Random(seed)
    clock = ManualClock(T0)
    bus = Bus()
    store = store_cls(MemoryDecisionDatabase())
    e = Engine(config(domains={"d": {"max_nodes": 8, "sites": ["s1"]}}, sites={"s1": {"driver": "epu-sim", "quota": 20}}),
               store, bus, clock)
    e.on_snapshot(snapshot(queued=jobs(6), at=clock.now()))
    e.iterate()
    launches = bus.of("instance.launch")
    assert launches
    # each launch's life as the provisioner records it: a walk along STATES, seq + 1 per step;
    # the engine hears of a step only sometimes (a lost event), reports show a point of it
    # (the current one, or an older one: a lagging or restored store)
    life = {la.launch_id: [("requested", 1)] for la in launches}
    answers: list[int] = []
    entries: list[InstanceEvent] = []
    skipped = 0

    def ev(la, point: tuple[str, int]) -> InstanceEvent:
        return InstanceEvent(instance_id=la.launch_id, domain=rng.choice(("d", "d", "d", "d", "other")),
                             site=la.site, state=point[0], seq=point[1], node_name=la.node_name, ip="10.0.0.1",
                             cores=la.cores, at=clock.now())

    for _ in range(1500):
        op = rng.random()
        la = rng.choice(launches)
        steps = life[la.launch_id]
        if op < 0.2:
            state, seq = steps[-1]
            if state not in ("terminated", "failed"):
                later = STATES[STATES.index(state) + 1:]
                steps.append((rng.choice(later[:2]), seq + 1))
                if rng.random() < 0.7:
                    e.on_instance_event(ev(la, steps[-1]))
        elif op < 0.85:
            if not entries or rng.random() < 0.25:
                entries = [ev(x, life[x.launch_id][-1] if rng.random() < 0.5 else rng.choice(life[x.launch_id]))
                           for x in rng.sample(launches, rng.randint(0, len(launches)))]
            quiet = e._quiet_reports.get("d")
            answers.append(e.on_instance_report(InstanceReport(domain="d", as_of=clock.now(), horizon_seconds=3600,
                                                               instances=list(entries))))
            skipped += quiet is not None and e._quiet_reports.get("d") is quiet
        else:
            clock.advance(rng.choice((1.0, 10.0, 60.0)))
    def named(text: str) -> str:  # launch ids are random: each named by its launch's place
        for i, la in enumerate(launches):
            text = text.replace(la.launch_id, f"<{i}>").replace(la.node_name, f"<node {i}>")
        return text

    sent = [named(repr((m.TYPE, getattr(m, "instance_id", None), getattr(m, "action", None), getattr(m, "reason", None))))
            for m in bus.sent]
    instances = sorted(named(repr(i)) for i in store.instances(None, live_only=False))
    return answers, sent, instances, skipped


@pytest.mark.parametrize("seed", range(12))
def test_a_skipped_report_is_answered_as_a_full_one(seed: int) -> None:
    a_answers, a_sent, a_instances, skipped = run(MemoryStore, seed)
    b_answers, b_sent, b_instances, none = run(Unstamped, seed)
    assert none == 0 and skipped > 5  # the skip was taken, and only where it may be
    assert a_answers == b_answers and sum(b_answers) > 0
    assert a_sent == b_sent
    assert a_instances == b_instances
