"""The sensor's logic between the bus and the batch system, free of AMQP.

Why separate from ``app``: this is what the tests drive directly with a ``ManualClock`` and a
list as the "bus"; ``app.build_service`` only wires it to a ``Service``.

Rules it keeps (issue 3, item 7):

* A snapshot every poll period, and one soon after commands changed the cluster — coalesced:
  a burst of commands (200 adds) triggers one read ``refresh_seconds`` after the first change,
  not one full read per command (issue 12, "polling storm").
* Snapshots are compact (shapes and nodes, never one record per job) and bounded: one that
  would still exceed ``max_snapshot_bytes`` after dropping per-node job ids is published as
  ``available=False`` with the reason, logged as an error and counted — never silently lost,
  never mistaken for an empty cluster.
* If the batch system cannot be read, publish ``available=False`` with the error and retry
  with exponential backoff (capped at the poll period) — never an empty queue it did not see.
* A command id runs once: a redelivered or re-sent command gets its stored result again,
  with ``duplicate=True``.
"""

from __future__ import annotations

import logging
import operator
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import msgpack
from epu.common.clock import Clock
from epu.common.codec import packb
from epu.common.columns import gc_paused, replace_field_each
from epu.common.messages import (
    Message,
    NodeCommand,
    NodeCommandResult,
    NodeInfo,
    SensorSnapshot,
)
from epu.services.sensor.backend import (
    ACTIONS,
    BackendUnavailable,
    BatchBackend,
    CommandOutcome,
    InvalidNodeName,
    JobRequeuer,
    Observation,
)
from epu.services.sensor.dedupe import CommandLog

log = logging.getLogger("epu.sensor")


def invalid_command_result(body: bytes, reason: str, domain: str) -> tuple[NodeCommandResult, str | None] | None:
    """(failed result, correlation id) for an undecodable/invalid ``node.command`` whose
    ``command_id``, ``domain`` (this sensor's) and ``action`` are readable; None otherwise."""
    try:
        env = msgpack.unpackb(body, raw=False, strict_map_key=False, max_str_len=1 << 20, max_bin_len=1 << 20,
                              max_array_len=10_000, max_map_len=10_000)
    except Exception:
        return None
    if not isinstance(env, dict) or env.get("type") != NodeCommand.TYPE or not isinstance(env.get("body"), dict):
        return None
    b = env["body"]
    command_id, action, node = b.get("command_id"), b.get("action"), b.get("node")
    if (not isinstance(command_id, str) or not re.fullmatch(r"[A-Za-z0-9_.:-]{1,128}", command_id)
            or b.get("domain") != domain or action not in ACTIONS):
        return None
    shown = "".join(c if c.isprintable() else "?" for c in str(node))[:253] if node is not None else ""
    result = NodeCommandResult(command_id=command_id, domain=domain, action=action, node=shown, ok=False,
                               error=f"invalid command, not executed: {reason[:1000]}")
    env_id = env.get("id")
    return result, env_id if isinstance(env_id, str) and len(env_id) <= 128 else None


def estimated_bytes(snap: SensorSnapshot, memo: dict[int, tuple[NodeInfo, int]] | None = None) -> int:
    """A generous upper bound of the wire size (no encoding): per node and shape a fixed
    allowance plus the node job ids and names.

    ``memo`` (the caller's, kept between snapshots): each node's share by the ``NodeInfo``
    object (immutable), so a node reported again as the very same object — a backend that
    reuses unchanged nodes' infos — is not measured again. Entries are added, not rebuilt per
    snapshot (most nodes are the same objects as last time); an entry holds its object, so its
    ``id`` is not reused while it is kept, and the memo is cut back to this snapshot's nodes
    once it holds more than twice as many (nodes that changed or went)."""
    nodes = snap.nodes
    if memo is None:
        node_part = sum(_node_bytes(n) for n in nodes)
    else:
        node_part = 0
        get = memo.get
        for n in nodes:
            hit = get(id(n))
            if hit is not None and hit[0] is n:
                node_part += hit[1]
            else:
                size = _node_bytes(n)
                memo[id(n)] = (n, size)
                node_part += size
        if len(memo) > 2 * len(nodes) + 64:
            kept = {id(n): memo[id(n)] for n in nodes}
            memo.clear()
            memo.update(kept)
    return 4096 + node_part + 400 * len(snap.shapes) + 200 * len(snap.jobs)


def _node_bytes(n: NodeInfo) -> int:
    jobs = n.jobs
    return 120 + len(n.name) + len(n.instance_id or "") + (sum(map(len, jobs)) + 2 * len(jobs) if jobs else 0)


