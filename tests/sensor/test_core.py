"""The sensor core without a broker: polling schedule, backoff, unavailable snapshots, dedupe."""

from __future__ import annotations

import pytest
from epu.common.clock import ManualClock
from epu.common.messages import Message, NodeCommand, NodeCommandResult, SensorSnapshot, new_id
from epu.services.sensor.core import PollSchedule, SensorCore
from epu.services.sensor.dedupe import MemoryCommandLog, SqliteCommandLog
from epu.services.sensor.simulated import SimulatedBatch
from pydantic import ValidationError


class Bus(list):
    def __call__(self, message: Message, correlation_id: str | None) -> None:
        self.append(message)

    def snapshots(self) -> list[SensorSnapshot]:
        return [m for m in self if isinstance(m, SensorSnapshot)]

    def results(self) -> list[NodeCommandResult]:
        return [m for m in self if isinstance(m, NodeCommandResult)]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(5000.0)


def make(clock: ManualClock, backend: SimulatedBatch | None = None, log=None) -> tuple[SensorCore, Bus, SimulatedBatch]:
    bus = Bus()
    b = backend or SimulatedBatch(clock, nodes={"w1": 2})
    core = SensorCore("alpha", b, clock, log or MemoryCommandLog(), bus,
                      PollSchedule(poll_seconds=60, retry_initial_seconds=2))
    return core, bus, b


def cmd(action: str, node: str = "w2", **kw) -> NodeCommand:
    return NodeCommand(command_id=kw.pop("command_id", new_id()), domain="alpha", action=action, node=node, **kw)


def test_polls_every_period(clock: ManualClock) -> None:
    core, bus, b = make(clock)
    b.submit(cores=2, count=2, duration=600)
    core.tick()
    assert len(bus.snapshots()) == 1
    core.tick()
    clock.advance(59)
    core.tick()
    assert len(bus.snapshots()) == 1
    clock.advance(1)
    core.tick()
    snap = bus.snapshots()[-1]
    assert len(bus.snapshots()) == 2 and snap.available and snap.domain == "alpha" and snap.backend == "simulated"
    assert snap.running_jobs == 1 and snap.queued_count() == 1
    assert snap.jobs == []  # the wire carries shapes, never one record per job
    assert snap.taken_at == clock.now()


def test_unreadable_batch_system_is_never_an_empty_queue(clock: ManualClock) -> None:
    core, bus, b = make(clock)
    b.submit(count=5, duration=600)
    b.set_available(False, "qstat: cannot connect to server")
    core.tick()
    snap = bus.snapshots()[-1]
    assert not snap.available and "cannot connect" in (snap.error or "")
    # retries with backoff: 2, 4, 8, ... capped at the poll period
    delays = []
    for _ in range(7):
        before = len(bus.snapshots())
        waited = 0
        while len(bus.snapshots()) == before:
            clock.advance(1)
            waited += 1
            core.tick()
        delays.append(waited)
    assert delays == [2, 4, 8, 16, 32, 60, 60]
    assert all(not s.available for s in bus.snapshots())
    b.set_available(True)
    clock.advance(60)
    core.tick()
    assert bus.snapshots()[-1].available and core.failures == 0
    assert core.next_poll_at == clock.monotonic() + 60


def test_a_crashing_parser_is_reported_unavailable(clock: ManualClock) -> None:
    class Broken(SimulatedBatch):
        def snapshot(self):
            raise KeyError("job_state")

    core, bus, _ = make(clock, Broken(clock))
    core.tick()
    assert not bus.snapshots()[0].available and "KeyError" in (bus.snapshots()[0].error or "")


def test_command_runs_once_and_its_result_is_resent(clock: ManualClock) -> None:
    core, bus, b = make(clock)
    c = cmd("add", cores=4)
    first = core.handle(c)
    assert first.ok and not first.duplicate
    assert bus.snapshots() == []  # the re-read is coalesced: due refresh_seconds after the change
    clock.advance(core.schedule.refresh_seconds)
    core.tick()
    assert len(bus.snapshots()) == 1
    assert {n.name for n in bus.snapshots()[0].nodes} == {"w1", "w2"}
    b.execute("remove", "w2")  # someone removed it meanwhile: a re-run would add it back
    again = core.handle(c)
    assert again.duplicate and again.ok and again.command_id == c.command_id
    assert "w2" not in b.node_names()
    assert len(bus.results()) == 2 and len(bus.snapshots()) == 1  # nothing changed the second time


def test_failed_command_carries_native_error_and_no_snapshot(clock: ManualClock) -> None:
    core, bus, _ = make(clock)
    res = core.handle(cmd("offline", "ghost"))
    assert not res.ok and "unknown node ghost" in (res.error or "") and "Unknown node" in res.output
    assert bus.snapshots() == []


