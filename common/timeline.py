"""The timeline of a run, from bus events to rows to a summary. Pure: no I/O, no clock.

Why a separate module: ``epu record`` (common/cli_record.py) and the end-to-end tests both
turn the event stream into the same picture — queued jobs, batch nodes by state and cloud
instances by site over time (the seed paper's Figures 5–6) — and the same verdict (did
every job finish, did the cluster come back to zero, was anything left behind). Keeping it
free of AMQP, files and matplotlib makes it testable with hand-made events.

What is derived from what:

* queued jobs, running jobs, nodes by state — the latest ``SensorSnapshot`` (an unavailable
  snapshot changes nothing: its empty lists are not an empty cluster);
* instances by site and by state — ``InstanceEvent``\\ s, moving forward only by ``seq``;
* a job is *completed* when a snapshot saw it (queued, or running on a node) and a later
  available snapshot sees it nowhere;
* *duplicates*: two live instances with the same node name at once;
* *orphans* (at the end): live instances while the batch system is empty and idle, plus batch
  nodes no instance accounts for. Callers that can count real processes add their own count.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from epu.common.messages import TERMINAL_INSTANCE_STATES, InstanceEvent, Message, SensorSnapshot

NODE_STATES = ("free", "busy", "offline", "down", "unknown")
INSTANCE_STATES = ("requested", "pending", "started", "joined", "draining", "terminating")
"""Live instance states, in order; terminal ones are not plotted."""


@dataclass(frozen=True)
class Row:
    """The state of the system right after one event."""

    t: float
    """Seconds since the first recorded event."""
    queued_jobs: int
    running_jobs: int
    nodes: dict[str, int]
    """Batch nodes by normalized state."""
    instances: dict[tuple[str, str], int]
    """Live instances by (site, state)."""
    event: str = ""

    @property
    def workers(self) -> int:
        """Live instances (what costs money)."""
        return sum(self.instances.values())

    def instances_by_site(self) -> dict[str, int]:
        out: Counter[str] = Counter()
        for (site, _state), n in self.instances.items():
            out[site] += n
        return dict(out)


@dataclass
class _Instance:
    site: str
    state: str
    seq: int
    node_name: str


@dataclass
class Timeline:
    """Feed it events in arrival order with ``observe``; read ``rows`` and ``summary()``."""

    start: float | None = None
    rows: list[Row] = field(default_factory=list)
    _instances: dict[str, _Instance] = field(default_factory=dict)
    _snapshot: SensorSnapshot | None = None
    _seen_jobs: set[str] = field(default_factory=set)
    _current_jobs: set[str] = field(default_factory=set)
    _completed: set[str] = field(default_factory=set)
    _duplicates: set[str] = field(default_factory=set)
    _sites: list[str] = field(default_factory=list)

    # ------------------------------------------------------------------ input
    def observe(self, message: Message, at: float) -> Row | None:
        """Apply one decoded bus message received at ``at`` (epoch seconds). Returns the new
        row, or ``None`` when the message changes nothing the timeline shows."""
        if isinstance(message, SensorSnapshot):
            if not message.available:
                return None
            self._snapshot = message
            self._track_jobs(message)
            return self._row(at, f"snapshot {message.domain}")
        if isinstance(message, InstanceEvent):
            if not self._apply_instance(message):
                return None
            return self._row(at, f"{message.instance_id[:8]} {message.state}")
        return None

    def _track_jobs(self, snap: SensorSnapshot) -> None:
        now = {j.job_id for j in snap.jobs}
        for node in snap.nodes:
            now.update(node.jobs)
        self._completed |= self._current_jobs - now
        self._completed -= now  # a job seen again (requeued) is not done
        self._seen_jobs |= now
        self._current_jobs = now

    def _apply_instance(self, evt: InstanceEvent) -> bool:
        if evt.site not in self._sites:
            self._sites.append(evt.site)
        old = self._instances.get(evt.instance_id)
        if old is not None and evt.seq <= old.seq:
            return False  # stale or repeated
        node = evt.node_name or (old.node_name if old else "")
        self._instances[evt.instance_id] = _Instance(evt.site, evt.state, evt.seq, node)
        if node and evt.state not in TERMINAL_INSTANCE_STATES:
            twins = [i for i, r in self._instances.items() if r.node_name == node
                     and r.state not in TERMINAL_INSTANCE_STATES]
            if len(twins) > 1:
                self._duplicates.add(node)
        return True

    def _row(self, at: float, event: str) -> Row:
        if self.start is None:
            self.start = at
        snap = self._snapshot
        queued = snap.queued_count() if snap else 0
        running = snap.running_jobs if snap else 0
        nodes: Counter[str] = Counter(n.state for n in snap.nodes) if snap else Counter()
        live: Counter[tuple[str, str]] = Counter((r.site, r.state) for r in self._instances.values()
                                                 if r.state not in TERMINAL_INSTANCE_STATES)
        row = Row(max(0.0, at - self.start), queued, running, dict(nodes), dict(live), event)
        self.rows.append(row)
        return row

    # ------------------------------------------------------------------ output
    @property
    def sites(self) -> list[str]:
        """Sites in the order they first appeared."""
        return list(self._sites)

    def live_instances(self) -> dict[str, str]:
        """instance id → state, for instances not terminated or failed."""
        return {i: r.state for i, r in self._instances.items() if r.state not in TERMINAL_INSTANCE_STATES}

    def orphans(self) -> list[str]:
        """What is left behind: live instances once the batch system is empty and idle, and
        batch nodes no live instance accounts for. Empty while work remains."""
        snap = self._snapshot
        if snap is None or snap.queued_count() or snap.running_jobs:
            return []
        names = {r.node_name for r in self._instances.values() if r.state not in TERMINAL_INSTANCE_STATES}
        left = [f"instance {i}" for i in sorted(self.live_instances())]
        left += [f"node {n.name}" for n in snap.nodes if n.name not in names]
        return left

    def summary(self) -> dict[str, Any]:
        """The verdict of the run, JSON-ready. Times are seconds since the first event;
        ``None`` when it never happened."""
        rows = self.rows
        first_running = next((r.t for r in rows if r.running_jobs > 0), None)
        peak = max((r.workers for r in rows), default=0)
        peak_at = next((r.t for r in rows if r.workers == peak), None) if peak else None
        # back to zero: the first row after the peak with no live instance and no batch node
        zero_at = None
        if peak_at is not None:
            zero_at = next((r.t for r in rows if r.t >= peak_at and r.workers == 0 and not sum(r.nodes.values())
                            and r.queued_jobs == 0 and r.running_jobs == 0), None)
        # the work is done when the queue is empty and nothing runs, for good
        work_done_at = None
        for r in rows:
            if r.queued_jobs or r.running_jobs:
                work_done_at = None
            elif work_done_at is None:
                work_done_at = r.t
        last = rows[-1] if rows else None
        orphans = self.orphans()
        return {
            "jobs_seen": len(self._seen_jobs),
            # jobs seen (running on a node, or in a per-job list) and gone since: a job
            # shorter than the snapshot period may be missed; the batch system's accounting is
            # the authority on completions
            "jobs_completed": len(self._completed),
            "jobs_left": len(self._current_jobs),
            "peak_workers": peak,
            "seconds_to_first_job_running": first_running,
            "seconds_to_peak": peak_at,
            "seconds_to_zero": zero_at,
            "seconds_from_work_done_to_zero": (zero_at - work_done_at
                                               if zero_at is not None and work_done_at is not None
                                               and zero_at >= work_done_at else None),
            "back_to_zero": bool(last is not None and last.workers == 0 and not sum(last.nodes.values())),
            "final_workers": last.workers if last else 0,
            "orphans": len(orphans),
            "orphan_list": orphans,
            "duplicates": len(self._duplicates),
            "duplicate_list": sorted(self._duplicates),
            "duration_seconds": last.t if last else 0.0,
            "rows": len(rows),
        }


def csv_header(sites: list[str]) -> list[str]:
    """Columns of timeline.csv: fixed ones, then one per node state, then site × state."""
    return (["t_seconds", "queued_jobs", "running_jobs", "workers"]
            + [f"nodes_{s}" for s in NODE_STATES]
            + [f"instances_{site}_{s}" for site in sites for s in INSTANCE_STATES]
            + ["event"])


def csv_rows(rows: list[Row], sites: list[str]) -> list[list[Any]]:
    """The rows of timeline.csv, matching ``csv_header(sites)``."""
    out = []
    for r in rows:
        out.append([round(r.t, 3), r.queued_jobs, r.running_jobs, r.workers]
                   + [r.nodes.get(s, 0) for s in NODE_STATES]
                   + [r.instances.get((site, s), 0) for site in sites for s in INSTANCE_STATES]
                   + [r.event])
    return out
