"""The simulated batch backend of ``epu run sensor`` fed by a workload."""

from __future__ import annotations

from pathlib import Path

import pytest
from epu.common.config import parse_config
from epu.services.sensor.simulated import SimulatedBatch

from epu.simulate.static import ManualClock
from epu.workloads.feed import FedBatch, PinnableClock, WorkloadFeed, build_sensor
from epu.workloads.model import TraceJob, Workload


def _feed(speed: float) -> tuple[ManualClock, SimulatedBatch, WorkloadFeed]:
    clock = ManualClock(1000.0)
    pin = PinnableClock(clock)
    batch = SimulatedBatch(pin, nodes={"n1": 4})
    w = Workload("w", [TraceJob("a", 50, 600, 2, time_limit=900), TraceJob("b", 170, 60, 4),
                       TraceJob("c", 650, 60, 1)])
    return clock, batch, WorkloadFeed(batch, pin, w, speed=speed, cores_per_node=4)


def test_jobs_enter_at_their_own_time_not_at_the_poll() -> None:
    clock, batch, feed = _feed(1.0)
    clock.t = 1100.0  # a poll 100 s in: "a" (t=0) and "b" (t=120) were due... only "a"
    assert feed.tick() == 1
    clock.t = 1400.0
    assert feed.tick() == 1
    obs = FedBatch(batch, feed).snapshot()
    (queued,) = obs.jobs
    assert queued.job_id == "wb" and queued.submit_time == 1120.0 and queued.wait_seconds == 280.0
    assert batch.node("n1").jobs == {"wa": 2}  # started at once at t=1000, runs until 1600


def test_sped_up() -> None:
    clock, batch, feed = _feed(10.0)
    clock.t = 1061.0  # 600 s of the trace in 60 s
    assert feed.tick() == 3 and feed.done
    # "a" ran 600/10 = 60 s (1000-1060); "b" (4 cores, due at 1012) waited for it and runs 6 s
    assert batch.completed == 1 and batch.node("n1").jobs == {"wb": 4}
    clock.t = 1073.0
    FedBatch(batch, feed).snapshot()
    assert batch.completed == 3  # then "c" (due at 1060) from 1066 to 1072


def test_epu_run_sensor_builds_a_fed_backend(tmp_path: Path) -> None:
    config = parse_config({"broker": {"url": "memory://"},
                           "sensor": {"domain": "d", "backend": "simulated", "poll_seconds": 1.0,
                                      "options": {"node_count": 2, "node_cores": 2,
                                                  "workload": "burst:jobs=5,duration=60", "workload_speed": 2}}},
                          environ={})
    service = build_sensor(config, clock=ManualClock(0.0))
    backend = service.sensor_core.backend  # type: ignore[attr-defined]
    assert isinstance(backend, FedBatch)
    obs = backend.snapshot()
    assert obs.running_jobs == 4 and sum(j.count for j in obs.jobs) == 1
    bad = parse_config({"broker": {"url": "memory://"}, "sensor": {
        "backend": "simulated", "options": {"workload": str(tmp_path / "missing.swf")}}}, environ={})
    with pytest.raises(SystemExit, match="workload: .*missing.swf: no such file"):
        build_sensor(bad, clock=ManualClock(0.0))