def test_transient_failures_are_not_remembered(clock: ManualClock) -> None:
    core, bus, b = make(clock)
    c = cmd("offline", "w1")
    b.set_available(False)
    assert not core.handle(c).ok
    b.set_available(True)
    res = core.handle(c)
    assert res.ok and not res.duplicate  # re-sent after the outage: it runs now


def test_command_for_another_domain_is_refused(clock: ManualClock) -> None:
    core, bus, b = make(clock)
    c = NodeCommand(command_id=new_id(), domain="beta", action="add", node="w9")
    assert not core.handle(c).ok and "w9" not in b.node_names()


@pytest.mark.parametrize("bad", ["-rf", "a;reboot", "a b", "$(id)", "", "node\n1", "a" * 300])
def test_hostile_node_names_never_become_commands(bad: str) -> None:
    with pytest.raises(ValidationError):
        NodeCommand(command_id="c1", domain="alpha", action="remove", node=bad)


def test_backend_check_refuses_even_a_constructed_command(clock: ManualClock) -> None:
    core, bus, b = make(clock)
    c = NodeCommand.model_construct(command_id="c1", domain="alpha", action="add", node="x;reboot",
                                    cores=1, address=None, reason="", force=False, instance_id=None)
    res = core.handle(c)
    assert not res.ok and "refusing node name" in (res.error or "")


def test_sqlite_dedupe_survives_a_restart(clock: ManualClock, tmp_path) -> None:
    path = tmp_path / "sensor.sqlite3"
    core, bus, b = make(clock, log=SqliteCommandLog(path))
    c = cmd("add", cores=2)
    core.handle(c)
    core.command_log.close()
    b.execute("remove", "w2")
    core2, bus2, _ = make(clock, backend=b, log=SqliteCommandLog(path))
    res = core2.handle(c)
    assert res.duplicate and res.ok and "w2" not in b.node_names()


def test_state_since_is_tracked_for_backends_that_do_not_say(clock: ManualClock) -> None:
    from epu.common.messages import NodeInfo
    from epu.services.sensor.core import StateSince

    s = StateSince()
    first = s.fill([NodeInfo(name="a", state="free")], 10.0)
    assert first[0].state_since == 10.0
    assert s.fill([NodeInfo(name="a", state="free")], 20.0)[0].state_since == 10.0
    assert s.fill([NodeInfo(name="a", state="busy")], 30.0)[0].state_since == 30.0


# ------------------------------------------------------------------ polling storm (issue 12)
def test_a_burst_of_commands_triggers_one_read_not_one_per_command(clock: ManualClock) -> None:
    core, bus, b = make(clock)
    core.tick()
    reads_before = core.reads
    for i in range(200):
        assert core.handle(cmd("add", f"n{i:03d}", cores=2)).ok
        clock.advance(0.001)
        core.tick()
    assert core.reads == reads_before  # nothing read during the burst
    clock.advance(core.schedule.refresh_seconds)
    core.tick()
    core.tick()
    assert core.reads == reads_before + 1
    assert len({n.name for n in bus.snapshots()[-1].nodes}) == 201
    clock.advance(core.schedule.refresh_seconds * 5)
    core.tick()
    assert core.reads == reads_before + 1  # no further read until the poll period


def test_a_command_that_changes_nothing_triggers_no_read(clock: ManualClock) -> None:
    core, bus, b = make(clock)
    core.tick()
    reads = core.reads
    core.handle(cmd("online", "w1"))  # already online: changed=False
    clock.advance(5)
    core.tick()
    assert core.reads == reads


# ------------------------------------------------------------------ identity
def test_the_instance_id_reaches_the_backend_and_comes_back_on_the_node(clock: ManualClock) -> None:
    core, bus, b = make(clock)
    core.handle(cmd("add", "w2", cores=2, instance_id="launch-7f3e"))
    snap = core.poll()
    assert {n.name: n.instance_id for n in snap.nodes} == {"w1": None, "w2": "launch-7f3e"}


# ------------------------------------------------------------------ bounded snapshots
def test_oversize_snapshot_drops_node_job_ids_first_then_says_unavailable(clock: ManualClock) -> None:
    b = SimulatedBatch(clock, nodes={f"w{i:03d}": 4 for i in range(50)})
    b.submit(cores=1, count=200, duration=600)
    core, bus, _ = make(clock, b)
    full = core.read()
    from epu.services.sensor.core import snapshot_bytes

    size = snapshot_bytes(full)
    core.schedule.max_snapshot_bytes = size - 1
    trimmed = core.poll()
    assert trimmed.available and all(n.jobs == [] for n in trimmed.nodes)
    assert sum(n.cores_used for n in trimmed.nodes) == sum(n.cores_used for n in full.nodes)  # busy still shows
    core.schedule.max_snapshot_bytes = 100
    refused = core.poll()
    assert not refused.available and "exceeds max_snapshot_bytes=100" in (refused.error or "")
    assert core.oversize_snapshots == 2


