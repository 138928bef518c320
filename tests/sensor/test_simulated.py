"""The simulated batch cluster: jobs run for their duration on real placements, then finish."""

from __future__ import annotations

import pytest
from epu.common.clock import ManualClock
from epu.services.sensor.backend import BackendUnavailable, InvalidNodeName
from epu.services.sensor.simulated import SimulatedBatch


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1000.0)


def states(b: SimulatedBatch) -> dict[str, tuple[str, int]]:
    return {n.name: (n.state, n.cores_used) for n in b.snapshot().nodes}


def test_jobs_run_for_their_duration_and_finish(clock: ManualClock) -> None:
    b = SimulatedBatch(clock, nodes={"n1": 2})
    b.submit(cores=1, duration=10, count=3)
    assert (b.running, b.queued, b.submitted) == (2, 1, 3)
    snap = b.snapshot()
    assert snap.queued_jobs == 1 and snap.jobs[0].count == 1 and snap.jobs[0].job_id == "1[]"
    assert states(b) == {"n1": ("busy", 2)}
    clock.advance(9.9)
    assert b.completed == 0
    clock.advance(0.1)
    assert (b.completed, b.running, b.queued) == (2, 1, 0)  # the third started when the first two ended
    clock.advance(10)
    assert (b.completed, b.running) == (3, 0)
    assert states(b) == {"n1": ("free", 0)}


def test_completions_replayed_in_time_order_over_a_long_jump(clock: ManualClock) -> None:
    b = SimulatedBatch(clock, nodes={"n1": 1})
    b.submit(duration=5, count=10)
    clock.advance(1000)
    assert b.completed == 10 and b.running == 0


def test_multi_node_jobs_need_distinct_nodes(clock: ManualClock) -> None:
    b = SimulatedBatch(clock, nodes={"a": 4, "b": 4})
    (wide,) = b.submit(cores=4, nodes=2, duration=50)
    assert states(b) == {"a": ("busy", 4), "b": ("busy", 4)}
    assert all(n.jobs == [wide] for n in b.snapshot().nodes)
    (too_wide,) = b.submit(cores=1, nodes=3, duration=1)
    snap = b.snapshot()
    assert [(j.job_id, j.nodes) for j in snap.jobs] == [(too_wide, 3)]
    b.execute("add", "c", cores=1)
    clock.advance(50)
    assert b.running == 1  # the 3-node job now runs on a, b, c


def test_fifo_with_backfill_that_never_delays_the_head_job(clock: ManualClock) -> None:
    b = SimulatedBatch(clock, nodes={"a": 2, "b": 2})
    b.submit(cores=2, duration=100)          # runs on one node until t+100
    b.submit(cores=2, nodes=2, duration=10)  # head: needs both nodes, reserved for t+100
    (short,) = b.submit(cores=2, duration=50)   # fits now and ends before t+100: backfilled
    (long_,) = b.submit(cores=2, duration=500)  # would delay the head job: waits
    queued = {j.job_id for j in b.snapshot().jobs}
    assert short not in queued and long_ in queued
    clock.advance(100)
    running_ids = {j for n in b.snapshot().nodes for j in n.jobs}
    assert running_ids == {"2"}  # the head job got both nodes at t+100
    clock.advance(10)
    assert {j for n in b.snapshot().nodes for j in n.jobs} == {long_}


def test_node_commands_are_idempotent(clock: ManualClock) -> None:
    b = SimulatedBatch(clock)
    assert b.execute("add", "w1", cores=2).changed
    again = b.execute("add", "w1", cores=2)
    assert again.ok and not again.changed
    assert b.execute("offline", "w1").changed and not b.execute("offline", "w1").changed
    assert states(b) == {"w1": ("offline", 0)}
    b.submit(duration=5)
    assert b.running == 0  # offline nodes take no work
    assert b.execute("online", "w1").changed and not b.execute("online", "w1").changed
    assert b.running == 1
    clock.advance(5)
    assert b.execute("remove", "w1").changed
    gone = b.execute("remove", "w1")
    assert gone.ok and not gone.changed
    missing = b.execute("offline", "w1")
    assert not missing.ok and "unknown node" in (missing.error or "")


