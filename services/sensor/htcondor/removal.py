"""When an HTCondor node may be called removed: a pure decision over what each view says.

Why a module of its own: HTCondor has two views of a worker that disagree in normal operation.
The collector holds the ads the worker's daemons last sent — a collector restart, an HA switch,
lost UDP updates or an expired ad make a live, busy worker vanish from it for minutes. The
schedd holds the jobs, and for each running one the slot it runs in (``RemoteHost``): it is the
batch system's own job list. So a removal is confirmed only by the schedd (no job of it runs on
the node) *and* by the node actually gone (its master, told to shut down peacefully, no longer
answers at the address it had); "no ads" alone is *unknown* — for a while.

How long: a live startd re-advertises every ``UPDATE_INTERVAL`` (300 s by default) and the
collector keeps an ad ``CLASSAD_LIFETIME`` (900 s); after a collector restart every live daemon
is back within one interval. A node this sensor has found with no ad at all, and with no job in
the schedd's list, for longer than ``absent_confirm_seconds`` (default ``CLASSAD_LIFETIME``) is
not advertising: its machine is gone (the cloud preempted it or it vanished, and no shutdown of
ours was ever in flight to tell us). Both of the batch system's own views — its node list, the
collector, and its job list, the schedd — then say it is not there, and the remove is answered
done (issue 33: such a node was answered "unknown" for ever — 144 removes a day for one
preempted worker, its instance never leaving the engine's cleanup). A node without an ad is
matched to no new job; the one race left is a startd silent that long whose ad comes back in the
seconds between this answer and its VM's terminate. Any ad, or any job the schedd lists there,
starts the clock again (``Absences``).

The real backend gathers the facts and this function decides; the simulated HTCondor answers
through the same function, with the same memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from epu.services.sensor.backend import CommandOutcome

#: Slot states that hold or are about to hold a job (docs/sensor-states.md maps them to busy).
BUSY_SLOT_STATES = frozenset({"Claimed", "Matched", "Preempting"})
#: HTCondor's default ``CLASSAD_LIFETIME``: no live daemon goes this long without an ad.
ABSENT_CONFIRM_SECONDS = 900.0


@dataclass(frozen=True)
class RemovalFacts:
    node: str
    force: bool
    schedd_jobs: list[str] | None
    """Ids of jobs the schedd lists with ``RemoteHost`` on the node; None: the schedd could not be read."""
    busy_slots: int
    """The node's slots the collector shows Claimed, Matched or Preempting."""
    master_seen: bool
    """The collector has the node's master ad (its daemons are up, or were moments ago)."""
    shutdown_sent: bool
    """This sensor sent the master a peaceful shutdown and kept its address."""
    master_answers: bool | None = None
    """The master at that address still accepts commands (True), refuses connections: exited
    (False), or was not asked (None)."""
    absent_seconds: float = 0.0
    """How long this sensor has found the node with no ad at all and no job in the schedd's list
    (``Absences``; 0: not absent, or first found so now)."""
    absent_confirm_seconds: float = ABSENT_CONFIRM_SECONDS
    """Absence this long is taken as the node gone (module docstring)."""


@dataclass(frozen=True)
class RemovalStep:
    send_shutdown: bool
    """Send (again: idempotent) the peaceful shutdown to the master before answering."""
    outcome: CommandOutcome


def removal_step(f: RemovalFacts) -> RemovalStep:
    """The next step of ``remove`` and its answer. Transient answers are not remembered by the
    sensor's dedupe log: the engine's next ``remove`` asks again, and the engine terminates a
    VM only after an ``ok`` answer."""
    node = f.node
    if f.schedd_jobs is None:
        return RemovalStep(False, CommandOutcome(False, transient=True, error=(
            f"remove {node}: the schedd's job list could not be read: cannot confirm no job runs there; retried")))
    if f.schedd_jobs and not f.force:
        jobs = ", ".join(f.schedd_jobs[:10])
        return RemovalStep(False, CommandOutcome(False, output=f"RemoteHost on {node}: {jobs}", error=(
            f"{node} still runs {len(f.schedd_jobs)} job(s) per the schedd ({jobs}): offline it and wait, or force")))
    if f.busy_slots and not f.force:
        return RemovalStep(False, CommandOutcome(False, error=(
            f"{node} still has {f.busy_slots} claimed/matched/preempting slot(s): offline it and wait, or force")))
    if f.master_seen:
        if f.force:
            return RemovalStep(True, CommandOutcome(True, changed=True, output=(
                f"peaceful shutdown sent to {node}'s master (forced: not waiting for it to exit)")))
        return RemovalStep(True, CommandOutcome(False, changed=not f.shutdown_sent, transient=True, error=(
            f"remove {node}: peaceful shutdown of its master in progress (it exits once its jobs ended); "
            "not removed until the master has exited")))
    if f.shutdown_sent:
        if f.master_answers is False:
            return RemovalStep(False, CommandOutcome(True, changed=True, output=(
                f"{node}'s master exited after its peaceful shutdown and the schedd lists no job there: removed")))
        return RemovalStep(False, CommandOutcome(False, transient=True, error=(
            f"remove {node}: its master still answers (its ad is missing from the collector): shutdown in "
            "progress; retried")))
    if f.force:
        return RemovalStep(False, CommandOutcome(True, output=(
            f"no ad for {node} in the collector and the schedd lists no job there: forced, taken as gone")))
    if not f.busy_slots and not f.schedd_jobs and f.absent_seconds >= f.absent_confirm_seconds:
        return RemovalStep(False, CommandOutcome(True, output=(
            f"no ad for {node} in the collector for {f.absent_seconds:.0f}s (a live startd re-advertises long "
            f"before {f.absent_confirm_seconds:.0f}s) and the schedd lists no job there: gone")))
    return RemovalStep(False, CommandOutcome(False, transient=True, error=(
        f"remove {node}: no ad for it in the collector — unknown, not gone yet (a collector restart or lost "
        f"updates look the same); the schedd lists no job there; retried until its master is seen and shut "
        f"down, or taken as gone after {f.absent_confirm_seconds:.0f}s without an ad "
        f"({f.absent_seconds:.0f}s so far)")))


class Absences:
    """Node → when a ``remove`` first found it with no ad and no job in the schedd's list.

    In memory: a sensor restarted forgets, and the clock starts again (later, never sooner).
    Bounded: the node asked about longest ago is forgotten first."""

    MAX_NODES = 10_000

    def __init__(self) -> None:
        self._since: dict[str, float] = {}

    def absent(self, node: str, now: float) -> float:
        """The node is absent now: for how long (0 the first time)."""
        since = self._since.get(node)
        if since is None:
            if len(self._since) >= self.MAX_NODES:
                del self._since[next(iter(self._since))]
            since = self._since[node] = now
        return max(0.0, now - since)

    def present(self, node: str) -> None:
        """An ad, a job or a shutdown of ours says something is (or was just) there: start again."""
        self._since.pop(node, None)

    def __contains__(self, node: str) -> bool:
        return node in self._since
