"""The sensor's logic between the bus and the batch system, free of AMQP.

Why separate from ``app``: this is what the tests drive directly with a ``ManualClock`` and a
list as the "bus"; ``app.build_service`` only wires it to a ``Service``.

Rules it keeps (issue 3, item 7):

* A snapshot every poll period, and one right after a command changed the cluster.
* If the batch system cannot be read, publish ``available=False`` with the error and retry
  with exponential backoff (capped at the poll period) — never an empty queue it did not see.
* A command id runs once: a redelivered or re-sent command gets its stored result again,
  with ``duplicate=True``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from common.clock import Clock
from common.messages import Message, NodeCommand, NodeCommandResult, NodeInfo, SensorSnapshot
from services.sensor.backend import BackendUnavailable, BatchBackend, InvalidNodeName, Observation
from services.sensor.dedupe import CommandLog

log = logging.getLogger("epu.sensor")


class StateSince:
    """Remembers when each node's normalized state last changed, for backends whose batch
    system does not say (Torque, HTCondor). A node first seen counts from that moment."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[str, float]] = {}

    def fill(self, nodes: list[NodeInfo], now: float) -> list[NodeInfo]:
        out = []
        seen: dict[str, tuple[str, float]] = {}
        for node in nodes:
            prev = self._seen.get(node.name)
            if node.state_since is not None:
                since = node.state_since
            elif prev is not None and prev[0] == node.state:
                since = prev[1]
            else:
                since = now
            seen[node.name] = (node.state, since)
            out.append(node if node.state_since is not None else node.model_copy(update={"state_since": since}))
        self._seen = seen
        return out


@dataclass
class PollSchedule:
    poll_seconds: float = 60.0
    retry_initial_seconds: float = 2.0

    def delay(self, failures: int) -> float:
        if failures <= 0:
            return self.poll_seconds
        return min(self.poll_seconds, self.retry_initial_seconds * 2 ** (failures - 1))


class SensorCore:
    def __init__(self, domain: str, backend: BatchBackend, clock: Clock, command_log: CommandLog,
                 publish: Callable[[Message, str | None], object], schedule: PollSchedule | None = None) -> None:
        self.domain = domain
        self.backend = backend
        self.clock = clock
        self.command_log = command_log
        self.publish = publish
        self.schedule = schedule or PollSchedule()
        self.failures = 0
        self.next_poll_at = clock.monotonic()
        self.last_snapshot: SensorSnapshot | None = None
        self._since = StateSince()

    # ------------------------------------------------------------------ snapshots
    def tick(self) -> None:
        """Called often by the service; polls when due (per the injected clock)."""
        if self.clock.monotonic() >= self.next_poll_at:
            self.poll()

    def poll(self) -> SensorSnapshot:
        snap = self.read()
        self.failures = 0 if snap.available else self.failures + 1
        self.next_poll_at = self.clock.monotonic() + self.schedule.delay(self.failures)
        if not snap.available:
            log.warning("batch system unreadable, will retry",
                        extra={"domain": self.domain, "error": snap.error, "failures": self.failures,
                               "retry_in": self.schedule.delay(self.failures)})
        self.publish(snap, None)
        self.last_snapshot = snap
        return snap

    def read(self) -> SensorSnapshot:
        now = self.clock.now()
        try:
            obs: Observation = self.backend.snapshot()
        except BackendUnavailable as exc:
            return self._unavailable(now, str(exc))
        except Exception as exc:  # a parser bug must not look like an empty cluster either
            log.exception("snapshot failed", extra={"domain": self.domain})
            return self._unavailable(now, f"{type(exc).__name__}: {exc}")
        return SensorSnapshot(domain=self.domain, backend=self.backend.name, available=True, taken_at=now,
                              jobs=obs.jobs, nodes=self._since.fill(obs.nodes, now),
                              running_jobs=obs.running_jobs)

    def _unavailable(self, now: float, error: str) -> SensorSnapshot:
        return SensorSnapshot(domain=self.domain, backend=self.backend.name, available=False,
                              error=error[:2000] or "batch system unreadable", taken_at=now)

    # ------------------------------------------------------------------ commands
    def handle(self, command: NodeCommand, correlation_id: str | None = None) -> NodeCommandResult:
        if command.domain != self.domain:
            result = self._result(command, ok=False, error=f"command for domain {command.domain!r} "
                                  f"reached the sensor of {self.domain!r}")
            self.publish(result, correlation_id)
            return result
        stored = self.command_log.get(command.command_id)
        if stored is not None:
            log.info("duplicate command, re-sending its result",
                     extra={"command_id": command.command_id, "action": command.action, "node": command.node})
            again = stored.model_copy(update={"duplicate": True})
            self.publish(again, correlation_id)
            return again
        try:
            outcome = self.backend.execute(command.action, command.node, cores=command.cores,
                                           address=command.address, reason=command.reason, force=command.force)
        except InvalidNodeName as exc:
            outcome_ok, changed, output, error, transient = False, False, "", str(exc), False
        except BackendUnavailable as exc:
            outcome_ok, changed, output, error, transient = False, False, "", str(exc), True
        else:
            outcome_ok, changed, output, error, transient = (outcome.ok, outcome.changed, outcome.output,
                                                             outcome.error, outcome.transient)
        result = self._result(command, ok=outcome_ok, error=error, output=output)
        if not transient:
            self.command_log.put(result)
        log.info("node command executed", extra={"command_id": command.command_id, "action": command.action,
                                                 "node": command.node, "ok": outcome_ok, "error": error})
        self.publish(result, correlation_id)
        if changed:
            self.poll()
        return result

    def _result(self, command: NodeCommand, *, ok: bool, error: str | None = None,
                output: str = "") -> NodeCommandResult:
        return NodeCommandResult(command_id=command.command_id, domain=command.domain, action=command.action,
                                 node=command.node, ok=ok, error=error, output=output[-4000:])