def snapshot_bytes(snap: SensorSnapshot) -> int:
    """Size of the snapshot's wire body (msgpack; the envelope adds ~150 bytes)."""
    return len(packb(snap.to_wire()))


_STATE_SINCE = operator.attrgetter("state_since")


class StateSince:
    """Remembers when each node's normalized state last changed, for backends whose batch
    system does not say (Torque, HTCondor). A node first seen counts from that moment."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[str, float]] = {}
        self._said: list[NodeInfo] | None = None
        """The last read's nodes when each said its own ``state_since`` (a backend that says):
        ``_seen`` — each one's state and that time — is made of them only if a later read
        needs it."""

    def fill(self, nodes: list[NodeInfo], now: float) -> list[NodeInfo]:
        if None not in map(_STATE_SINCE, nodes):  # the batch system said: nothing to fill in
            self._said = list(nodes)
            return list(nodes)
        if self._said is not None:
            self._seen = {n.name: (n.state, n.state_since) for n in self._said}  # type: ignore[misc]
            self._said = None
        out: list[NodeInfo] = []
        stamp: list[int] = []  # positions in ``out`` of the nodes that get a ``state_since``
        since_values: list[float] = []
        seen: dict[str, tuple[str, float]] = {}
        previous = self._seen
        for node in nodes:
            prev = previous.get(node.name)
            if node.state_since is not None:
                since = node.state_since
            else:
                since = prev[1] if prev is not None and prev[0] == node.state else now
                stamp.append(len(out))
                since_values.append(float(since))
            seen[node.name] = (node.state, since)
            out.append(node)
        for i, node in zip(stamp, replace_field_each([out[i] for i in stamp], "state_since", since_values),
                           strict=True):
            out[i] = node
        self._seen = seen
        return out


@dataclass
class PollSchedule:
    poll_seconds: float = 60.0
    retry_initial_seconds: float = 2.0
    refresh_seconds: float = 1.0
    """After a command changed the cluster, read again this much later (one read per burst)."""
    max_snapshot_bytes: int = 8 * 1024 * 1024
    """Largest snapshot body to publish (RabbitMQ 4 refuses messages over 16 MiB by default)."""

    def delay(self, failures: int) -> float:
        if failures <= 0:
            return self.poll_seconds
        return min(self.poll_seconds, self.retry_initial_seconds * 2 ** (failures - 1))


class SensorCore:
    def __init__(self, domain: str, backend: BatchBackend, clock: Clock, command_log: CommandLog,
                 publish: Callable[[Message, str | None], object], schedule: PollSchedule | None = None,
                 incarnation: str | None = None) -> None:
        self.domain = domain
        self.backend = backend
        self.clock = clock
        self.command_log = command_log
        self.publish = publish
        self.schedule = schedule or PollSchedule()
        self.failures = 0
        self.next_poll_at = clock.monotonic()
        self.refresh_at: float | None = None
        self.last_snapshot: SensorSnapshot | None = None
        self.reads = 0
        self.oversize_snapshots = 0
        self._since = StateSince()
        self.incarnation = incarnation or uuid.uuid4().hex[:16]
        """This run of the sensor (random; the simulator's from its seed): with ``sequence``,
        orders its snapshots without a clock."""
        self.sequence = 0
        self._node_bytes: dict[int, tuple[NodeInfo, int]] = {}
        """``estimated_bytes``' memo of the last snapshot's nodes."""

    # ------------------------------------------------------------------ snapshots
    def tick(self) -> None:
        """Called often by the service; polls when due (per the injected clock), or when a
        refresh after changing commands is due."""
        now = self.clock.monotonic()
        if now >= self.next_poll_at or (self.refresh_at is not None and now >= self.refresh_at):
            self.poll()

    def request_refresh(self) -> None:
        """The cluster changed: read it again soon. Several changes in a row share one read."""
        if self.refresh_at is None:
            self.refresh_at = self.clock.monotonic() + self.schedule.refresh_seconds

    def poll(self) -> SensorSnapshot:
        self.refresh_at = None
        self.sequence += 1
        snap = self.bounded(self.read()).model_copy(update={"incarnation": self.incarnation,
                                                              "sequence": self.sequence})
        self.failures = 0 if snap.available else self.failures + 1
        self.next_poll_at = self.clock.monotonic() + self.schedule.delay(self.failures)
        if not snap.available:
            log.warning("batch system unreadable, will retry",
                        extra={"domain": self.domain, "error": snap.error, "failures": self.failures,
                               "retry_in": self.schedule.delay(self.failures)})
        self.publish(snap, None)
        self.last_snapshot = snap
        return snap

    def bounded(self, snap: SensorSnapshot) -> SensorSnapshot:
        """The snapshot if it fits ``max_snapshot_bytes``; else without per-node job ids (a busy
        node still shows its ``cores_used``); else an unavailable snapshot saying why."""
        limit = self.schedule.max_snapshot_bytes
        if estimated_bytes(snap, self._node_bytes) * 2 < limit:
            return snap  # far below the limit: no need to encode it once more to know
        size = snapshot_bytes(snap)
        if size <= limit:
            return snap
        trimmed = snap.model_copy(update={"nodes": [n.model_copy(update={"jobs": []}) if n.jobs else n
                                                    for n in snap.nodes]})
        trimmed_size = snapshot_bytes(trimmed)
        self.oversize_snapshots += 1
        if trimmed_size <= limit:
            log.warning("snapshot over max_snapshot_bytes: per-node job ids left out",
                        extra={"domain": self.domain, "bytes": size, "trimmed_bytes": trimmed_size, "limit": limit})
            return trimmed
        error = (f"snapshot of {trimmed_size} bytes ({len(snap.nodes)} nodes, {len(snap.shapes)} shapes) exceeds "
                 f"max_snapshot_bytes={limit}: not published as is; raise [sensor.options] max_snapshot_bytes and "
                 "the broker's max_message_size, or lower max_shapes")
        log.error("snapshot too large", extra={"domain": self.domain, "bytes": trimmed_size, "limit": limit})
        return self._unavailable(snap.taken_at, error)

    def read(self) -> SensorSnapshot:
        """One read of the batch system. The cyclic garbage collector is paused for it: a big
        site's read allocates hundreds of thousands of short-lived containers (and none that
        form cycles), which made the collector run over and over (20–25 % of the read)."""
        self.reads += 1
        with gc_paused():
            return self._read()

    def _read(self) -> SensorSnapshot:
        now = self.clock.now()
        try:
            obs: Observation = self.backend.snapshot()
        except BackendUnavailable as exc:
            return self._unavailable(now, str(exc))
        except Exception as exc:  # a parser bug must not look like an empty cluster either
            log.exception("snapshot failed", extra={"domain": self.domain})
            return self._unavailable(now, f"{type(exc).__name__}: {exc}")
        for warning in obs.warnings[:20]:
            log.warning(warning, extra={"domain": self.domain})
        # The wire carries shapes, never one record per job (``jobs`` stays empty).
        return SensorSnapshot(domain=self.domain, backend=self.backend.name, available=True, taken_at=now,
                              shapes=obs.all_shapes(), nodes=self._since.fill(obs.nodes, now),
                              running_jobs=obs.running_jobs, owners=obs.owners)

    def _execute(self, command: NodeCommand) -> CommandOutcome:
        """Run one command. A remove with ``requeue`` (the cloud preempted the node's machine)
        first requeues the jobs that died with it, then removes the node with ``force``: the batch
        system may still count those jobs on it until it notices the machine is gone."""
        force = command.force
        requeued: CommandOutcome | None = None
        if command.requeue and command.action == "remove":
            if isinstance(self.backend, JobRequeuer):
                requeued = self.backend.requeue_jobs(command.node, command.reason)
                if not requeued.ok:
                    return requeued
            force = True
        outcome = self.backend.execute(command.action, command.node, cores=command.cores, address=command.address,
                                       reason=command.reason, force=force, instance_id=command.instance_id)
        if requeued is None or not requeued.output:
            return outcome
        return CommandOutcome(outcome.ok, outcome.changed or requeued.changed,
                              f"{requeued.output}\n{outcome.output}".strip(), outcome.error, outcome.transient)

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
            outcome = self._execute(command)
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
            self.request_refresh()
        return result

    def handle_invalid(self, body: bytes, reason: str) -> NodeCommandResult | None:
        """A command the runtime dead-lettered as invalid (e.g. a hostile node name): if its id,
        domain and action can be read, answer it with a failed result, so the sender stops
        re-sending it instead of waiting forever for an outcome. Nothing is executed."""
        found = invalid_command_result(body, reason, self.domain)
        if found is None:
            return None
        result, correlation_id = found
        log.warning("invalid node command answered with a failed result",
                    extra={"command_id": result.command_id, "reason": reason[:300]})
        self.publish(result, correlation_id)
        return result

    def _result(self, command: NodeCommand, *, ok: bool, error: str | None = None,
                output: str = "") -> NodeCommandResult:
        return NodeCommandResult(command_id=command.command_id, domain=command.domain, action=command.action,
                                 node=command.node, ok=ok, error=error, output=output[-4000:])
