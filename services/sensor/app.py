"""``epu run sensor``: wire the sensor core to the bus.

The service consumes its domain's command queue (``topology.sensor_spec(domain)``) and ticks
a timer that polls the batch system when due. Everything with logic is in ``core``; backends
are chosen by ``[sensor] backend`` and configured by ``[sensor.options]``:

* ``state_path`` — SQLite file remembering executed command ids (default
  ``/var/lib/epu/sensor-DOMAIN.sqlite3``; ``":memory:"`` or the simulated backend keep it in memory)
* ``retry_initial_seconds`` — first retry delay when the batch system is unreadable (doubles
  up to ``poll_seconds``), ``tick_seconds`` — how often the timer checks if a poll is due
* backend keys: see ``services.sensor.factory``.
"""

from __future__ import annotations

from typing import Any

from common.clock import Clock, RealClock
from common.config import EpuConfig
from common.messages import NodeCommand
from common.runtime import RuntimeSettings, Service
from services.sensor.backend import BatchBackend
from services.sensor.core import PollSchedule, SensorCore
from services.sensor.dedupe import CommandLog, MemoryCommandLog, SqliteCommandLog
from services.sensor.factory import make_backend


def make_command_log(config: EpuConfig, backend: BatchBackend) -> CommandLog:
    opts = config.sensor.options
    path = opts.get("state_path")
    if path is None and backend.name == "simulated":
        return MemoryCommandLog()
    if path == ":memory:":
        return MemoryCommandLog()
    return SqliteCommandLog(path or f"/var/lib/epu/sensor-{config.sensor.domain}.sqlite3")


def build_service(config: EpuConfig, *, clock: Clock | None = None, backend: BatchBackend | None = None,
                  command_log: CommandLog | None = None) -> Service:
    sc = config.sensor
    clock = clock or RealClock()
    backend = backend or make_backend(sc, clock)
    log_store = command_log or make_command_log(config, backend)
    settings = RuntimeSettings(metrics_port=sc.metrics_port, metrics_host=sc.metrics_host)
    service = Service(f"sensor-{sc.domain}", config.broker_obj(), clock=clock, settings=settings)
    schedule = PollSchedule(poll_seconds=sc.poll_seconds,
                            retry_initial_seconds=float(sc.options.get("retry_initial_seconds", 2.0)))
    core = SensorCore(sc.domain, backend, clock, log_store,
                      lambda msg, corr: service.publish(msg, corr), schedule)

    def on_command(message: Any, envelope: Any) -> None:
        assert isinstance(message, NodeCommand)
        core.handle(message, envelope.id)

    service.consume(service.broker.topology.sensor_spec(sc.domain), on_command, prefetch=1,
                    types={NodeCommand.TYPE})
    tick = float(sc.options.get("tick_seconds", min(0.5, sc.poll_seconds)))
    service.every(tick, core.tick, name="sensor-poll", initial_delay=0)
    service.settings.extra_health["sensor"] = lambda: {
        "backend": backend.name,
        "available": core.last_snapshot.available if core.last_snapshot else None,
        "consecutive_failures": core.failures,
    }
    service.sensor_core = core  # type: ignore[attr-defined]  # for tests and the demo
    return service