# ------------------------------------------------------------------ invalid commands get an answer (issue 14)
def test_invalid_command_with_a_readable_id_gets_a_failed_result(clock: ManualClock) -> None:
    import msgpack

    core, bus, b = make(clock)
    env = {"schema_version": "1.0", "type": "node.command", "id": "env-1", "timestamp": 0.0, "source": "x",
           "correlation_id": None, "body": {"command_id": "c-evil", "domain": "alpha", "action": "add",
                                            "node": "x;reboot\n$(id)", "cores": 1}}
    result = core.handle_invalid(msgpack.packb(env), "invalid node.command: node: String should match pattern")
    assert result is not None and not result.ok and result.command_id == "c-evil"
    assert "not executed" in (result.error or "") and "\n" not in result.node
    assert bus.results() == [result] and "x;reboot" not in " ".join(b.node_names())
    for bad in (b"\xc1garbage", msgpack.packb({**env, "body": {**env["body"], "command_id": "a b"}}),
                msgpack.packb({**env, "body": {**env["body"], "domain": "beta"}}),
                msgpack.packb({**env, "body": {**env["body"], "action": "reboot"}}),
                msgpack.packb({**env, "type": "instance.launch"})):
        assert core.handle_invalid(bad, "invalid") is None
    assert len(bus.results()) == 1


def test_remove_with_requeue_puts_a_preempted_nodes_jobs_back_and_removes_it(clock: ManualClock) -> None:
    core, bus, b = make(clock)
    kills: list[tuple[str, str, str]] = []
    b.on_kill.append(lambda job, node, why: kills.append((job, node, why)))
    b.submit(cores=1, count=2, duration=600)
    core.tick()
    assert bus.snapshots()[-1].running_jobs == 2
    plain = core.handle(cmd("remove", "w1"))
    assert not plain.ok and "runs 2 job(s)" in (plain.error or "")  # without the intent: refused

    res = core.handle(cmd("remove", "w1", requeue=True, reason="preempted by the cloud"))
    assert res.ok and "requeued" in res.output and "removed" in res.output
    assert [why for *_, why in kills] == ["requeued: preempted by the cloud"] * 2  # never "by force"
    assert b.node("w1") is None
    b.add_node("w2", 2)
    clock.advance(60)
    core.tick()
    assert bus.snapshots()[-1].running_jobs == 2  # the requeued jobs run again elsewhere


def test_the_size_estimate_with_its_memo_is_the_one_without(clock: ManualClock) -> None:
    """The memo of each node's share (by the very NodeInfo object) changes no estimate, as
    nodes fill, empty, come and go from one snapshot to the next."""
    from epu.services.sensor.core import estimated_bytes

    b = SimulatedBatch(clock, nodes={f"w{i}": 2 for i in range(5)})
    core, _, _ = make(clock, b)
    memo: dict = {}
    for step in range(8):
        if step == 2:
            b.submit(cores=1, count=6, duration=30)
        if step == 4:
            b.add_node("w9", 4)
        if step == 5:
            b.execute("remove", "w9")
        snap = core.read()
        assert estimated_bytes(snap, memo) == estimated_bytes(snap)
        clock.advance(20)


def test_state_since_over_backends_that_say_for_some_reads_only(clock: ManualClock) -> None:
    """A read whose every node says its ``state_since`` is taken as it is (what was seen is
    kept for later only if needed); a later read that does not say still counts from what the
    last read showed — as the tracker that records every read does."""
    import random

    from epu.common.messages import NodeInfo
    from epu.services.sensor.core import StateSince

    class EveryRead:
        def __init__(self) -> None:
            self.seen: dict[str, tuple[str, float]] = {}

        def fill(self, nodes: list[NodeInfo], now: float) -> list[NodeInfo]:
            out, seen = [], {}
            for node in nodes:
                prev = self.seen.get(node.name)
                since = node.state_since if node.state_since is not None else (
                    prev[1] if prev is not None and prev[0] == node.state else now)
                seen[node.name] = (node.state, since)
                out.append(node.model_copy(update={"state_since": float(since)}))
            self.seen = seen
            return out

    rng = random.Random(7)
    lazy, every = StateSince(), EveryRead()
    saying = 0
    for t in range(300):
        says = rng.random() < 0.6
        saying += says
        nodes = [NodeInfo(name=n, state=rng.choice(("free", "busy")),
                          state_since=float(t - rng.randint(0, 9)) if says or rng.random() < 0.3 else None)
                 for n in rng.sample("abcdef", rng.randint(0, 6))]
        assert lazy.fill(nodes, float(t)) == every.fill(nodes, float(t))
    assert 100 < saying < 250
