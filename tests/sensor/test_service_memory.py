"""The sensor as the embedded demo runs it: memory:// broker, a ScaledClock, a SimulatedBatch."""

from __future__ import annotations

from epu.common.broker import Broker
from epu.common.clock import ScaledClock
from epu.common.config import parse_config
from epu.common.messages import SensorSnapshot
from epu.common.runtime import run_in_thread
from epu.common.testing import drain, wait_for
from epu.services.sensor.app import build_service
from epu.services.sensor.simulated import SimulatedBatch


def test_demo_wiring_on_memory_broker(memory_broker: Broker) -> None:
    clock = ScaledClock(factor=120.0)
    sim = SimulatedBatch(clock, nodes={"sim001": 4})
    config = parse_config({"broker": {"url": "memory://", "prefix": memory_broker.topology.prefix, "quorum": False},
                           "sensor": {"domain": "demo", "poll_seconds": 30}}, environ={})
    svc = build_service(config, clock=clock, backend=sim)
    from kombu import Queue

    tap = memory_broker.topology.n("demo.tap")
    with memory_broker.connection() as conn:
        ch = conn.channel()
        memory_broker.topology.events_exchange(ch).declare()
        Queue(tap, exchange=memory_broker.topology.events_exchange, routing_key="sensor.snapshot.#")(ch).declare()
    run_in_thread(svc)
    try:
        assert svc.wait_ready(10)
        sim.submit(cores=1, duration=60, count=8)  # 60 s of demo time = 0.5 s real
        seen: list[SensorSnapshot] = []

        def finished() -> bool:
            seen.extend(m for _, m in drain(memory_broker, tap))
            return sim.completed == 8 and any(s.running_jobs == 0 and not s.jobs for s in seen)

        wait_for(finished, 20, message="all demo jobs done and a snapshot showing it")
        assert any(s.running_jobs == 4 for s in seen)  # 4 cores: 4 at a time
        assert sim.submitted == 8 and sim.running == 0
    finally:
        svc.stop()
