"""``epu run sensor``: wire the sensor core to the bus.

The service consumes its domain's command queue (``topology.sensor_spec(domain)``) and ticks
a timer that polls the batch system when due. Everything with logic is in ``core``; backends
are chosen by ``[sensor] backend`` and configured by ``[sensor.options]``:

* ``state_path`` — SQLite file remembering executed command ids (default
  ``sensor-DOMAIN.sqlite3`` in the working directory, ``/var/lib/epu-sensor`` under systemd;
  ``":memory:"`` or the simulated backend keep it in memory: ``config.sensor.command_log_path``)
* ``retry_initial_seconds`` — first retry delay when the batch system is unreadable (doubles
  up to ``poll_seconds``), ``tick_seconds`` — how often the timer checks if a poll is due
* ``refresh_seconds`` — after commands changed the cluster, read it again this much later (one
  read per burst of commands; default 1), ``max_snapshot_bytes`` — largest snapshot to publish
  (default 8 MiB; see ``core.SensorCore.bounded``)
* backend keys: see ``services.sensor.factory``.
"""

from __future__ import annotations

from typing import Any

from epu.common.clock import Clock, RealClock
from epu.common.config import EpuConfig
from epu.common.config.sensor import command_log_path
from epu.common.messages import NodeCommand, SensorSnapshot
from epu.common.runtime import RuntimeSettings, Service
from epu.services.sensor.backend import BatchBackend
from epu.services.sensor.core import PollSchedule, SensorCore
from epu.services.sensor.dedupe import CommandLog, MemoryCommandLog, SqliteCommandLog
from epu.services.sensor.factory import make_backend


def make_command_log(config: EpuConfig, backend: BatchBackend) -> CommandLog:
    sc = config.sensor
    path = command_log_path(sc)
    if path is None or (backend.name == "simulated" and "state_path" not in sc.options):
        return MemoryCommandLog()
    return SqliteCommandLog(path)


def build_service(config: EpuConfig, *, clock: Clock | None = None, backend: BatchBackend | None = None,
                  command_log: CommandLog | None = None) -> Service:
    sc = config.sensor
    clock = clock or RealClock()
    backend = backend or make_backend(sc, clock)
    log_store = command_log or make_command_log(config, backend)
    settings = RuntimeSettings(metrics_port=sc.metrics_port, metrics_host=sc.metrics_host)
    service = Service(f"sensor-{sc.domain}", config.broker_obj(), clock=clock, settings=settings)
    # a snapshot no engine took within its active window expires in the queue, by the broker's clock
    service.publisher.expire_after[SensorSnapshot.TYPE] = config.decision.active_window_seconds
    schedule = PollSchedule(poll_seconds=sc.poll_seconds,
                            retry_initial_seconds=float(sc.options.get("retry_initial_seconds", 2.0)),
                            refresh_seconds=float(sc.options.get("refresh_seconds", 1.0)),
                            max_snapshot_bytes=int(sc.options.get("max_snapshot_bytes", 8 * 1024 * 1024)))
    core = SensorCore(sc.domain, backend, clock, log_store,
                      lambda msg, corr: service.publish(msg, corr), schedule)

    def on_command(message: Any, envelope: Any) -> None:
        assert isinstance(message, NodeCommand)
        core.handle(message, envelope.id)

    service.consume(service.broker.topology.sensor_spec(sc.domain), on_command, prefetch=1,
                    types={NodeCommand.TYPE}, on_invalid=core.handle_invalid)
    tick = float(sc.options.get("tick_seconds", min(0.5, sc.poll_seconds)))
    service.every(tick, core.tick, name="sensor-poll", initial_delay=0)
    service.settings.extra_health["sensor"] = lambda: {
        "backend": backend.name,
        "available": core.last_snapshot.available if core.last_snapshot else None,
        "consecutive_failures": core.failures,
        "reads": core.reads,
        "oversize_snapshots": core.oversize_snapshots,
    }
    service.sensor_core = core  # type: ignore[attr-defined]  # for tests and the demo
    return service
