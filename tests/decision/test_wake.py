"""New demand is answered at once, not at the next tick: a snapshot whose queued demand changed
wakes the iteration (rate-limited by ``wake_min_seconds``). The tick here is a minute long, so
any launch within seconds is the wake-up's doing. On the real broker."""

from __future__ import annotations

import time

import pytest
from epu.common.broker import Broker, Publisher
from epu.common.config import parse_config
from epu.common.runtime import Service, run_in_thread
from epu.common.testing import wait_for
from epu.common.topology import PROVISIONER_QUEUE, Topology
from epu.services.decision.app import build_service

from tests.decision.busutil import read_queue
from tests.decision.helpers import jobs, snapshot


@pytest.mark.rabbitmq
def test_a_snapshot_with_new_demand_is_answered_without_waiting_for_the_tick(broker, tmp_path) -> None:
    cfg = parse_config({
        "broker": {"url": broker.url, "prefix": broker.topology.prefix},
        "decision": {"store_url": f"sqlite:///{tmp_path / 'decision.db'}", "iteration_seconds": 60.0,
                     "active_window_seconds": 30.0, "wake_min_seconds": 0.2},
        "domains": {"d": {"max_nodes": 20, "sites": ["s1"]}},
        "sites": {"s1": {"driver": "epu-sim", "quota": 50}},
    }, environ={})
    service = build_service(cfg)
    thread = run_in_thread(service)
    pub = Publisher(broker, source="sensor-test")
    launched: list = []

    def launches() -> int:
        launched.extend(read_queue(broker, PROVISIONER_QUEUE))
        return len({m.launch_id for m in launched})

    try:
        assert service.wait_ready(15)
        started = time.monotonic()
        pub.publish(snapshot(queued=jobs(2), at=time.time()))
        wait_for(lambda: launches() == 2, 20, interval=0.05, message="2 launches for 2 jobs")
        pub.publish(snapshot(queued=jobs(5), at=time.time()))
        wait_for(lambda: launches() == 5, 20, interval=0.05, message="3 more for 3 more jobs")
        assert time.monotonic() - started < 50, "answered before the first minute's tick"
        def iterations() -> float:
            return service.metrics.registry.get_sample_value(
                "epu_timer_runs_total", {"task": "iteration", "outcome": "ok"}) or 0.0

        # the iteration that sent the last launches is counted once it returned (after it published)
        wait_for(lambda: iterations() == service.engine.iterations, 10, interval=0.05,
                 message="the last iteration counted")
        before = iterations()
        same = snapshot(queued=jobs(5), at=time.time())  # the same demand: nothing new to do
        pub.publish(same)
        wait_for(lambda: service.engine.latest_snapshot("d").taken_at == same.taken_at, 10,
                 message="the engine holds the repeated snapshot")
        assert iterations() == before, "a snapshot with unchanged demand does not wake the engine"
        assert launches() == 5
    finally:
        pub.close()
        service.stop()
        thread.join(15)


def test_wake_brings_a_task_forward_at_most_once_per_gap() -> None:
    service = Service("waker", Broker("memory://", Topology(prefix="wake-", quorum=False)))
    runs: list[float] = []
    service.every(3600.0, lambda: runs.append(time.monotonic()), name="tick")
    thread = run_in_thread(service)
    try:
        assert service.wait_ready(15)
        assert service.wake("tick", 1.0)
        wait_for(lambda: len(runs) == 1, 10, message="the woken run")
        assert service.wake("tick", 1.0), "the next tick is an hour away: bring it forward"
        assert not service.wake("tick", 1.0), "already brought forward"
        wait_for(lambda: len(runs) == 2, 10, message="the second woken run")
        assert runs[1] - runs[0] >= 0.99, "not sooner than the gap after the last run"
        with pytest.raises(KeyError, match="nope"):
            service.wake("nope", 1.0)
    finally:
        service.stop()
        thread.join(10)


@pytest.mark.rabbitmq
def test_a_slurm_resume_is_launched_without_waiting_for_the_tick(broker, tmp_path) -> None:
    """Native mode: slurmctld waits for the nodes it resumed; the call wakes the iteration at once
    and the launch carries the node's own name."""
    from epu.common.messages import SlurmPower

    cfg = parse_config({
        "broker": {"url": broker.url, "prefix": broker.topology.prefix},
        "decision": {"store_url": f"sqlite:///{tmp_path / 'decision.db'}", "iteration_seconds": 60.0,
                     "active_window_seconds": 30.0},
        "domains": {"d": {"max_nodes": 20, "sites": ["s1"], "native": "slurm"}},
        "sites": {"s1": {"driver": "epu-sim", "quota": 50}},
    }, environ={})
    service = build_service(cfg)
    thread = run_in_thread(service)
    pub = Publisher(broker, source="slurm-resume")
    launched: list = []

    def names() -> set[str]:
        launched.extend(read_queue(broker, PROVISIONER_QUEUE))
        return {m.node_name for m in launched}

    try:
        assert service.wait_ready(15)
        pub.publish(snapshot(at=time.time()))
        wait_for(lambda: service.engine.latest_snapshot("d") is not None, 10, message="the engine holds a snapshot")
        started = time.monotonic()
        pub.publish(SlurmPower(batch_id="b1", domain="d", action="resume", nodes=["cloud01", "cloud02"]))
        wait_for(lambda: names() == {"cloud01", "cloud02"}, 20, interval=0.02, message="the two resumed nodes launched")
        assert time.monotonic() - started < 30, "answered before the minute's tick"
    finally:
        pub.close()
        service.stop()
        thread.join(10)
