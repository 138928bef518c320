"""Each snapshot carries its sensor's incarnation and sequence, so the engine orders them without
any clock (issue 26, defect 5): the sequence rises within a run, and a restarted sensor is a new
incarnation — whatever the head node's clock does meanwhile."""

from __future__ import annotations

from epu.common.clock import ManualClock
from epu.services.sensor.core import PollSchedule, SensorCore
from epu.services.sensor.dedupe import MemoryCommandLog
from epu.services.sensor.simulated import SimulatedBatch


def core(clock: ManualClock) -> tuple[SensorCore, list]:
    sent: list = []
    c = SensorCore("alpha", SimulatedBatch(clock, nodes={"w1": 2}), clock, MemoryCommandLog(),
                   lambda msg, _corr: sent.append(msg), PollSchedule(poll_seconds=60))
    return c, sent


def test_sequence_rises_within_an_incarnation_whatever_the_clock() -> None:
    clock = ManualClock(1_700_000_000.0)
    c, sent = core(clock)
    c.poll()
    clock.advance(3600)  # the head node's clock jumps an hour ahead...
    c.poll()
    clock.advance(-3600 + 60)  # ...and NTP steps it back
    c.poll()
    assert [s.sequence for s in sent] == [1, 2, 3]
    assert len({s.incarnation for s in sent}) == 1 and sent[0].incarnation
    assert sent[2].taken_at < sent[1].taken_at, "the clock went back; the count did not"


def test_a_restarted_sensor_is_a_new_incarnation() -> None:
    clock = ManualClock(1_700_000_000.0)
    first, a = core(clock)
    second, b = core(clock)
    first.poll()
    second.poll()
    assert a[0].incarnation != b[0].incarnation and b[0].sequence == 1