def test_offline_drains_and_remove_refuses_a_busy_node(clock: ManualClock) -> None:
    b = SimulatedBatch(clock, nodes={"w1": 1})
    (job,) = b.submit(duration=30)
    b.execute("offline", "w1")
    assert states(b) == {"w1": ("offline", 1)}  # draining: its job keeps running
    refused = b.execute("remove", "w1")
    assert not refused.ok and "runs 1 job" in (refused.error or "") and job in refused.output
    clock.advance(30)
    assert b.completed == 1 and b.execute("remove", "w1").ok


def test_forced_remove_requeues_the_jobs(clock: ManualClock) -> None:
    b = SimulatedBatch(clock, nodes={"w1": 1})
    (job,) = b.submit(duration=30)
    assert b.execute("remove", "w1", force=True).ok
    assert [j.job_id for j in b.snapshot().jobs] == [job]
    assert b.running == 0


def test_held_jobs_are_reported_not_run(clock: ManualClock) -> None:
    b = SimulatedBatch(clock, nodes={"w1": 4})
    (held,) = b.submit(hold=True)
    snap = b.snapshot()
    assert snap.held_jobs == 1 and snap.queued_jobs == 0 and b.running == 0
    b.release(held)
    assert b.running == 1


def test_failed_node_goes_down_and_requeues(clock: ManualClock) -> None:
    b = SimulatedBatch(clock, nodes={"w1": 1, "w2": 1})
    b.submit(duration=100, count=2)
    b.fail_node("w1")
    snap = b.snapshot()
    assert {n.name: n.state for n in snap.nodes} == {"w1": "down", "w2": "busy"}
    assert snap.queued_jobs == 1


def test_unavailable_raises_and_commands_are_transient(clock: ManualClock) -> None:
    b = SimulatedBatch(clock, nodes={"w1": 1})
    b.set_available(False, "pbs_server: connection refused")
    with pytest.raises(BackendUnavailable, match="connection refused"):
        b.snapshot()
    out = b.execute("offline", "w1")
    assert not out.ok and out.transient


@pytest.mark.parametrize("bad", ["-rf", "a;reboot", "a b", "$(id)", "x" * 64, "", "a/b", "node\n1", "-o"])
def test_hostile_names_refused(clock: ManualClock, bad: str) -> None:
    with pytest.raises(InvalidNodeName, match="not a valid RFC 1123 host name"):
        SimulatedBatch(clock).execute("add", bad, cores=1)


def test_state_since_moves_only_on_change(clock: ManualClock) -> None:
    b = SimulatedBatch(clock, nodes={"w1": 1})
    t0 = b.snapshot().nodes[0].state_since
    clock.advance(5)
    b.submit(duration=10)
    assert b.snapshot().nodes[0].state_since == t0 + 5
    clock.advance(10)
    assert b.snapshot().nodes[0].state_since == t0 + 15


def test_a_node_removed_and_added_again_is_the_new_one_in_the_snapshot(clock: ManualClock) -> None:
    """The sorted node order is reused only while the very same nodes are there: a node removed
    and added again under its name (the same names, in the same order) is reported anew."""
    b = SimulatedBatch(clock, nodes={"a": 1, "b": 1})
    assert states(b) == {"a": ("free", 0), "b": ("free", 0)}
    assert b.execute("remove", "b").ok and b.add_node("b", 4)
    assert [(n.name, n.cores) for n in b.snapshot().nodes] == [("a", 1), ("b", 4)]
    b.add_node("0", 2)
    assert [n.name for n in b.snapshot().nodes] == ["0", "a", "b"]


def test_add_of_an_existing_node_with_another_core_count_is_an_error_naming_both(clock: ManualClock) -> None:
    """Issue 26, defect 10, in the simulated batch system: answered as the real backends answer."""
    b = SimulatedBatch(clock)
    assert b.execute("add", "w1", cores=2).changed
    out = b.execute("add", "w1", cores=4)
    assert not out.ok and "2 core(s)" in (out.error or "") and "4 asked" in (out.error or "")
    assert states(b) == {"w1": ("free", 0)} and b.node("w1").cores == 2
