"""When an HTCondor node may be called removed: a pure decision over what each view says.

Why a module of its own: HTCondor has two views of a worker that disagree in normal operation.
The collector holds the ads the worker's daemons last sent — a collector restart, an HA switch,
lost UDP updates or an expired ad make a live, busy worker vanish from it for minutes. The
schedd holds the jobs, and for each running one the slot it runs in (``RemoteHost``): it is the
batch system's own job list. So a removal is confirmed only by the schedd (no job of it runs on
the node) *and* by the node actually gone (its master, told to shut down peacefully, no longer
answers at the address it had); "no ads" alone is *unknown*. The real backend gathers the facts
and this function decides; the simulated HTCondor answers through the same function.
"""

from __future__ import annotations

from dataclasses import dataclass

from epu.services.sensor.backend import CommandOutcome

#: Slot states that hold or are about to hold a job (docs/sensor-states.md maps them to busy).
BUSY_SLOT_STATES = frozenset({"Claimed", "Matched", "Preempting"})


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
    return RemovalStep(False, CommandOutcome(False, transient=True, error=(
        f"remove {node}: no ad for it in the collector — unknown, not gone (a collector restart or lost "
        "updates look the same); the schedd lists no job there; retried until its master is seen and shut down")))
