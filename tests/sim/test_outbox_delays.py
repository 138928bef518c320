"""The outbox-delay fault does what it says (issue 33): while it lasts, provisioners' instance
events wait in the store's outbox while the periodic reports go out on time — so a report tells
the engine of a reopened launch before the reopen event does. Seen on the bus, by publication."""

from __future__ import annotations

from typing import Any

from epu.common.messages import InstanceEvent, InstanceReport

from epu.sim.scenarios import get_scenario
from epu.sim.simulation import Simulation


def test_a_report_overtakes_the_reopen_event() -> None:
    sim = Simulation(get_scenario("report-overtakes-event"), 1)
    first_report: dict[tuple[str, int], float] = {}
    """(instance, seq) → when a report first carried it."""
    reopen_events: list[tuple[str, int, float]] = []
    """(instance, seq, when published) of every reopen event (``previous: failed``)."""

    def tap(msg: Any, _sender: Any) -> None:
        t = sim.world.t
        if isinstance(msg, InstanceReport):
            for e in msg.instances:
                first_report.setdefault((e.instance_id, e.seq), t)
        elif isinstance(msg, InstanceEvent) and msg.previous == "failed" and msg.state != "failed":
            reopen_events.append((msg.instance_id, msg.seq, t))

    sim.bus.taps.append(tap)
    result = sim.run()
    assert reopen_events, "no launch was reopened"
    overtaken = [(iid, seq) for iid, seq, t in reopen_events
                 if (iid, seq) in first_report and first_report[(iid, seq)] < t]
    assert overtaken, "no report carried a reopening before its event"
    assert result.stats["crashes"] == 0  # the events were late, not lost with a process
